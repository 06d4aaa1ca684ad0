//! Guarantee 4 and the gap half of guarantee 3: a durable consumer's acks
//! let the daemon delete what it has read, and a reader asking for deleted
//! frames is told so before it gets the next retained one.

use std::time::Duration;

use tether_tests::text::{assert_same_lines, line, lines};
use tether_tests::wait::wait_until;
use tether_tests::Sandbox;

const STREAM: &str = "jobs";
const PUBLISHED: u64 = 1000;
const CONSUMED: u64 = 600;

/// `(first_seq, last_seq)` of `stream` from `tether --json streams`.
fn retained_range(sb: &Sandbox, stream: &str) -> (u64, u64) {
    let out = sb.run(&["--json", "streams"]);
    out.assert_success();
    for row in out.stdout.lines() {
        let v: serde_json::Value =
            serde_json::from_str(row).unwrap_or_else(|e| panic!("not JSON: {row:?}: {e}"));
        if v["name"] == stream {
            let first = v["first_seq"].as_u64();
            let last = v["last_seq"].as_u64();
            return (
                first.unwrap_or_else(|| panic!("no first_seq in {row}")),
                last.unwrap_or_else(|| panic!("no last_seq in {row}")),
            );
        }
    }
    panic!(
        "stream {stream} missing from `tether --json streams`:\n{}",
        out.stdout
    );
}

#[test]
fn consumer_acks_compact_and_a_reader_of_deleted_frames_gets_a_gap_notice() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=PUBLISHED));

    let consumed = CONSUMED.to_string();
    let out = sb.run(&["tail", STREAM, "--consumer", "c", "--count", &consumed]);
    out.assert_success();
    assert_same_lines(
        &out.stdout,
        &lines(1..=CONSUMED),
        "the consumer's first read",
    );

    // Compaction runs asynchronously after the ack.
    wait_until(Duration::from_secs(10), "compaction past the ack", || {
        retained_range(&sb, STREAM).0 > CONSUMED
    });
    assert_eq!(
        retained_range(&sb, STREAM),
        (CONSUMED + 1, PUBLISHED),
        "only the acked frames are deleted"
    );

    let out = sb.run(&["tail", STREAM, "--from-seq", "1", "--count", "1"]);
    out.assert_success();
    assert_eq!(out.stdout, line(CONSUMED + 1));
    assert!(
        out.stderr.contains("compacted"),
        "stderr does not report the gap: {:?}",
        out.stderr
    );
}

#[test]
fn durable_consumer_resumes_after_its_last_ack() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=PUBLISHED));

    let consumed = CONSUMED.to_string();
    sb.run(&["tail", STREAM, "--consumer", "c", "--count", &consumed])
        .assert_success();
    let rest = (PUBLISHED - CONSUMED).to_string();
    let out = sb.run(&["tail", STREAM, "--consumer", "c", "--count", &rest]);
    out.assert_success();
    assert_same_lines(
        &out.stdout,
        &lines(CONSUMED + 1..=PUBLISHED),
        "the consumer's second read",
    );
}
