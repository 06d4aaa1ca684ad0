//! How `tether tail` prints frames.
//!
//! Plain: the payload and a newline, bytes as stored; `stderr` frames and
//! lifecycle events go to stderr, every other kind to stdout
//! ([`placement`]). With
//! `-t/--timestamps` each line starts with the frame's time and a space
//! ([`push_timestamp`]).
//!
//! `--json`: one object per line,
//! `{"stream":"s","seq":7,"ts":"2025-01-02T03:04:05.123456Z","kind":"data","payload":"..."}`.
//! `ts` is the daemon's acceptance time in RFC 3339, UTC, with exactly six
//! fractional digits (the stored precision is microseconds), so that it
//! sorts as text. Bytes stay bytes: `payload` is the payload when it is
//! valid UTF-8; otherwise `payload_b64` holds it in standard base64 (RFC
//! 4648, padded) and `payload` is absent.

use std::fmt;

use serde::{Serialize, Serializer};
use tether::time::Rfc3339;
use tether_protocol::{Frame, FrameKind};

/// Where a frame is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Stdout,
    Stderr,
}

/// Where a frame of `kind` goes, and what precedes it there: plain
/// `stderr` lines to stderr, as the worker wrote them; lifecycle events,
/// which are tether's words and not the worker's output, to stderr marked
/// `tether: `; everything else, and every `--json` line, to stdout.
pub fn placement(json: bool, kind: FrameKind) -> (Target, &'static [u8]) {
    match (json, kind) {
        (false, FrameKind::Stderr) => (Target::Stderr, b""),
        (false, FrameKind::Event) => (Target::Stderr, b"tether: "),
        _ => (Target::Stdout, b""),
    }
}

/// Appends the frame's time, RFC 3339 in UTC, and a space: the `-t` prefix.
pub fn push_timestamp(out: &mut Vec<u8>, frame: &Frame) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{} ", Rfc3339(frame.ts_micros));
}

/// Writes `bytes` to `target`. `Ok(false)` when stdout is closed; a closed
/// or failing stderr is not an error (the output that matters is stdout's).
pub fn write_to(target: Target, bytes: &[u8]) -> tether::Result<bool> {
    match target {
        Target::Stdout => super::write_stdout(bytes),
        Target::Stderr => {
            use std::io::Write;
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(bytes).and_then(|()| stderr.flush());
            Ok(true)
        }
    }
}

/// Appends one frame, as printed, to `out`.
pub fn push_frame(out: &mut Vec<u8>, json: bool, stream: &str, seq: u64, frame: &Frame) {
    if json {
        push_json(out, stream, seq, frame);
    } else {
        out.extend_from_slice(&frame.payload);
    }
    out.push(b'\n');
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    stream: &'a str,
    seq: u64,
    #[serde(serialize_with = "as_display")]
    ts: Rfc3339,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_b64: Option<String>,
}

fn push_json(out: &mut Vec<u8>, stream: &str, seq: u64, frame: &Frame) {
    let text = std::str::from_utf8(&frame.payload).ok();
    let line = JsonFrame {
        stream,
        seq,
        ts: Rfc3339(frame.ts_micros),
        kind: frame.kind.as_str(),
        payload: text,
        payload_b64: text.is_none().then(|| base64(&frame.payload)),
    };
    // Serializing plain strings and integers into a Vec cannot fail; should
    // it ever, the line is skipped rather than printed half-way.
    let start = out.len();
    if serde_json::to_writer(&mut *out, &line).is_err() {
        out.truncate(start);
    }
}

/// Standard base64 with padding (RFC 4648, section 4), as JSON tools
/// decode it by default.
pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn as_display<T: fmt::Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use bytes::Bytes;

    fn frame(payload: &[u8], ts_micros: u64) -> Frame {
        Frame {
            ts_micros,
            kind: FrameKind::Data,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn plain_output_is_the_payload_and_a_newline() {
        let mut out = Vec::new();
        push_frame(&mut out, false, "s", 1, &frame(b"hello\r", 0));
        push_frame(&mut out, false, "s", 2, &frame(b"", 0));
        assert_eq!(out, b"hello\r\n\n");
    }

    #[test]
    fn json_output_has_the_documented_shape() {
        let mut out = Vec::new();
        push_frame(
            &mut out,
            true,
            "logs",
            7,
            &frame(b"say \"hi\"\n", 1_700_000_000_123_456),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"stream\":\"logs\",\"seq\":7,\"ts\":\"2023-11-14T22:13:20.123456Z\",\
             \"kind\":\"data\",\"payload\":\"say \\\"hi\\\"\\n\"}\n"
        );
    }

    #[test]
    fn json_payloads_that_are_not_utf8_are_base64_and_never_altered() {
        let mut out = Vec::new();
        push_frame(&mut out, true, "s", 1, &frame(b"a\xffb", 0));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"stream\":\"s\",\"seq\":1,\"ts\":\"1970-01-01T00:00:00.000000Z\",\
             \"kind\":\"data\",\"payload_b64\":\"Yf9i\"}\n"
        );
    }

    #[test]
    fn timestamps_are_rfc_3339_utc_with_microseconds_and_a_space() {
        let mut out = Vec::new();
        push_timestamp(&mut out, &frame(b"x", 1_700_000_000_123_456));
        assert_eq!(out, b"2023-11-14T22:13:20.123456Z ");
    }

    #[test]
    fn plain_stderr_lines_and_events_go_to_stderr() {
        assert_eq!(
            placement(false, FrameKind::Stderr),
            (Target::Stderr, &b""[..])
        );
        assert_eq!(
            placement(false, FrameKind::Stdout),
            (Target::Stdout, &b""[..])
        );
        assert_eq!(
            placement(false, FrameKind::Data),
            (Target::Stdout, &b""[..])
        );
        assert_eq!(
            placement(false, FrameKind::Event),
            (Target::Stderr, &b"tether: "[..])
        );
        assert_eq!(
            placement(true, FrameKind::Event),
            (Target::Stdout, &b""[..])
        );
    }

    #[test]
    fn base64_follows_rfc_4648() {
        // The test vectors of RFC 4648, section 10.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }
}
