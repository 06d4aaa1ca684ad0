//! `run --id`: the caller names the execution; a run whose id exists, in
//! any state, starts nothing and prints the id, and of runs racing with
//! one id exactly one starts. Ids break a documented rule: exit 2.

use std::time::Duration;

use serde_json::Value;
use tether_tests::supervise::{payloads, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Every execution `ps --all --json` lists, by id.
fn all_ids(sup: &Supervised) -> Vec<String> {
    let out = sup.sb().run(&["ps", "--all", "--json"]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            row["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn a_repeated_run_with_an_id_prints_it_and_starts_nothing() {
    let sup = Supervised::start();
    let out = sup
        .sb()
        .run(&["run", "--id", "job-1", "--", "sleep", "1000"]);
    out.assert_success();
    assert_eq!(out.stdout, "job-1\n");
    sup.wait_running("job-1", TIMEOUT);

    let again = sup
        .sb()
        .run(&["run", "--id", "job-1", "--", "sh", "-c", "exit 3"]);
    again.assert_success();
    assert_eq!(again.stdout, "job-1\n");
    assert_eq!(all_ids(&sup), ["job-1"]);
    let info = sup.info("job-1");
    assert_eq!(
        (info["attempt"].as_u64(), info["state"].as_str()),
        (Some(1), Some("running"))
    );

    // Ended, the id still stands for that execution.
    sup.sb()
        .run(&["stop", "job-1", "--timeout", "5s"])
        .assert_success();
    let ended = sup.sb().run(&["run", "--id", "job-1", "--", "true"]);
    ended.assert_success();
    assert_eq!(ended.stdout, "job-1\n");
    assert_eq!(all_ids(&sup), ["job-1"]);
    assert_eq!(sup.info("job-1")["state"], "cancelled");
    let submitted = sup
        .events("job-1")
        .iter()
        .filter(|e| e.starts_with("submitted"))
        .count();
    assert_eq!(submitted, 1, "one execution was submitted");
}

#[test]
fn of_four_racing_runs_with_one_id_exactly_one_starts() {
    let sup = Supervised::start();
    let dir = sup.sb().path().display().to_string();
    let script = "echo started >> starts; exec sleep 1000";
    let sb = sup.sb();
    let dir = dir.as_str();
    let outputs: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let args = [
                    "run", "--id", "race", "--cwd", dir, "--", "sh", "-c", script,
                ];
                scope.spawn(move || sb.run(&args))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for out in &outputs {
        out.assert_success();
        assert_eq!(out.stdout, "race\n");
    }
    sup.wait_running("race", TIMEOUT);
    assert_eq!(all_ids(&sup), ["race"]);
    let info = sup.info("race");
    assert_eq!(info["attempt"], 1, "{info}");
    let events = sup.events("race");
    let submitted = events.iter().filter(|e| e.starts_with("submitted")).count();
    assert_eq!(submitted, 1, "{events:?}");
    let started = std::fs::read_to_string(sup.sb().file("starts")).unwrap_or_default();
    assert_eq!(started, "started\n", "one worker ran");
    assert!(payloads(&sup.frames("race"), "stdout").is_empty());
}

#[test]
fn an_id_breaking_the_rule_is_a_usage_error_naming_it() {
    let sup = Supervised::start();
    let long = "x".repeat(129);
    for id in ["has space", "a/b", long.as_str()] {
        let out = sup.sb().run(&["run", "--id", id, "--", "true"]);
        out.assert_code(2);
        assert!(
            out.stderr
                .contains("1 to 128 characters of A-Z, a-z, 0-9, '.', '_' and '-'"),
            "{}",
            out.stderr
        );
    }
    assert!(all_ids(&sup).is_empty());
    let max = "y".repeat(128);
    let out = sup
        .sb()
        .run(&["run", "--id", &max, "--restart", "never", "--", "true"]);
    out.assert_success();
    assert_eq!(out.stdout, format!("{max}\n"));
}
