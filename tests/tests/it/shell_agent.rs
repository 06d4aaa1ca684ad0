//! The shell agent example (`examples/shell/agent.sh`) finishes under
//! `kill -9` of its worker and of the daemon: every tool call ran exactly
//! once, as its side-effect file shows, a restarted attempt carries on
//! after the last turn it checkpointed, and the output ends with the
//! answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_tests::supervise::{number, payloads, Supervised};
use tether_tests::wait::wait_until;
use tether_tests::{bins, procs};

use crate::checkpoint_support::load;

const TURNS: u32 = 6;
/// The turn after whose checkpoint the crash comes.
const CRASH_AFTER: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(90);
/// How long the daemon stays down.
const DOWN: Duration = Duration::from_millis(500);

fn agent_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shell/agent.sh")
}

/// Starts the agent with `--restart on-failure`; returns its id and the
/// side-effect file.
fn start_agent(sup: &Supervised) -> (String, PathBuf) {
    let effects = sup.sb().file("effects.log");
    let script = agent_script();
    let id = sup.run(&[
        "--restart",
        "on-failure",
        "--env",
        &format!("TETHER={}", bins::tether().display()),
        "--env",
        &format!("SHELL_AGENT_EFFECTS={}", effects.display()),
        "--env",
        &format!("SHELL_AGENT_TURNS={TURNS}"),
        // The crash is aimed at this pause after a turn's checkpoint, away
        // from any step: three seconds keep it there on a slow, busy machine.
        "--env",
        "SHELL_AGENT_PAUSE=3",
        "--",
        "sh",
        script.to_str().unwrap(),
    ]);
    (id, effects)
}

/// Waits until the agent has checkpointed turn `turn`.
fn wait_checkpoint(sup: &Supervised, id: &str, turn: u32) {
    let want = turn.to_string();
    wait_until(TIMEOUT, &format!("the checkpoint of turn {turn}"), || {
        load(sup.sb(), id).1 == want
    });
}

/// The side-effect file of a run in which every tool call ran once.
fn each_tool_call_once() -> String {
    (1..=TURNS)
        .map(|n| format!("turn {n}: note {n}\n"))
        .collect()
}

/// The stdout of one attempt that starts after turn `from`.
fn attempt_lines(from: u32, to: u32, last: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if from > 0 {
        lines.push(format!("resumed after turn {from}"));
    }
    lines.push(format!(
        "plan: take a note on each of {TURNS} turns, then sum up"
    ));
    for n in from + 1..=to {
        lines.push(format!("turn {n}: done: note {n}"));
    }
    if last {
        lines.push("answer: all notes taken".to_owned());
    }
    lines
}

/// The worker's stderr: the first attempt's note that there is no
/// checkpoint to resume from, then the token events, one per model call
/// that ran (the plan, each turn, the answer). A replayed call reports
/// none.
fn stderr_lines(id: &str) -> Vec<String> {
    let event = |prompt: u32, completion: u32| {
        format!(r#"{{"event":"tokens","prompt":{prompt},"completion":{completion}}}"#)
    };
    let mut events = vec![format!("no checkpoint for {id}"), event(2, 11)];
    events.extend((1..=TURNS).map(|_| event(15, 2)));
    events.push(event(4, 3));
    events
}

#[test]
fn the_shell_agent_runs_each_tool_call_once_when_its_worker_is_killed() {
    let sup = Supervised::start();
    let (id, effects) = start_agent(&sup);
    let pid = sup.wait_running(&id, TIMEOUT);
    wait_checkpoint(&sup, &id, CRASH_AFTER);
    procs::kill9(pid).unwrap();
    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 2, "{info}");

    assert_eq!(
        std::fs::read_to_string(&effects).unwrap(),
        each_tool_call_once()
    );
    let mut expected = attempt_lines(0, CRASH_AFTER, false);
    expected.extend(attempt_lines(CRASH_AFTER, TURNS, true));
    let frames = sup.frames(&id);
    assert_eq!(payloads(&frames, "stdout"), expected);
    assert_eq!(payloads(&frames, "stderr"), stderr_lines(&id));
}

#[test]
fn the_shell_agent_runs_each_tool_call_once_across_a_daemon_crash() {
    let mut sup = Supervised::start();
    let (id, effects) = start_agent(&sup);
    let pid = sup.wait_running(&id, TIMEOUT);
    wait_checkpoint(&sup, &id, CRASH_AFTER);
    sup.daemon().kill9();
    assert!(procs::is_running(pid), "the worker died with the daemon");
    std::thread::sleep(DOWN);
    sup.daemon().restart();
    let info = sup.wait_state(&id, "completed", TIMEOUT);
    // The worker rode out the crash: it was never restarted.
    assert_eq!(number(&info, "attempt"), 1, "{info}");

    assert_eq!(
        std::fs::read_to_string(&effects).unwrap(),
        each_tool_call_once()
    );
    let frames = sup.frames(&id);
    assert_eq!(payloads(&frames, "stdout"), attempt_lines(0, TURNS, true));
    // A command that finds the daemon down says so while it retries.
    let stderr: Vec<String> = payloads(&frames, "stderr")
        .into_iter()
        .filter(|l| !l.starts_with("tether: no daemon at "))
        .collect();
    assert_eq!(stderr, stderr_lines(&id));
}
