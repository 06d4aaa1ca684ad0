//! Publishing lines and reading them back: positions, JSON output, stream
//! listing and idempotent re-runs.

use bytes::Bytes;
use tether_protocol::{Append, Capabilities, FrameKind, Request, Response};
use tether_tests::text::lines;
use tether_tests::{RawConn, Sandbox};

const STREAM: &str = "events";

#[test]
fn tail_prints_every_published_line_in_order() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=5));

    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=5));
}

#[test]
fn tail_last_n_starts_at_the_last_n_frames() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=5));

    let out = sb.run(&["tail", STREAM, "-n", "2"]);
    out.assert_success();
    assert_eq!(out.stdout, lines(4..=5));
}

#[test]
fn tail_from_seq_starts_at_that_seq() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=5));

    let out = sb.run(&["tail", STREAM, "--from-seq", "3"]);
    out.assert_success();
    assert_eq!(out.stdout, lines(3..=5));
}

#[test]
fn tail_count_exits_after_that_many_frames() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=5));

    let out = sb.run(&["tail", STREAM, "-f", "--count", "2"]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=2));
}

#[test]
fn second_publish_appends_after_the_first() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=3));
    sb.publish(STREAM, &lines(4..=6));

    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=6));
}

#[test]
fn rerun_with_the_same_producer_stores_nothing_twice() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    let input = lines(1..=5);
    for _ in 0..2 {
        sb.run_with_stdin(&["publish", STREAM, "--producer", "P"], input.as_bytes())
            .assert_success();
    }

    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, input);
}

#[test]
fn tail_json_prints_one_object_per_frame_with_its_seq() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, "alpha\nbeta\n");

    let out = sb.run(&["--json", "tail", STREAM]);
    out.assert_success();
    let rows: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    assert_eq!(rows.len(), 2, "stdout: {}", out.stdout);
    for (row, (seq, payload)) in rows.iter().zip([(1, "alpha"), (2, "beta")]) {
        let obj = row.as_object().expect("each line is a JSON object");
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["kind", "payload", "seq", "stream", "ts"], "{row}");
        assert_eq!(obj["stream"], STREAM);
        assert_eq!(obj["seq"], seq);
        assert_eq!(obj["kind"], "data");
        assert_eq!(obj["payload"], payload);
        // The contract names the field but not its encoding: a number
        // (epoch-based) or a timestamp string are both fine, absent is not.
        let ts_present = obj["ts"].is_u64() || obj["ts"].as_str().is_some_and(|t| !t.is_empty());
        assert!(ts_present, "ts is neither a number nor a timestamp: {row}");
    }
}

#[test]
fn streams_json_lists_each_stream_with_its_range() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish("a", &lines(1..=3));
    sb.publish("b", &lines(1..=1));

    let out = sb.run(&["--json", "streams"]);
    out.assert_success();
    let mut rows: Vec<(String, u64, u64, u64)> = out
        .stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"));
            (
                v["name"].as_str().expect("name").to_owned(),
                v["first_seq"].as_u64().expect("first_seq"),
                v["last_seq"].as_u64().expect("last_seq"),
                v["frames"].as_u64().expect("frames"),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [("a".to_owned(), 1, 3, 3), ("b".to_owned(), 1, 1, 1)],
        "stdout: {}",
        out.stdout
    );
}

#[test]
fn status_reports_the_daemon_it_reached() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();

    let out = sb.run(&["--json", "status"]);
    out.assert_success();
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "status --json is not one JSON object: {:?}: {e}",
            out.stdout
        )
    });
    assert_eq!(v["socket"], sb.socket().to_str().unwrap(), "{v}");
    assert_eq!(v["state_dir"], sb.state_dir().to_str().unwrap(), "{v}");
}

/// Appends written back to back on one connection, far more than fit in
/// the socket buffers, are each stored exactly once and acknowledged only
/// once stored (the protocol-level half of `tether publish`).
///
/// Regression: a session once handed each append batch to the writer from
/// inside its pipelined future, so a later batch could reach the writer
/// first; the producer dedupe then acknowledged the earlier batch as a
/// duplicate without storing it (lost and reordered frames, exit 0).
#[test]
fn pipelined_appends_are_all_stored_before_the_last_is_acknowledged() {
    const APPENDS: u64 = 200_000;
    const WIDTH: usize = 128;
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();

    let mut reader = RawConn::open(&sb.socket());
    reader.hello(Capabilities::NONE);
    let mut writer = reader.try_clone().unwrap();
    let payload = Bytes::from(vec![b'x'; WIDTH]);
    let sending = std::thread::spawn(move || {
        for producer_seq in 1..=APPENDS {
            let append = Request::Append(Append {
                stream: STREAM.to_owned(),
                producer: "raw".to_owned(),
                producer_seq,
                kind: FrameKind::Data,
                payload: payload.clone(),
            });
            // A write fails only once the reading side gave up, and that
            // side reports why.
            if writer.send(&append).is_err() {
                return;
            }
        }
    });
    let mut acked = 0;
    while acked < APPENDS {
        match reader.expect_response() {
            Response::Appended(a) => {
                assert!(a.producer_seq > acked, "acks went backwards: {a:?}");
                assert_eq!(a.seq, a.producer_seq, "seq and producer seq differ: {a:?}");
                acked = a.producer_seq;
            }
            other => panic!("expected Appended, got {other:?}"),
        }
    }
    sending.join().expect("the writer thread panicked");

    let info = tether_tests::raw::stream_info(&sb.socket(), STREAM).unwrap();
    assert_eq!(
        (info.first_seq, info.last_seq, info.frames),
        (1, APPENDS, APPENDS),
        "{info:?}"
    );
    assert_eq!(info.bytes, APPENDS * WIDTH as u64, "{info:?}");
}
