//! Guarantee 7, a corrupt store: a redb file with flipped bytes makes the
//! daemon refuse to start as damaged (exit 65), naming the file and
//! leaving every file of the state directory as it was; and a `kill -9`
//! in the middle of heavy commits is repaired by the next start with
//! every acknowledged frame kept.

use std::time::Duration;

use tether_tests::cli;
use tether_tests::daemon;
use tether_tests::damage::StateSnapshot;
use tether_tests::raw;
use tether_tests::text::lines;
use tether_tests::Sandbox;

#[test]
fn a_store_with_flipped_bytes_is_refused_by_name_and_left_untouched() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish("s", &lines(1..=2000));
    assert!(d.terminate().success());
    let store = sb.state_dir().join("tether.redb");
    let mut bytes = std::fs::read(&store).unwrap();
    // The header and the first pages hold redb's god byte, region headers
    // and the roots of every table: damage there cannot go unnoticed.
    for i in (0..bytes.len().min(8192)).step_by(7) {
        bytes[i] ^= 0x5a;
    }
    std::fs::write(&store, &bytes).unwrap();
    let before = StateSnapshot::take(&sb.state_dir());

    let mut cmd = daemon::command(&sb.socket(), &sb.state_dir());
    cmd.env_remove("TETHER_SOCKET");
    let out = cli::run(cmd, b"", Duration::from_secs(60));
    assert_eq!(
        out.code,
        Some(65),
        "tetherd should refuse a corrupt store as damaged (exit 65): {out:?}"
    );
    assert!(
        out.stderr.contains(&format!(
            "store {} is corrupt or unreadable",
            store.display()
        )),
        "the refusal should name {}:\n{}",
        store.display(),
        out.stderr
    );
    before.assert_unchanged("tetherd refusing the corrupt store");
}

#[test]
fn a_kill_9_during_heavy_commits_is_recovered_with_every_acknowledged_frame() {
    // A kill that lands just after a durable commit leaves nothing for the
    // log to bring back; the crash is then tried again, a few times, so
    // that the test does see a replay.
    let mut logs = Vec::new();
    for _ in 0..3 {
        match crash_during_heavy_commits() {
            Ok(()) => return,
            Err(restart_logs) => logs.push(restart_logs),
        }
    }
    panic!(
        "no restart replayed the log in 3 crashes:\n{}",
        logs.join("\n")
    );
}

/// Kills the daemon while a publisher is busy and checks what the restart
/// kept. `Err` with the daemon's logs when the restart had nothing to
/// replay from the log.
fn crash_during_heavy_commits() -> Result<(), String> {
    let sb = Sandbox::new();
    let socket = sb.socket();
    let mut d = sb.start_daemon();
    sb.publish("done", &lines(1..=3000));
    let mut busy = sb.spawn("busy", &["publish", "busy", "--producer", "B"]);
    let feeder = tether_tests::StdinFeeder::new(busy.take_stdin());
    feeder.feed(lines(1..=200_000));
    tether_tests::wait::wait_until(Duration::from_secs(60), "heavy publishing", || {
        raw::last_seq(&socket, "busy") >= 20_000
    });
    d.kill9();
    d.restart();
    raw::assert_stored(&socket, "done", 3000);
    // The acknowledged commits since the store's last durable commit were in the
    // write-ahead log only, and came back from it.
    let replayed = d
        .logs()
        .contains("applied the log's commits the store did not hold");
    // The publisher rides through the restart and exits 0 only once every
    // line is stored: then all of them are there, once.
    feeder.finish();
    busy.assert_exit(0, Duration::from_secs(180));
    raw::assert_stored(&socket, "busy", 200_000);
    if replayed {
        Ok(())
    } else {
        Err(d.logs())
    }
}
