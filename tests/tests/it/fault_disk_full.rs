//! Guarantee 7, a full disk: with the state directory on a small tmpfs, a
//! producer that fills it is told "disk full" and keeps its unacknowledged
//! lines, a follower keeps reading what was stored, and once the tmpfs is
//! grown the producer finishes with every line stored exactly once.
//!
//! Mounting needs root (CI runs as root); elsewhere the test prints why it
//! did nothing and passes.

use std::time::Duration;

use tether_tests::fault::{self, Tmpfs};
use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::wide_lines;
use tether_tests::wait::wait_until;
use tether_tests::{Sandbox, Signal};

const LINES: u64 = 6000;
const WIDTH: usize = 1000;

#[test]
fn a_full_disk_refuses_appends_clearly_keeps_reads_going_and_recovers() {
    if !fault::is_root() {
        eprintln!("skipped: mounting a tmpfs for the state directory needs root");
        return;
    }
    let sb = Sandbox::new();
    let tmpfs = match Tmpfs::mount(&sb.state_dir(), "3m") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipped: cannot mount a tmpfs ({e})");
            return;
        }
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
