//! Guarantee 6: bad input closes that one connection with an error frame
//! saying what was wrong, and the daemon goes on serving everyone else with
//! its data intact.

use bytes::Bytes;
use tether_protocol::{
    Capabilities, DurableAck, DurableResume, ErrorCode, ErrorFrame, FrameKind, Hello, Request,
    StartAt, Subscribe, PROTOCOL_VERSION,
};
use tether_tests::text::lines;
use tether_tests::{Daemon, RawConn, Sandbox};

const STREAM: &str = "victim";
const STORED: u64 = 10;

/// A daemon holding a 10-frame stream.
fn daemon_with_stream() -> (Sandbox, Daemon) {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=STORED));
    (sb, daemon)
}

/// The error frame ends the session, and then another client is served as
/// before: status works and the stream still holds exactly what it held.
fn assert_refused_then_others_served(sb: &Sandbox, conn: &mut RawConn, error: &ErrorFrame) {
    conn.expect_closed();
    assert!(
        !error.message.is_empty(),
        "the error frame carries no message"
    );
    sb.run(&["status"]).assert_success();
    let out = sb.run(&["tail", STREAM, "--count", &STORED.to_string()]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=STORED));
}

/// The connection gets an error frame with `code` whose message mentions
/// every one of `words`, and then the daemon serves others as before.
fn assert_refused(sb: &Sandbox, conn: &mut RawConn, code: ErrorCode, words: &[&str]) {
    let error = conn.expect_error();
    assert_eq!(error.code, code, "{error:?}");
    assert_mentions(&error, words);
    assert_refused_then_others_served(sb, conn, &error);
}

fn assert_mentions(error: &ErrorFrame, words: &[&str]) {
    for word in words {
        assert!(
            error.message.contains(word),
            "error message {:?} does not mention {word:?}",
            error.message
        );
    }
}

#[test]
fn oversized_length_prefix_is_refused_as_frame_too_large() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.send_bytes(&u32::MAX.to_be_bytes()).unwrap();

    assert_refused(
        &sb,
        &mut conn,
        ErrorCode::FRAME_TOO_LARGE,
        &["4294967295", "exceeds the maximum"],
    );
}

#[test]
fn random_bytes_are_refused() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    // The daemon may refuse the first bytes and close before the rest is
    // written, so write errors are expected; the error frame is what counts.
    let _ = conn.send_bytes(&noise(4096));
    // End the input, so that a length prefix that happens to be small is
    // judged truncated instead of waited on.
    let _ = conn.shutdown_write();

    let error = conn.expect_error();
    assert!(
        [ErrorCode::FRAME_TOO_LARGE, ErrorCode::MALFORMED].contains(&error.code),
        "{error:?}"
    );
    assert_refused_then_others_served(&sb, &mut conn, &error);
}

#[test]
fn truncated_frame_is_refused_as_malformed() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.send_bytes(&100u32.to_be_bytes()).unwrap();
    conn.send_bytes(&[0u8; 10]).unwrap();
    conn.shutdown_write().unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::MALFORMED, &["truncated"]);
}

#[test]
fn unknown_protocol_version_is_refused_naming_it() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.send(&Request::Hello(Hello {
        version: 99,
        capabilities: Capabilities::ALL,
        client: "from the future".to_owned(),
    }))
    .unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::UNSUPPORTED_VERSION, &["99"]);
}

#[test]
fn request_before_hello_is_refused() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.send(&Request::Status).unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::HELLO_REQUIRED, &[]);
}

#[test]
fn second_hello_is_refused() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::ALL);
    conn.send(&Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ALL,
        client: "again".to_owned(),
    }))
    .unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::HELLO_REQUIRED, &[]);
}

#[test]
fn resume_beyond_the_last_seq_is_refused() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::DURABLE);
    conn.send(&Request::DurableResume(DurableResume {
        stream: STREAM.to_owned(),
        acked_through: 1000,
        follow: true,
        consumer: None,
    }))
    .unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::INVALID_REQUEST, &["beyond"]);
}

#[test]
fn ack_beyond_the_last_seq_is_refused() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::DURABLE);
    conn.send(&Request::Subscribe(Subscribe {
        stream: STREAM.to_owned(),
        start: StartAt::Oldest,
        follow: true,
        consumer: Some("c".to_owned()),
    }))
    .unwrap();
    conn.send(&Request::DurableAck(DurableAck { through_seq: 1000 }))
        .unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::INVALID_REQUEST, &["beyond"]);
}

#[test]
fn invalid_stream_name_is_refused_and_nothing_is_stored() {
    let (sb, _daemon) = daemon_with_stream();
    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::DURABLE);
    conn.send(&Request::Append(tether_protocol::Append {
        stream: "two words".to_owned(),
        producer: "p".to_owned(),
        producer_seq: 1,
        kind: FrameKind::Data,
        payload: Bytes::from_static(b"never stored"),
    }))
    .unwrap();

    assert_refused(&sb, &mut conn, ErrorCode::INVALID_REQUEST, &[]);
    let names: Vec<String> = tether_tests::raw::list_streams(&sb.socket())
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [STREAM]);
}

/// Deterministic noise (xorshift), so that a failure can be replayed.
fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}
