//! Guards against a failing device (`fdatasync` returning EIO) crashing
//! the daemon, losing or doubling acknowledged lines, or stopping reads,
//! and against a crash while the store cannot be written losing what was
//! acknowledged before, or storing a resent line twice.
//!
//! The failing sync is injected with libfiu (`fiu-utils`): the test is
//! skipped, saying so, where `fiu-run` is not installed. The full disk is a
//! small tmpfs, which needs root, as in `fault_disk_full`.

use std::path::Path;
use std::time::{Duration, Instant};

use tether_tests::fiu::{self, Fiu};
use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::{lines, wide_lines};
use tether_tests::wait::wait_until;
use tether_tests::{Background, Daemon, Sandbox};

use super::fault_disk_full::{
    assert_cleared_once, assert_storage_full, degraded_logged, degraded_shown,
    sandbox_on_a_small_tmpfs, storage_line, utc_now, Reads, StoredReads, STORAGE_OK,
};

/// Lines per producer in the failing-sync test.
const BATCH: u64 = 1000;

/// `EIO`, as libfiu's `failinfo` takes it.
const EIO: i32 = 5;

#[test]
fn a_failing_fdatasync_refuses_writes_with_the_cause_keeps_reads_and_loses_nothing() {
    let sb = Sandbox::new();
    let Some(fiu) = Fiu::new(sb.path()) else {
        eprintln!("skipped: fiu-run is not installed (apt-get install fiu-utils)");
        return;
    };
    let socket = sb.socket();
    let env = fiu.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut d = sb.start_daemon_with_env(&env);
    let wal = sb.state_dir().join("tether.wal");
    let wal = wal.to_str().expect("a UTF-8 state dir");

    // Stored and acknowledged while the device works.
    let out = sb.run_with_stdin(
        &["publish", "s", "--producer", "P"],
        lines(1..=BATCH).as_bytes(),
    );
    out.assert_success();
    raw::assert_stored(&socket, "s", BATCH);
    let stored_before = StoredReads::store(&sb);

    // From now on every fdatasync of the daemon fails with EIO.
    let began_after = utc_now();
    fiu.enable(d.pid(), fiu::FDATASYNC, EIO);
    let started = Instant::now();
    let mut publisher = Background::spawn(
        "publisher",
        sb.tether_with_timeout("300s", &["publish", "s", "--producer", "Q"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(lines(BATCH + 1..=2 * BATCH));
    feeder.finish();

    // The producer is told why, once, and keeps retrying.
    wait_until(
        Duration::from_secs(30),
        "publish to name the I/O error",
        || publisher.stderr().contains("I/O error on"),
    );
    std::thread::sleep(Duration::from_secs(10).saturating_sub(started.elapsed()));
    assert!(
        publisher.is_running(),
        "publish gave up on a failing sync within 10 s:\n{}",
        publisher.stderr()
    );
    let told = publisher.stderr();
    let told_lines: Vec<&str> = told.lines().collect();
    assert!(
        told_lines.len() == 1
            && told_lines[0].starts_with(&format!("tether: storage error: I/O error on {wal}: "))
            && told_lines[0].ends_with("; keeping unacknowledged data and retrying"),
        "stderr of `tether publish` while fdatasync fails is not one line \
         `tether: storage error: I/O error on {wal}: ...; keeping unacknowledged data \
         and retrying`:\n{told}"
    );

    // Every read goes on from what is stored: at least P's lines, in
    // order, and an ended execution's checkpoint and step as before.
    let mut read_list: Vec<&[&str]> = vec![&["status"], &["streams"], &["tail", "s"]];
    let stored_reads = stored_before.reads();
    read_list.extend(stored_reads.iter().map(Vec::as_slice));
    let reads = Reads::start(&sb, &read_list);
    stored_before.assert_same(&reads);
    let stored = reads.output("tail s");
    let shown = stored.lines().count() as u64;
    assert!(
        shown >= BATCH,
        "`tether tail` printed {shown} lines while fdatasync fails, expected the {BATCH} acknowledged"
    );
    tether_tests::text::assert_same_lines(
        &stored,
        &lines(1..=shown),
        "`tether tail` while fdatasync fails",
    );
    let degraded = degraded_shown(&reads.output("status"));
    degraded.assert_began_between(&began_after, &utc_now());
    // Said once, with the cause.
    let logged = degraded_logged(&d.logs());
    assert!(
        logged.starts_with(&format!("I/O error on {wal}: "))
            && logged.contains("Input/output error (os error 5)"),
        "the cause the daemon logged is not `I/O error on {wal}: ...Input/output error \
         (os error 5)...`: {logged:?}"
    );

    // The device works again: the producer finishes by itself, and every
    // line is stored once, in order.
    fiu.disable(d.pid(), fiu::FDATASYNC);
    publisher.assert_exit(0, Duration::from_secs(60));
    raw::assert_stored(&socket, "s", 2 * BATCH);
    assert_stream_holds(
        &sb,
        "s",
        &lines(1..=2 * BATCH),
        "the stream after fdatasync works again",
    );
    assert_eq!(
        storage_line(&sb),
        STORAGE_OK,
        "`tether status` once writes resumed"
    );
    assert_cleared_once(&d, &format!("I/O error on {wal}: "));

    // What was acknowledged is on disk: a crash and a start without libfiu
    // find it all, once.
    d.kill9();
    let d2 = restart_elsewhere(&sb, "after-crash");
    raw::assert_stored(&socket, "s", 2 * BATCH);
    assert_stream_holds(
        &sb,
        "s",
        &lines(1..=2 * BATCH),
        "the stream after kill -9 and a restart",
    );
    drop(d2);

    // Checked last, so that a wrong wording does not hide whether the data
    // survived: the cause `status` shows while degraded is the contract's
    // `I/O error on FILE: ...`, as the log and the producer had it.
    assert!(
        degraded.cause.starts_with(&format!("I/O error on {wal}: ")),
        "`tether status` while fdatasync fails does not show the cause as \
         `I/O error on {wal}: ...`:\n{}",
        degraded.line
    );
}

/// Lines published, and acknowledged, before the disk fills.
const BEFORE: u64 = 500;

/// Lines the producer that fills the disk has to send.
const FILLING: u64 = 6000;

/// Bytes per line.
const WIDTH: usize = 1000;

#[test]
fn a_crash_while_the_disk_is_full_loses_nothing_acknowledged_and_stores_nothing_twice() {
    let Some((sb, tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let socket = sb.socket();
    let mut d = sb.start_daemon();
    let before = wide_lines(1..=BEFORE, WIDTH);
    let out = sb.run_with_stdin(
        &["publish", "full", "--producer", "before"],
        before.as_bytes(),
    );
    out.assert_success();
    let mut follower = sb.spawn("follower", &["tail", "full", "-f"]);
    follower.wait_stdout_len(BEFORE * WIDTH as u64, Duration::from_secs(60));

    // A producer fills the disk and keeps retrying the rest.
    let mut publisher = Background::spawn(
        "publisher",
        sb.tether_with_timeout("300s", &["publish", "full", "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(wide_lines(BEFORE + 1..=FILLING, WIDTH));
    wait_until(
        Duration::from_secs(120),
        "the daemon to log the full disk",
        || d.logs().contains("storage degraded: "),
    );
    assert_storage_full(&degraded_logged(&d.logs()), "the cause the daemon logged");

    // A crash while degraded, and a start once there is room. What a
    // reader had been given before the crash was stored.
    let seen = follower.stdout();
    d.kill9();
    tmpfs.resize("64m");
    d.restart();
    let after = sb.run(&["tail", "full"]);
    after.assert_success();
    assert!(
        after.stdout.starts_with(&seen),
        "after the restart the stream does not begin with the {} lines a reader was given \
         before the crash ({} lines now)",
        seen.lines().count(),
        after.stdout.lines().count()
    );

    // The producer, which kept what was not acknowledged, resends it to
    // the new daemon and finishes: every line once, in order. A line
    // acknowledged and then lost would be missing; one stored and resent
    // would be there twice.
    feeder.finish();
    publisher.assert_exit(0, Duration::from_secs(240));
    raw::assert_stored(&socket, "full", FILLING);
    assert_stream_holds(
        &sb,
        "full",
        &wide_lines(1..=FILLING, WIDTH),
        "the stream after a crash on a full disk",
    );
    assert_eq!(
        storage_line(&sb),
        STORAGE_OK,
        "`tether status` after the restart"
    );
}

/// Asserts that `tether tail STREAM` exits 0 printing exactly `expected`.
fn assert_stream_holds(sb: &Sandbox, stream: &str, expected: &str, what: &str) {
    let out = sb.run(&["tail", stream]);
    out.assert_success();
    tether_tests::text::assert_same_lines(&out.stdout, expected, what);
}

/// A daemon on the sandbox's socket and state, with its logs in `DIR` of
/// the sandbox (so that those of the daemon before it stay).
fn restart_elsewhere(sb: &Sandbox, dir: &str) -> Daemon {
    let logs = sb.file(dir);
    std::fs::create_dir_all(&logs).expect("create the log directory");
    Daemon::start(&sb.socket(), &sb.state_dir(), Path::new(&logs))
}
