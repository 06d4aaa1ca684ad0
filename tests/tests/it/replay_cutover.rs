//! The hand-over from replaying stored frames to following live ones loses
//! and repeats nothing, even while a producer appends at full speed.

use std::time::Duration;

use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::{assert_same_lines, lines};
use tether_tests::wait::wait_until;
use tether_tests::{Background, Sandbox};

const STREAM: &str = "cutover";
const TOTAL: u64 = 50_000;
/// Stored before the reader starts: it begins with a replay of stored frames.
const STORED_FIRST: u64 = 20_000;
/// The reader's first seq and how many frames it takes: it ends well past
/// what was stored when it started, so it has to switch to live frames.
const FROM: u64 = 10_000;
const COUNT: u64 = 30_000;
const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn tail_from_seq_started_mid_publish_prints_exactly_the_requested_range() {
    let sb = Sandbox::new();
    let socket = sb.socket();
    let _daemon = sb.start_daemon();

    let mut publisher = Background::spawn(
        "publisher",
        sb.tether(&["publish", STREAM, "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(lines(1..=STORED_FIRST));
    wait_until(TIMEOUT, "the first part to be stored", || {
        raw::last_seq(&socket, STREAM) >= STORED_FIRST
    });

    let (from, count) = (FROM.to_string(), COUNT.to_string());
    let mut reader = sb.spawn(
        "reader",
        &["tail", STREAM, "-f", "--from-seq", &from, "--count", &count],
    );
    // The rest goes in at once, racing the reader's replay.
    feeder.feed(lines(STORED_FIRST + 1..=TOTAL));
    feeder.finish();

    publisher.assert_exit(0, TIMEOUT);
    raw::assert_stored(&socket, STREAM, TOTAL);
    reader.assert_exit(0, TIMEOUT);
    assert_same_lines(
        &reader.stdout(),
        &lines(FROM..=FROM + COUNT - 1),
        "tail -f --from-seq --count across the replay/live boundary",
    );
}
