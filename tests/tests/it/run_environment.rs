//! Workers run as typed: `tether run` starts the worker in the caller's
//! directory with the caller's environment (less the caller's own session
//! variables), `--env-file`, `--env` and `--clean-env` shape it, it is kept
//! with the execution across restarts and a daemon `kill -9`, and `ps`
//! shows its keys but never its values. `TETHER_LAST_EXIT` tells a restarted
//! worker how the previous attempt ended.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tether_tests::cli::{self, Output};
use tether_tests::sandbox::RUN_TIMEOUT;
use tether_tests::supervise::{pid_of, Supervised};
use tether_tests::{procs, Sandbox};

const TIMEOUT: Duration = Duration::from_secs(60);

/// `tether run --json ARGS...` from `dir`, with `env` set for the caller
/// (on top of this test's own environment).
fn run_from(sb: &Sandbox, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut full = vec!["run", "--json"];
    full.extend_from_slice(args);
    let mut cmd: Command = sb.tether(&full);
    cmd.current_dir(dir);
    for (key, value) in env {
        cmd.env(key, value);
    }
    cli::run(cmd, b"", RUN_TIMEOUT)
}

/// The execution id `tether run --json` printed.
fn id_of(out: &Output) -> String {
    out.assert_success();
    let value: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("`tether run --json` printed {:?}: {e}", out.stdout));
    value["id"].as_str().expect("an id").to_owned()
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_worker_runs_in_the_callers_directory_and_finds_the_callers_path() {
    let sup = Supervised::start();
    let sb = sup.sb();
    // A directory of the caller's, unrelated to the daemon's, holding a
    // script run by a relative name.
    let work = sb.file("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("job.sh"), "only-the-caller-has-this\npwd\n").unwrap();
    // A program found only through a PATH entry the caller has and the
    // daemon does not.
    let bin = sb.file("caller-bin");
    std::fs::create_dir(&bin).unwrap();
    write_executable(
        &bin.join("only-the-caller-has-this"),
        "#!/bin/sh\necho found on the callers PATH\n",
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run_from(
        sb,
        &work,
        &[("PATH", &path)],
        &["--restart", "never", "--", "sh", "job.sh"],
    );
    let id = id_of(&out);
    sup.wait_state(&id, "completed", TIMEOUT);
    let dir = std::fs::canonicalize(&work).unwrap();
    assert_eq!(
        sup.stdout_lines(&id),
        [
            "found on the callers PATH".to_owned(),
            dir.display().to_string()
        ]
    );
}

#[test]
fn env_files_add_variables_and_bad_ones_are_refused_naming_the_line() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let good = sb.file("good.env");
    std::fs::write(&good, "# greetings\n\nGREETING=hello world\nWHO=file\n").unwrap();
    let out = run_from(
        sb,
        sb.path(),
        &[],
        &[
            "--restart",
            "never",
            "--env-file",
            good.to_str().unwrap(),
            "--env",
            "WHO=flag",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING from $WHO\"",
        ],
    );
    let id = id_of(&out);
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["hello world from flag"]);

    let bad = sb.file("bad.env");
    std::fs::write(&bad, "A=1\n# fine\nnot a pair\n").unwrap();
    let bad_arg = bad.to_str().unwrap();
    let out = run_from(sb, sb.path(), &[], &["--env-file", bad_arg, "--", "true"]);
    out.assert_code(2);
    assert!(
        out.stderr.contains(&format!("{bad_arg}:3:")),
        "{}",
        out.stderr
    );

    let missing = sb.file("missing.env");
    let missing_arg = missing.to_str().unwrap();
    let out = run_from(
        sb,
        sb.path(),
        &[],
        &["--env-file", missing_arg, "--", "true"],
    );
    out.assert_code(1);
    assert!(out.stderr.contains(missing_arg), "{}", out.stderr);
    // Nothing was started by the refused runs.
    let listed = sb.run(&["ps", "--all", "--json"]);
    listed.assert_success();
    assert_eq!(listed.stdout.lines().count(), 1, "{}", listed.stdout);
}

#[test]
fn a_clean_environment_holds_only_what_was_asked_and_the_workers_own() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let out = run_from(
        sb,
        sb.path(),
        &[("FROM_CALLER", "1")],
        &[
            "--restart",
            "never",
            "--clean-env",
            "--env",
            "ASKED=yes",
            "--",
            "/usr/bin/env",
        ],
    );
    let id = id_of(&out);
    sup.wait_state(&id, "completed", TIMEOUT);
    let mut lines = sup.stdout_lines(&id);
    lines.sort();
    assert_eq!(
        lines,
        [
            "ASKED=yes".to_owned(),
            "PYTHONUNBUFFERED=1".to_owned(),
            "TETHER_ATTEMPT=1".to_owned(),
            format!("TETHER_EXECUTION_ID={id}"),
            format!("TETHER_SOCKET={}", sb.socket().display()),
        ]
    );
}

#[test]
fn the_callers_session_variables_are_not_passed_on() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let callers = [
        ("NOTIFY_SOCKET", "/run/systemd/notify"),
        ("LISTEN_FDS", "3"),
        ("LISTEN_PID", "1"),
        ("WATCHDOG_USEC", "1000"),
        ("JOURNAL_STREAM", "8:9"),
        ("INVOCATION_ID", "abc"),
        ("TETHER_PARENT_THING", "x"),
        ("KEEP_ME", "yes"),
        ("PYTHONUNBUFFERED", "0"),
    ];
    let out = run_from(
        sb,
        sb.path(),
        &callers,
        &["--restart", "never", "--", "/usr/bin/env"],
    );
    let id = id_of(&out);
    sup.wait_state(&id, "completed", TIMEOUT);
    let names: Vec<&str> = callers.iter().map(|(k, _)| *k).collect();
    let mut seen: Vec<String> = sup
        .stdout_lines(&id)
        .into_iter()
        .filter(|line| names.iter().any(|k| line.starts_with(&format!("{k}="))))
        .collect();
    seen.sort();
    // The caller's own PYTHONUNBUFFERED is respected, not replaced.
    assert_eq!(seen, ["KEEP_ME=yes", "PYTHONUNBUFFERED=0"]);
}

#[test]
fn the_environment_survives_restarts_and_tells_how_the_last_attempt_ended() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let script = "echo \"attempt $TETHER_ATTEMPT $KEPT last=${TETHER_LAST_EXIT:-none}\"; exit 3";
    let out = run_from(
        sb,
        sb.path(),
        &[("KEPT", "kept")],
        &["--max-restarts", "1", "--", "sh", "-c", script],
    );
    let id = id_of(&out);
    sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["attempt 1 kept last=none", "attempt 2 kept last=code:3"]
    );
}

#[test]
fn the_environment_survives_a_daemon_kill_and_a_killed_worker_is_named() {
    let mut sup = Supervised::start();
    let script = "echo \"up $TETHER_ATTEMPT $KEPT last=${TETHER_LAST_EXIT:-none}\"; exec sleep 600";
    let out = run_from(
        sup.sb(),
        sup.sb().path(),
        &[("KEPT", "kept")],
        &["--max-restarts", "1", "--", "sh", "-c", script],
    );
    let id = id_of(&out);
    sup.wait_line(&id, "up 1 kept last=none", TIMEOUT);
    let pid = sup.wait_running(&id, TIMEOUT);
    sup.daemon().kill9();
    sup.daemon().restart();
    // The next attempt is started by the new daemon, from the stored
    // manifest alone.
    procs::kill9(pid).unwrap();
    sup.wait_line(&id, "up 2 kept last=signal:SIGKILL", TIMEOUT);
    sup.wait_running(&id, TIMEOUT);
}

#[test]
fn ps_shows_the_environments_keys_never_its_values_and_the_workers_use() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let out = run_from(
        sb,
        sb.path(),
        &[],
        &[
            "--clean-env",
            "--env",
            "SECRET=hunter2-value",
            "--",
            "/bin/sleep",
            "600",
        ],
    );
    let id = id_of(&out);
    sup.wait_running(&id, TIMEOUT);
    let listed = sb.run(&["ps", "--json", &id]);
    listed.assert_success();
    assert!(
        !listed.stdout.contains("hunter2-value"),
        "{}",
        listed.stdout
    );
    let info: Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!(info["env_keys"], serde_json::json!(["SECRET"]), "{info}");
    let dir = std::fs::canonicalize(sb.path()).unwrap();
    assert_eq!(info["cwd"], dir.display().to_string(), "{info}");
    assert!(info["cpu_percent"].is_f64(), "{info}");
    assert!(info["rss_bytes"].as_u64().is_some_and(|b| b > 0), "{info}");

    let table = sb.run(&["ps"]);
    table.assert_success();
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", table.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID",
            "NAME",
            "STATE",
            "PID",
            "CPU%",
            "RSS",
            "RESTARTS",
            "CHECKPOINT",
            "LAST-SEQ",
            "REASON"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[0], id);
    assert_eq!(row[3], pid_of(&info).to_string());
    assert!(row[4].parse::<f64>().is_ok(), "CPU% {:?}", row[4]);
    assert!(
        row[5].ends_with('K') || row[5].ends_with('M'),
        "RSS {:?}",
        row[5]
    );
}
