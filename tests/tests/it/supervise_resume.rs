//! `tether resume` and `tether restart`: a new attempt on request. A
//! resumed worker starts from the newest (or the named) checkpoint with
//! `TETHER_RESUMED=1` and its steps standing; a restart stops the running
//! attempt and starts the next at once; both survive a daemon `kill -9`.

use std::time::Duration;

use serde_json::Value;
use tether_tests::bins;
use tether_tests::procs;
use tether_tests::supervise::{assert_event_order, number, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A worker that, on its first attempt, saves checkpoints `one` and `two`
/// and a step, then fails; resumed, it prints what it finds.
const CHECKPOINTING: &str = r#"
if [ "$TETHER_RESUMED" = 1 ]; then
  echo "resumed from $("$TETHER" checkpoint load)"
  echo "step $("$TETHER" step get fetch)"
  exit 0
fi
printf one | "$TETHER" checkpoint save
printf two | "$TETHER" checkpoint save
printf fetched | "$TETHER" step put fetch >/dev/null
echo "first done"
exit 3
"#;

fn tether_env() -> String {
    format!("TETHER={}", bins::tether().display())
}

/// Runs [`CHECKPOINTING`] with `--restart never` and waits for it to fail.
fn failed_checkpointing(sup: &Supervised, options: &[&str]) -> String {
    let env = tether_env();
    let mut args = vec!["--restart", "never", "--env", env.as_str()];
    args.extend_from_slice(options);
    let id = sup.run_sh(&args, CHECKPOINTING);
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 1, "{info}");
    id
}

fn checkpoints(sup: &Supervised, id: &str) -> Vec<Value> {
    let out = sup.sb().run(&["checkpoint", "list", "--json", id]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn resume_starts_an_ended_execution_from_its_newest_checkpoint_with_its_steps() {
    let sup = Supervised::start();
    let id = failed_checkpointing(&sup, &[]);

    let out = sup.sb().run(&["resume", &id]);
    out.assert_success();
    assert_eq!(out.stdout, format!("{id}\n"));
    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 2, "{info}");
    assert_eq!(
        sup.stdout_lines(&id),
        ["first done", "resumed from two", "step fetched"],
        "{}",
        sup.describe(&id)
    );
    assert_event_order(
        &sup.frames(&id),
        &[
            "failed",
            "resume requested",
            "starting attempt 2",
            "resumed from checkpoint 2 (seq",
            "completed",
        ],
    );
}

#[test]
fn resume_from_a_named_checkpoint_hands_that_one_to_the_worker() {
    let sup = Supervised::start();
    let id = failed_checkpointing(&sup, &[]);
    let before = checkpoints(&sup, &id);
    let first = before
        .iter()
        .find(|c| c["id"] == 1)
        .unwrap_or_else(|| panic!("no checkpoint 1 in {before:?}"))
        .clone();

    let out = sup.sb().run(&["resume", &id, "--checkpoint", "1"]);
    out.assert_success();
    assert_eq!(out.stdout, format!("{id}\n"));
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["first done", "resumed from one", "step fetched"],
        "{}",
        sup.describe(&id)
    );
    // Checkpoint 1 was copied as the newest, seq and all.
    let after = checkpoints(&sup, &id);
    assert_eq!(after[0]["id"], 3, "{after:?}");
    assert_eq!(after[0]["seq"], first["seq"], "{after:?}");
    assert_event_order(
        &sup.frames(&id),
        &[
            "resume requested, from checkpoint 1",
            "starting attempt 2",
            "resumed from checkpoint 3 (seq",
        ],
    );
}

#[test]
fn resume_and_restart_refuse_what_they_cannot_do() {
    let sup = Supervised::start();
    let id = failed_checkpointing(&sup, &[]);

    let out = sup.sb().run(&["resume", "nosuch"]);
    out.assert_code(3);
    assert!(out.stderr.contains("nosuch"), "{:?}", out.stderr);

    let out = sup.sb().run(&["resume", &id, "--checkpoint", "99"]);
    out.assert_code(3);
    assert!(
        out.stderr
            .contains(&format!("execution {id} has no checkpoint 99")),
        "{:?}",
        out.stderr
    );
    // The refusal recorded nothing.
    assert_eq!(sup.info(&id)["state"], "failed");

    let out = sup.sb().run(&["restart", &id]);
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "execution {id} has ended (failed); 'tether resume {id}'"
        )),
        "{:?}",
        out.stderr
    );

    let live = sup.run(&["--", "sleep", "300"]);
    sup.wait_running(&live, TIMEOUT);
    let out = sup.sb().run(&["resume", &live]);
    out.assert_code(1);
    assert!(
        out.stderr
            .contains(&format!("execution {live} is running, not ended")),
        "{:?}",
        out.stderr
    );
    let out = sup.sb().run(&["restart", "nosuch"]);
    out.assert_code(3);
}

#[test]
fn resume_is_refused_while_another_live_execution_has_the_name() {
    let sup = Supervised::start();
    let first = sup.run(&["--name", "job", "--", "true"]);
    sup.wait_state(&first, "completed", TIMEOUT);
    let second = sup.run(&["--name", "job", "--", "sleep", "300"]);
    sup.wait_running(&second, TIMEOUT);

    let out = sup.sb().run(&["resume", &first]);
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "execution {second} is running with the name \"job\"; stop it before resuming {first}"
        )),
        "{:?}",
        out.stderr
    );
    assert_eq!(sup.info(&first)["state"], "completed");

    sup.sb().run(&["stop", &second]).assert_success();
    let out = sup.sb().run(&["resume", &first]);
    out.assert_success();
    let info = sup.wait_for(&first, "completed again", TIMEOUT, |v| {
        v["state"] == "completed" && v["attempt"] == 2
    });
    assert_eq!(info["name"], "job", "{info}");
}

#[test]
fn restart_kills_the_running_attempt_and_starts_the_next_without_counting_it() {
    let sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "trap '' TERM; echo \"up $TETHER_ATTEMPT\"; while :; do sleep 0.1; done",
    );
    let pid = sup.wait_running(&id, TIMEOUT);
    sup.wait_line(&id, "up 1", TIMEOUT);

    let out = sup.sb().run(&["restart", &id, "--timeout", "1s"]);
    out.assert_success();
    assert_eq!(out.stdout, format!("{id}\n"));
    assert!(
        procs::wait_gone(pid, TIMEOUT),
        "the first worker (pid {pid}) survived the restart"
    );
    let info = sup.wait_for(&id, "running its second attempt", TIMEOUT, |v| {
        v["state"] == "running" && v["attempt"] == 2 && v["pid"].is_u64()
    });
    assert_eq!(number(&info, "restarts"), 0, "{info}");
    sup.wait_line(&id, "up 2", TIMEOUT);
    assert_event_order(
        &sup.frames(&id),
        &[
            "restarting on request: SIGTERM, then SIGKILL after 1s",
            "killed by signal 9",
            "restarting at once on request (attempt 2)",
            "starting attempt 2",
        ],
    );
}

#[test]
fn a_resume_cut_off_by_kill_9_of_the_daemon_runs_its_worker_once() {
    let mut sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "if [ \"$TETHER_RESUMED\" = 1 ] || [ \"$TETHER_ATTEMPT\" -gt 1 ]; then \
         echo resumed; sleep 1; echo 'resumed done'; exit 0; fi; exit 1",
    );
    sup.wait_state(&id, "failed", TIMEOUT);

    // The daemon dies while the resume is in flight, at whatever point it
    // has reached; what it recorded must stand, and nothing run twice.
    let mut resume = sup.sb().tether(&["resume", &id]);
    let mut child = resume.spawn().unwrap();
    sup.daemon().kill9();
    sup.daemon().restart();
    // It may fail (its session was cut) or succeed (it reconnected first).
    let _ = child.wait();

    let info = sup.wait_for(&id, "ended", TIMEOUT, |v| {
        ["completed", "failed", "lost"].contains(&v["state"].as_str().unwrap_or(""))
    });
    if info["state"] != "completed" {
        // The resume did not get as far as its worker: resume again.
        sup.sb().run(&["resume", &id]).assert_success();
        sup.wait_state(&id, "completed", TIMEOUT);
    }
    let lines = sup.stdout_lines(&id);
    assert_eq!(
        lines.iter().filter(|l| *l == "resumed done").count(),
        1,
        "{}",
        sup.describe(&id)
    );
    assert_eq!(lines.last().map(String::as_str), Some("resumed done"));
}
