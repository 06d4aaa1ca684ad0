//! `tether run` with a command that cannot be started: a clear error and
//! a `failed` execution, quickly, never a hang or a restart loop.

use std::time::Duration;

use tether_tests::supervise::{number, Supervised};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Asserts that running `args` ends in a clear failure naming `needle`:
/// either `tether run` refuses it, or the execution ends `failed` with the
/// reason and is not retried.
fn assert_fails_clearly(sup: &Supervised, args: &[&str], needle: &str) {
    let mut full = vec!["run", "--json"];
    full.extend_from_slice(args);
    let out = sup.sb().run(&full);
    if out.code != Some(0) {
        assert!(
            out.stderr.contains(needle),
            "`tether run` refused {args:?} without naming {needle:?}: {:?}",
            out.stderr
        );
        return;
    }
    let id: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let id = id["id"].as_str().unwrap();
    let info = sup.wait_state(id, "failed", TIMEOUT);
    assert_eq!(number(&info, "restarts"), 0, "retried: {info}");
    let why = info["last_exit"]["spawn_failed"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains(needle),
        "the reason should name {needle:?}: {info}"
    );
    let events = sup.events(id);
    assert!(
        events
            .last()
            .is_some_and(|e| e.starts_with("failed") && e.contains(needle)),
        "events: {events:#?}"
    );
}

#[test]
fn running_a_missing_program_fails_clearly_and_quickly() {
    let sup = Supervised::start();
    assert_fails_clearly(
        &sup,
        &["--", "/nonexistent/agent-x"],
        "/nonexistent/agent-x",
    );
    assert_fails_clearly(
        &sup,
        &["--", "no-such-program-tether"],
        "no-such-program-tether",
    );
}

#[test]
fn running_in_a_missing_directory_fails_clearly() {
    let sup = Supervised::start();
    assert_fails_clearly(
        &sup,
        &["--cwd", "/nonexistent/dir-y", "--", "true"],
        "dir-y",
    );
}

#[test]
fn run_attach_of_a_missing_program_exits_non_zero_with_the_reason() {
    let sup = Supervised::start();
    let out = sup
        .sb()
        .run(&["run", "--attach", "--", "/nonexistent/agent-z"]);
    assert!(
        !matches!(out.code, Some(0) | None),
        "`run --attach` of a missing program exited {:?}",
        out.code
    );
    assert!(
        out.elapsed < TIMEOUT,
        "`run --attach` took {:?} to give up",
        out.elapsed
    );
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("agent-z"),
        "nothing names the program: {all:?}"
    );
}
