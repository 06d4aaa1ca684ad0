//! `tether step` and the checkpoint flags of the command line: a step runs
//! once and replays its recorded result, a failing command records nothing
//! and passes its exit code on, the first recorded result wins, and the
//! results survive a `kill -9` of the daemon; checkpoint metadata,
//! `--schema-version`, the one-line "no checkpoint" and `--force`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tether_tests::cli::Output;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A running execution to hang steps and checkpoints on.
fn running(sup: &Supervised) -> String {
    let id = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&id, TIMEOUT);
    id
}

/// `tether step run NAME --execution ID -- sh -c SCRIPT`.
fn step_run(sup: &Supervised, id: &str, name: &str, script: &str) -> Output {
    sup.sb().run(&[
        "step",
        "run",
        name,
        "--execution",
        id,
        "--",
        "sh",
        "-c",
        script,
    ])
}

/// A script that counts its runs in `counter` and prints `result`.
fn counting(counter: &Path, result: &str) -> String {
    format!("echo run >> '{}'; printf '{result}'", counter.display())
}

fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter).map_or(0, |s| s.lines().count())
}

fn assert_output(out: &Output, code: i32, stdout: &str, stderr: &str) {
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(code), stdout, stderr),
        "{}",
        out.command
    );
}

#[test]
fn a_step_runs_once_and_then_replays_its_result() {
    let sup = Supervised::start();
    let id = running(&sup);
    let counter = sup.sb().path().join("counter");
    let script = counting(&counter, "fetched 42\n");
    assert_output(
        &step_run(&sup, &id, "fetch", &script),
        0,
        "fetched 42\n",
        "",
    );
    assert_eq!(runs(&counter), 1);
    assert_output(
        &step_run(&sup, &id, "fetch", &script),
        0,
        "fetched 42\n",
        "",
    );
    assert_eq!(
        runs(&counter),
        1,
        "the recorded result is replayed, CMD not run"
    );
    let get = sup.sb().run(&["step", "get", "fetch", "--execution", &id]);
    assert_output(&get, 0, "fetched 42\n", "");
}

#[test]
fn a_failing_command_records_nothing_and_passes_its_code_on() {
    let sup = Supervised::start();
    let id = running(&sup);
    let counter = sup.sb().path().join("counter");
    let script = format!("{}; echo oops >&2; exit 7", counting(&counter, "partial"));
    assert_output(&step_run(&sup, &id, "flaky", &script), 7, "", "oops\n");
    let get = sup.sb().run(&["step", "get", "flaky", "--execution", &id]);
    assert_output(
        &get,
        3,
        "",
        &format!("no result for step \"flaky\" of {id}\n"),
    );
    // Nothing was recorded, so the next run runs again.
    let script = counting(&counter, "done");
    assert_output(&step_run(&sup, &id, "flaky", &script), 0, "done", "");
    assert_eq!(runs(&counter), 2);
    // A signal is reported as a shell does: 128 + N.
    let killed = step_run(&sup, &id, "killed", "kill -9 $$");
    assert_output(&killed, 137, "", "");
}

#[test]
fn the_first_put_wins_and_later_ones_print_what_stands() {
    let sup = Supervised::start();
    let id = running(&sup);
    let put = |data: &[u8]| {
        sup.sb()
            .run_with_stdin(&["step", "put", "plan", "--execution", &id], data)
    };
    assert_output(&put(b"first"), 0, "first", "");
    assert_output(&put(b"second"), 0, "first", "");
    let counter = sup.sb().path().join("counter");
    let run = step_run(&sup, &id, "plan", &counting(&counter, "third"));
    assert_output(&run, 0, "first", "");
    assert_eq!(runs(&counter), 0);
}

#[test]
fn steps_are_listed_cleared_and_run_again() {
    let sup = Supervised::start();
    let id = running(&sup);
    let counter = sup.sb().path().join("counter");
    for (name, result) in [("b", "bb"), ("a", "a"), ("c", "ccc")] {
        step_run(&sup, &id, name, &counting(&counter, result)).assert_success();
    }
    let listed = sup.sb().run(&["--json", "step", "list", &id]);
    listed.assert_success();
    let rows: Vec<Value> = listed
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(names, [("a", 1), ("b", 2), ("c", 3)]);
    assert!(rows
        .iter()
        .all(|r| r["recorded"].as_str().unwrap().ends_with('Z')));
    let plain = sup.sb().run(&["step", "list", &id]);
    assert_eq!(plain.stdout.lines().next(), Some("NAME  SIZE  RECORDED"));
    assert_eq!(plain.stdout.lines().count(), 4);

    let clear = sup
        .sb()
        .run(&["step", "clear", "a", "c", "--execution", &id]);
    assert_output(&clear, 0, "", "");
    let names = |sup: &Supervised| -> Vec<String> {
        let out = sup.sb().run(&["--json", "step", "list", &id]);
        out.stdout
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["name"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(names(&sup), ["b"]);
    let again = step_run(&sup, &id, "a", &counting(&counter, "a2"));
    assert_output(&again, 0, "a2", "");
    assert_eq!(runs(&counter), 4, "a cleared step runs again");
    let all = sup
        .sb()
        .run(&["step", "clear", "--all", "--execution", &id]);
    assert_output(&all, 0, "", "");
    assert!(names(&sup).is_empty());
    // Neither names nor --all is a usage error.
    sup.sb()
        .run(&["step", "clear", "--execution", &id])
        .assert_code(2);
}

#[test]
fn recorded_steps_survive_a_daemon_kill_9() {
    let mut sup = Supervised::start();
    let id = running(&sup);
    let counter = sup.sb().path().join("counter");
    let script = counting(&counter, "kept");
    assert_output(&step_run(&sup, &id, "s", &script), 0, "kept", "");
    sup.daemon().kill9();
    sup.daemon().restart();
    assert_output(&step_run(&sup, &id, "s", &script), 0, "kept", "");
    assert_eq!(runs(&counter), 1);
}

#[test]
fn the_execution_comes_from_the_environment() {
    let sup = Supervised::start();
    let id = running(&sup);
    let mut cmd = sup.sb().tether(&["step", "put", "env"]);
    cmd.env("TETHER_EXECUTION_ID", &id);
    let out = tether_tests::cli::run(cmd, b"from env", TIMEOUT);
    assert_output(&out, 0, "from env", "");
    let mut cmd = sup.sb().tether(&["step", "run", "x", "--", "true"]);
    cmd.env_remove("TETHER_EXECUTION_ID");
    let out = tether_tests::cli::run(cmd, b"", TIMEOUT);
    assert_eq!(out.code, Some(125), "tether's own failure: {}", out.stderr);
}

fn save(sup: &Supervised, args: &[&str], data: &[u8]) -> Output {
    let mut all = vec!["checkpoint", "save"];
    all.extend_from_slice(args);
    sup.sb().run_with_stdin(&all, data)
}

#[test]
fn checkpoint_metadata_is_listed_and_loaded() {
    let sup = Supervised::start();
    let id = running(&sup);
    let out = save(
        &sup,
        &[
            "--execution",
            &id,
            "--meta",
            "model=m1",
            "--meta",
            "note=a=b",
        ],
        b"state",
    );
    assert_output(&out, 0, "", "");
    let load = sup
        .sb()
        .run(&["--json", "checkpoint", "load", "--execution", &id]);
    load.assert_success();
    let value: Value = serde_json::from_str(&load.stdout).unwrap();
    assert_eq!(
        value["meta"],
        serde_json::json!({"model": "m1", "note": "a=b"})
    );
    assert_eq!(value["payload"], "state");
    assert_eq!(value["id"], 1);
    assert_eq!(value["schema_version"], 1);
    assert!(value["ts"].as_str().unwrap().ends_with('Z'));
    assert_eq!(load.stdout.lines().count(), 1);
    let list = sup.sb().run(&["--json", "checkpoint", "list", &id]);
    let row: Value = serde_json::from_str(list.stdout.trim_end()).unwrap();
    assert_eq!(
        row["meta"],
        serde_json::json!({"model": "m1", "note": "a=b"})
    );
    let plain = sup.sb().run(&["checkpoint", "list", &id]);
    assert!(plain
        .stdout
        .lines()
        .next()
        .unwrap()
        .ends_with("VALID  META"));
    assert!(plain
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .ends_with("yes    model=m1,note=a=b"));
    // Bytes that are not UTF-8 come as base64.
    save(&sup, &["--execution", &id], b"\xff\x00").assert_success();
    let load = sup
        .sb()
        .run(&["--json", "checkpoint", "load", "--execution", &id]);
    let value: Value = serde_json::from_str(&load.stdout).unwrap();
    assert_eq!(value["payload_b64"], "/wA=");
    assert_eq!(value.get("payload"), None);
    assert_eq!(value["meta"], serde_json::json!({}));
}

#[test]
fn schema_version_picks_the_newest_of_that_version() {
    let sup = Supervised::start();
    let id = running(&sup);
    for (version, data) in [("1", "v1 old"), ("2", "v2"), ("1", "v1 new"), ("3", "v3")] {
        save(
            &sup,
            &["--execution", &id, "--schema-version", version],
            data.as_bytes(),
        )
        .assert_success();
    }
    let load = |version: &str| {
        sup.sb().run(&[
            "checkpoint",
            "load",
            "--execution",
            &id,
            "--schema-version",
            version,
        ])
    };
    assert_output(&load("1"), 0, "v1 new", "");
    assert_output(&load("2"), 0, "v2", "");
    assert_output(&load("4"), 3, "", &format!("no checkpoint for {id}\n"));
    let newest = sup.sb().run(&["checkpoint", "load", "--execution", &id]);
    assert_output(&newest, 0, "v3", "");
}

#[test]
fn no_checkpoint_is_one_line_and_exit_3() {
    let sup = Supervised::start();
    let id = running(&sup);
    let out = sup.sb().run(&["checkpoint", "load", "--execution", &id]);
    assert_output(&out, 3, "", &format!("no checkpoint for {id}\n"));
    let out = sup
        .sb()
        .run(&["--json", "checkpoint", "load", "--execution", &id]);
    assert_output(&out, 3, "", &format!("no checkpoint for {id}\n"));
}

#[test]
fn saving_to_an_ended_execution_needs_force() {
    let sup = Supervised::start();
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    let out = save(&sup, &["--execution", &id], b"late");
    assert_output(
        &out,
        1,
        "",
        &format!(
            "tether: execution {id} has ended (completed); a checkpoint saved now is only \
             used if it is resumed: pass --force to save it anyway (invalid_request)\n"
        ),
    );
    let none = sup.sb().run(&["checkpoint", "load", "--execution", &id]);
    assert_eq!(none.code, Some(3), "nothing was saved");
    let out = save(&sup, &["--execution", &id, "--force"], b"mended");
    assert_output(&out, 0, "", "");
    let load = sup.sb().run(&["checkpoint", "load", "--execution", &id]);
    assert_output(&load, 0, "mended", "");
}
