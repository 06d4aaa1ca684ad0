//! `tether checkpoint` at its edges: nothing to load exits 3, no execution
//! id is a usage error (2), a snapshot over the size limit is refused
//! naming both sizes (1), and what is saved loads back byte for byte.

use std::time::Duration;

use tether_tests::supervise::Supervised;

use crate::checkpoint_support::{list, load, save};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The daemon's default `--max-checkpoint-bytes`.
const DEFAULT_LIMIT: usize = 8 * 1024 * 1024;

#[test]
fn load_without_a_checkpoint_exits_3() {
    let sup = Supervised::start();
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    let (code, stdout) = load(sup.sb(), &id);
    assert_eq!(code, Some(3));
    assert_eq!(stdout, "");
    let (code, _) = load(sup.sb(), "no-such-execution");
    assert_eq!(
        code,
        Some(3),
        "an unknown execution has no checkpoint either"
    );
    assert!(list(sup.sb(), &id).is_empty());
}

#[test]
fn save_without_an_execution_id_is_a_usage_error() {
    let sup = Supervised::start();
    let mut cmd = sup.sb().tether(&["checkpoint", "save"]);
    cmd.env_remove("TETHER_EXECUTION_ID");
    let out = tether_tests::cli::run(cmd, b"state", TIMEOUT);
    out.assert_code(2);
    assert!(out.stderr.contains("--execution"), "{}", out.stderr);
    assert!(out.stderr.contains("TETHER_EXECUTION_ID"), "{}", out.stderr);
}

#[test]
fn a_snapshot_over_the_size_limit_is_refused_naming_the_sizes() {
    let sup = Supervised::start();
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    let big = vec![b'x'; DEFAULT_LIMIT + 1];
    let out = sup
        .sb()
        .run_with_stdin(&["checkpoint", "save", "--force", "--execution", &id], &big);
    out.assert_code(1);
    let expected = format!(
        "checkpoint of {} bytes exceeds the limit of {DEFAULT_LIMIT} bytes",
        DEFAULT_LIMIT + 1
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(list(sup.sb(), &id).is_empty(), "nothing was stored");
    // Exactly at the limit is fine.
    let at_limit = vec![b'y'; DEFAULT_LIMIT];
    sup.sb()
        .run_with_stdin(
            &["checkpoint", "save", "--force", "--execution", &id],
            &at_limit,
        )
        .assert_success();
}

#[test]
fn a_saved_checkpoint_loads_back_exactly_and_is_listed() {
    let sup = Supervised::start();
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    let data = "line one\n  indented\ttab\nno newline at the end";
    let first = save(sup.sb(), &id, "older");
    let second = save(sup.sb(), &id, data);
    assert!(second["id"].as_u64() > first["id"].as_u64(), "ids increase");
    assert_eq!(load(sup.sb(), &id), (Some(0), data.to_owned()));
    let listed = list(sup.sb(), &id);
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["id"], second["id"], "newest first");
    assert_eq!(listed[0]["size"], data.len());
    assert_eq!(listed[0]["schema_version"], 1);
    assert!(listed.iter().all(|c| c["valid"] == true));
    let plain = sup.sb().run(&["checkpoint", "list", &id]);
    plain.assert_success();
    assert!(plain.stdout.starts_with("ID "), "{}", plain.stdout);
    assert_eq!(plain.stdout.lines().count(), 3);
}
