//! The example agents survive `kill -9` of their worker process: the Rust
//! plan agent always finishes, prints every step, and never runs a step
//! it finished again; the shell agent resumes its count from its last
//! checkpoint. Also measures the time from a worker's crash to its
//! resumed attempt running.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tether_tests::supervise::{payloads, pid_of, Supervised};
use tether_tests::{bins, procs};

use crate::checkpoint_support::{checkpoint_loop_script, now_micros, plan_agent};

const STEPS: u32 = 10;
const KILLS: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(90);

/// `(step, pid)` of every line of the agent's count file, in order.
fn runs(path: &std::path::Path) -> Vec<(u32, u32)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let field = |name: &str| -> u32 {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(name))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("bad count file line {line:?}"))
            };
            (field("step="), field("pid="))
        })
        .collect()
}

#[test]
fn the_plan_agent_finishes_every_step_once_despite_kill_9() {
    let sup = Supervised::start();
    let count_file = sup.sb().file("count");
    let agent = plan_agent();
    let id = sup.run(&[
        "--restart",
        "on-failure",
        "--env",
        &format!("PLAN_AGENT_COUNT_FILE={}", count_file.display()),
        "--env",
        &format!("PLAN_AGENT_STEPS={STEPS}"),
        "--env",
        "PLAN_AGENT_STEP_MS=300",
        "--",
        agent.to_str().unwrap(),
    ]);

    let mut killed = BTreeSet::new();
    let mut kill_times = Vec::new();
    for k in 0..KILLS {
        // A new attempt: `ps` may still show the killed pid for a moment.
        let info = sup.wait_for(&id, "running a new attempt, or done", TIMEOUT, |v| {
            v["state"] == "completed"
                || (v["state"] == "running"
                    && v["pid"]
                        .as_u64()
                        .is_some_and(|p| !killed.contains(&(p as u32))))
        });
        if info["state"] == "completed" {
            break;
        }
        let pid = pid_of(&info);
        // Let this attempt finish a step and start the next, then kill it
        // at a different point of that step each time.
        let started = tether_tests::wait::wait_until(TIMEOUT, "two steps started", || {
            runs(&count_file).iter().filter(|r| r.1 == pid).count() >= 2 || !procs::is_running(pid)
        });
        let _ = started;
        if !procs::is_running(pid) {
            continue;
        }
        std::thread::sleep(Duration::from_millis(40 + 70 * k as u64));
        kill_times.push(now_micros());
        procs::kill9(pid).unwrap();
        killed.insert(pid);
    }
    sup.wait_state(&id, "completed", TIMEOUT);
    assert!(killed.len() >= 3, "only {} kills landed", killed.len());

    // Every step's output appears.
    let frames = sup.frames(&id);
    let stdout = payloads(&frames, "stdout");
    for n in 1..=STEPS {
        let line = format!("step {n} done");
        assert!(stdout.contains(&line), "no {line:?} in {stdout:?}");
    }
    assert_eq!(
        stdout.last().map(String::as_str),
        Some("plan complete: 10 steps")
    );

    // No finished step ran twice: a step body ran again only when the run
    // before it was cut short by a kill, as the last thing its process did.
    let runs = runs(&count_file);
    let mut last_of_pid = BTreeMap::new();
    for (step, pid) in &runs {
        last_of_pid.insert(*pid, *step);
    }
    for n in 1..=STEPS {
        let pids: Vec<u32> = runs.iter().filter(|r| r.0 == n).map(|r| r.1).collect();
        assert!(!pids.is_empty(), "step {n} never ran: {runs:?}");
        for pid in &pids[..pids.len() - 1] {
            assert!(
                killed.contains(pid) && last_of_pid.get(pid) == Some(&n),
                "step {n} ran again after pid {pid} had finished it: {runs:?}"
            );
        }
    }

    // Resumed attempts say where they resumed from.
    let events = payloads(&frames, "event");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("resumed from checkpoint")),
        "{events:#?}"
    );
    let stderr = payloads(&frames, "stderr");
    assert!(
        stderr
            .iter()
            .any(|l| l.starts_with("plan-agent: resuming at step")),
        "{stderr:?}"
    );

    // Time from each kill to the next attempt's worker running, split
    // into noticing the death, the restart backoff, and starting again.
    for kill in &kill_times {
        let after = |from: u64, prefix: &str| {
            frames
                .iter()
                .find(|f| f.kind == "event" && f.ts_micros >= from && f.payload.starts_with(prefix))
                .map(|f| f.ts_micros)
        };
        let Some(noticed) = after(*kill, "killed by signal") else {
            continue;
        };
        let (Some(starting), Some(running)) = (
            after(noticed, "starting attempt"),
            after(noticed, "started pid"),
        ) else {
            continue;
        };
        let ms = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1000.0;
        eprintln!(
            "crash to resumed attempt running: {:.1} ms (exit noticed {:.1} ms, backoff {:.1} ms, \
             start to running {:.1} ms)",
            ms(*kill, running),
            ms(*kill, noticed),
            ms(noticed, starting),
            ms(starting, running)
        );
    }
}

#[test]
fn the_shell_agent_resumes_its_count_from_the_last_checkpoint() {
    let sup = Supervised::start();
    let script = checkpoint_loop_script();
    let id = sup.run(&[
        "--restart",
        "on-failure",
        "--env",
        &format!("TETHER={}", bins::tether().display()),
        "--env",
        "CHECKPOINT_LOOP_PAUSE=0.2",
        "--",
        "sh",
        script.to_str().unwrap(),
        "12",
    ]);
    let pid = sup.wait_running(&id, TIMEOUT);
    sup.wait_line(&id, "count 5", TIMEOUT);
    procs::kill9(pid).unwrap();
    sup.wait_state(&id, "completed", TIMEOUT);
    let stdout = sup.stdout_lines(&id);
    let resumed = stdout
        .iter()
        .find_map(|l| l.strip_prefix("resumed at "))
        .unwrap_or_else(|| panic!("the shell agent never resumed: {stdout:?}"));
    let resumed: u32 = resumed.parse().unwrap();
    assert!(
        resumed >= 4,
        "resumed at {resumed}, after count 5 was printed"
    );
    for n in 1..=12 {
        assert!(stdout.contains(&format!("count {n}")), "{stdout:?}");
    }
    assert_eq!(stdout.last().map(String::as_str), Some("done at 12"));
    // After resuming it counted on from there, not from the start.
    let after: Vec<&String> = stdout
        .iter()
        .skip_while(|l| !l.starts_with("resumed at"))
        .collect();
    assert!(!after.contains(&&"count 1".to_owned()), "{stdout:?}");
}
