//! Guarantee 7, a full disk: with the state directory on a small tmpfs, a
//! producer that fills it is told "disk full" and keeps its unacknowledged
//! lines, a follower keeps reading what was stored, and once the tmpfs is
//! grown the producer finishes with every line stored exactly once. And a
//! disk that stays full: the producer says so once, keeps retrying for its
//! retry window (`--connect-timeout`), then says which lines are stored and
//! that it gave up, with the cause; nothing stored before is lost, and a
//! re-run as the same producer stores the rest once.
//!
//! Mounting needs root (CI runs as root); elsewhere the tests print why they
//! did nothing and pass.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tether_tests::fault::{self, Tmpfs};
use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::wide_lines;
use tether_tests::wait::wait_until;
use tether_tests::{cli, Sandbox, Signal};

const LINES: u64 = 6000;
const WIDTH: usize = 1000;

/// A sandbox whose state directory is a 3 MiB tmpfs; `None`, after saying
/// why, where it cannot be mounted (not root).
fn sandbox_on_a_small_tmpfs() -> Option<(Sandbox, Tmpfs)> {
    if !fault::is_root() {
        eprintln!("skipped: mounting a tmpfs for the state directory needs root");
        return None;
    }
    let sb = Sandbox::new();
    match Tmpfs::mount(&sb.state_dir(), "3m") {
        Ok(tmpfs) => Some((sb, tmpfs)),
        Err(e) => {
            eprintln!("skipped: cannot mount a tmpfs ({e})");
            None
        }
    }
}

#[test]
fn a_full_disk_refuses_appends_clearly_keeps_reads_going_and_recovers() {
    let Some((sb, tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let socket = sb.socket();
    let d = sb.start_daemon();
    let mut publisher = tether_tests::Background::spawn(
        "publisher",
        sb.tether_with_timeout("300s", &["publish", "full", "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(wide_lines(1..=LINES, WIDTH));
    wait_until(Duration::from_secs(60), "the first frame", || {
        raw::last_seq(&socket, "full") >= 1
    });
    let mut follower = sb.spawn("follower", &["tail", "full", "-f"]);

    // The disk fills: the stream stops growing and the daemon says why.
    wait_until(Duration::from_secs(120), "a disk-full refusal", || {
        d.logs().contains("disk full")
    });
    let stuck_at = raw::last_seq(&socket, "full");
    assert!(stuck_at < LINES, "all {LINES} lines fit in 3 MiB?");
    assert!(
        publisher.is_running(),
        "publish gave up on a full disk:\n{}",
        publisher.stderr()
    );
    // Reads go on: the follower gets every stored line, and the daemon
    // still answers.
    let stored_bytes = stuck_at * WIDTH as u64;
    follower.wait_stdout_len(stored_bytes, Duration::from_secs(60));
    raw::status(&socket).expect("status while the disk is full");

    tmpfs.resize("64m");
    feeder.finish();
    publisher.assert_exit(0, Duration::from_secs(240));
    // Every line exactly once, in order: a dedupe that acknowledged a
    // resent line without storing it shows here as a missing line.
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(
        &stored.stdout,
        &wide_lines(1..=LINES, WIDTH),
        "the stored stream",
    );
    raw::assert_stored(&socket, "full", LINES);
    follower.wait_stdout_len(LINES * WIDTH as u64, Duration::from_secs(60));
    follower.signal(Signal::Term);
    follower.assert_exit(0, Duration::from_secs(30));
    tether_tests::text::assert_same_lines(
        &follower.stdout(),
        &wide_lines(1..=LINES, WIDTH),
        "what the follower printed",
    );
    drop(d);
}

/// Lines published, and acknowledged, before the disk fills.
const STORED_BEFORE: u64 = 500;

/// What the daemon answers an append it cannot commit on a full disk, as
/// `tether` prints it.
const DISK_FULL: &str = "disk full: the store could not commit \
                         (No space left on device (os error 28)) (storage_full)";

#[test]
fn publish_gives_up_on_a_disk_that_stays_full_after_its_window() {
    let Some((sb, _tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let socket = sb.socket();
    let d = sb.start_daemon();
    let before = wide_lines(1..=STORED_BEFORE, WIDTH);
    let out = sb.run_with_stdin(
        &["publish", "full", "--producer", "before"],
        before.as_bytes(),
    );
    out.assert_success();
    // Once idle, the daemon moves those lines from its write-ahead log into
    // the store and empties the log; on a disk with this little room it
    // also cuts the log's file, which then holds no space of its own.
    let log = sb.state_dir().join("tether.wal");
    wait_until(Duration::from_secs(60), "the log emptied", || {
        std::fs::metadata(&log).is_ok_and(|m| m.len() == 0)
    });

    // Another program takes the rest of the disk before the next run starts,
    // so that it is refused from its first append on. (Filling the disk by
    // publishing would leave it to timing which lines fit and how often the
    // producer is refused, and so how often it says so.)
    let filler = sb.state_dir().join("filler");
    fill_disk(&filler);
    let after = wide_lines(STORED_BEFORE + 1..=2 * STORED_BEFORE, WIDTH);
    let publish_after = ["publish", "full", "--producer", "after"];
    let out = cli::run(
        sb.tether_with_timeout("2s", &publish_after),
        after.as_bytes(),
        Duration::from_secs(60),
    );

    // Told once that the disk is full (and that nothing is dropped while
    // retrying); when the window has run out, which lines are stored (none
    // of this run) and how to store them, then that it gave up, and why.
    // Giving up on a daemon that answers is an error (1), not "cannot reach
    // the daemon" (4).
    out.assert_code(1);
    assert_eq!(out.stdout, "", "`tether publish` wrote to stdout");
    let retrying = format!("tether: {DISK_FULL}; keeping unacknowledged data and retrying\n");
    let stored = "tether: no line of this run is confirmed stored. Run again with \
                  --producer after and the same input, from its first line, to store \
                  them, each line once.\n";
    let gave_up = format!("tether: gave up after 2s: {DISK_FULL}\n");
    assert_eq!(
        out.stderr,
        format!("{retrying}{gave_up}{stored}"),
        "stderr of `tether publish` on a full disk"
    );
    assert!(
        out.elapsed >= Duration::from_secs(2),
        "gave up after {:?}, before its 2s retry window ran out",
        out.elapsed
    );

    // Without --producer the name is made up for the run: the advice names
    // the one it used.
    let out = cli::run(
        sb.tether_with_timeout("2s", &["publish", "full"]),
        after.as_bytes(),
        Duration::from_secs(60),
    );
    out.assert_code(1);
    let generated = advised_producer(&out.stderr);
    assert_ne!(generated, "after", "stderr: {}", out.stderr);
    let stored = format!(
        "tether: no line of this run is confirmed stored. Run again with \
         --producer {generated} and the same input, from its first line, to store \
         them, each line once.\n"
    );
    assert_eq!(
        out.stderr,
        format!("{retrying}{gave_up}{stored}"),
        "stderr of `tether publish` without --producer on a full disk"
    );

    // Nothing acknowledged before the disk filled was lost, and nothing of
    // the refused runs was stored.
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(&stored.stdout, &before, "the stored stream");
    raw::assert_stored(&socket, "full", STORED_BEFORE);
    assert!(
        d.logs().contains("disk full"),
        "the daemon did not log the full disk:\n{}",
        d.logs()
    );

    // Once there is room again, re-running as advised (the same input with
    // the producer name that was printed) stores the refused lines, each
    // once.
    std::fs::remove_file(&filler).expect("remove the filler");
    let out = sb.run_with_stdin(
        &["publish", "full", "--producer", &generated],
        after.as_bytes(),
    );
    out.assert_success();
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(
        &stored.stdout,
        &format!("{before}{after}"),
        "the stored stream after the re-run",
    );
    raw::assert_stored(&socket, "full", 2 * STORED_BEFORE);
    drop(d);
}

/// The producer name that `tether publish` advises re-running with.
fn advised_producer(stderr: &str) -> String {
    let (_, rest) = stderr
        .split_once(" --producer ")
        .unwrap_or_else(|| panic!("no --producer advice on stderr:\n{stderr}"));
    rest.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no producer name after --producer:\n{stderr}"))
        .to_owned()
}

/// Writes `path` until the file system it is on has no space left.
fn fill_disk(path: &Path) {
    let mut file = File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return,
            Err(e) => panic!("filling {} failed: {e}", path.display()),
        }
    }
}
