//! Checkpoints and step results go through the log like frames: each
//! save, pruning and step result is a record of `tether.wal` (its bytes are
//! there as given), made durable by the log's sync. What a crash leaves
//! holds every acknowledged one: after `kill -9`, in a copy of the files
//! taken while the daemon runs, and, through `tetherd repair`, when the
//! store file is garbage and only the log is left (the execution's
//! manifest, which only the store file held, is then reported lost, and
//! its checkpoints and steps are still served).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tether_tests::damage::{self, LOG_FILE, STORE_FILE};
use tether_tests::supervise::Supervised;
use tether_tests::Sandbox;

use crate::checkpoint_support::{list, load, save};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The daemon's default `--checkpoint-keep`.
const KEEP: u64 = 10;

/// A finished execution to hang checkpoints and steps on: nothing is left
/// running.
fn finished(sup: &Supervised) -> String {
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    id
}

/// Checkpoint `n`'s data: long enough to span several pages of text, and
/// different for every `n`.
fn data(n: u64) -> String {
    (0..40)
        .map(|line| format!("checkpoint {n}, line {line}: état ✓\n"))
        .collect()
}

/// `tether step put NAME --execution ID` with `result` on stdin: exit 0,
/// printing the result that stands.
fn put_step(sb: &Sandbox, id: &str, name: &str, result: &str) {
    let out = sb.run_with_stdin(&["step", "put", name, "--execution", id], result.as_bytes());
    out.assert_success();
    assert_eq!(out.stdout, result, "{}", out.command);
}

/// `tether step get NAME --execution ID`: exit code and stdout.
fn get_step(sb: &Sandbox, id: &str, name: &str) -> (Option<i32>, String) {
    let out = sb.run(&["step", "get", name, "--execution", id]);
    (out.code, out.stdout)
}

/// The names of the execution's recorded steps, in name order.
fn step_names(sb: &Sandbox, id: &str) -> Vec<String> {
    let out = sb.run(&["--json", "step", "list", id]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| {
            let row: Value = serde_json::from_str(l).unwrap();
            row["name"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The ids of the execution's stored checkpoints, newest first.
fn checkpoint_ids(sb: &Sandbox, id: &str) -> Vec<u64> {
    list(sb, id)
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect()
}

/// Saves checkpoints 1 to `n` (the newest [`KEEP`] kept), records steps
/// `a`, `b` and `c`, then forgets `b`: every kind of change the log
/// describes for checkpoints and steps.
fn save_all(sb: &Sandbox, id: &str, n: u64) {
    for i in 1..=n {
        save(sb, id, &data(i));
    }
    put_step(sb, id, "a", "result of a\n");
    put_step(sb, id, "b", "result of b\n");
    put_step(sb, id, "c", "résultat de c");
    let out = sb.run(&["step", "clear", "b", "--execution", id]);
    out.assert_success();
}

/// What [`save_all`] left is what `sb`'s daemon serves, exactly.
fn assert_all_there(sb: &Sandbox, id: &str, n: u64) {
    assert_eq!(load(sb, id), (Some(0), data(n)), "the newest checkpoint");
    assert_eq!(
        checkpoint_ids(sb, id),
        (n + 1 - KEEP..=n).rev().collect::<Vec<_>>(),
        "the newest {KEEP} checkpoints, newest first"
    );
    assert_eq!(step_names(sb, id), ["a", "c"]);
    assert_eq!(get_step(sb, id, "a"), (Some(0), "result of a\n".to_owned()));
    assert_eq!(get_step(sb, id, "c"), (Some(0), "résultat de c".to_owned()));
    assert_eq!(get_step(sb, id, "b").0, Some(3), "a cleared step is gone");
}

/// Creates `sb`'s state directory as the daemon would (owner only) and
/// copies the store's two files from `from` into it.
fn copy_store_files(from: &Path, sb: &Sandbox) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(sb.state_dir())
        .unwrap();
    for name in [STORE_FILE, LOG_FILE] {
        std::fs::copy(from.join(name), sb.state_dir().join(name))
            .unwrap_or_else(|e| panic!("cannot copy {name}: {e}"));
    }
}

#[test]
fn a_checkpoint_and_a_step_result_are_logged_and_survive_kill_9_exactly() {
    let mut sup = Supervised::start();
    let id = finished(&sup);
    let log = sup.sb().state_dir().join(LOG_FILE);

    let saved = save(sup.sb(), &id, &data(1));
    sup.daemon().kill9();
    assert!(
        damage::records_holding(&log, data(1).as_bytes()) >= 1,
        "the checkpoint's bytes are in a record of the log"
    );
    sup.daemon().restart();
    assert_eq!(load(sup.sb(), &id), (Some(0), data(1)));
    let listed = list(sup.sb(), &id);
    assert_eq!(listed.len(), 1, "{listed:?}");
    for field in ["id", "seq", "size", "created"] {
        assert_eq!(listed[0][field], saved[field], "{field}: {listed:?}");
    }

    put_step(sup.sb(), &id, "fetch", "fetched: 42 items\n");
    sup.daemon().kill9();
    assert!(
        damage::records_holding(&log, b"fetched: 42 items\n") >= 1,
        "the step's result is in a record of the log"
    );
    // `tetherd check` applies those records too (in memory) and finds
    // the store whole.
    let checked = damage::check(sup.sb());
    checked.assert_success();
    assert!(
        checked.stdout.starts_with("ok: 1 streams, "),
        "{}",
        checked.stdout
    );
    sup.daemon().restart();
    assert_eq!(
        get_step(sup.sb(), &id, "fetch"),
        (Some(0), "fetched: 42 items\n".to_owned())
    );
    // The first result still wins after the replay.
    let again = sup
        .sb()
        .run_with_stdin(&["step", "put", "fetch", "--execution", &id], b"other");
    again.assert_success();
    assert_eq!(again.stdout, "fetched: 42 items\n");
}

#[test]
fn a_store_copied_while_the_daemon_runs_holds_every_acknowledged_change() {
    const SAVES: u64 = 12;
    let sup = Supervised::start();
    let id = finished(&sup);
    save_all(sup.sb(), &id, SAVES);
    // Copied with the daemon running, as `kill -9` would leave the files.
    let copy = Sandbox::new();
    copy_store_files(&sup.sb().state_dir(), &copy);
    assert!(
        damage::records_holding(&copy.state_dir().join(LOG_FILE), data(SAVES).as_bytes()) >= 1,
        "the newest checkpoint is in a record of the log"
    );
    let mut d = copy.start_daemon();
    assert_all_there(&copy, &id, SAVES);
    assert!(d.terminate().success());
}

#[test]
fn repair_rebuilds_checkpoints_and_steps_from_the_log_when_the_store_is_garbage() {
    const SAVES: u64 = 12;
    let mut sup = Supervised::start();
    let id = finished(&sup);
    save_all(sup.sb(), &id, SAVES);
    assert!(sup.daemon().terminate().success());
    let store = sup.sb().state_dir().join(STORE_FILE);
    let len = std::fs::metadata(&store).unwrap().len();
    let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&store, garbage).unwrap();
    damage::start_refused(sup.sb()).assert_code(65);

    let out = damage::repair(sup.sb());
    out.assert_success();
    assert!(
        out.stdout.contains(&format!(
            "lost: the store file could not be opened (store {} is corrupt or unreadable",
            store.display()
        )) && out.stdout.contains(&format!(
            "\nlost: the manifest of execution {id} (only the store file held it); its \
             checkpoints and step results in the log were kept\n"
        )),
        "{}",
        out.stdout
    );
    sup.daemon().restart();
    assert_all_there(sup.sb(), &id, SAVES);
}
