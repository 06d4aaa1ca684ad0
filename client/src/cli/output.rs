//! How `tether tail` prints frames.
//!
//! Plain: the payload and a newline, bytes as stored.
//!
//! `--json`: one object per line,
//! `{"stream":"s","seq":7,"ts":"2025-01-02T03:04:05.123456Z","kind":"data","payload":"..."}`.
//! `ts` is the daemon's acceptance time in RFC 3339, UTC, with exactly six
//! fractional digits (the stored precision is microseconds), so that it
//! sorts as text. `payload` is the payload decoded as UTF-8, with invalid
//! sequences replaced by U+FFFD.

use std::fmt;

use serde::{Serialize, Serializer};
use tether::time::Rfc3339;
use tether_protocol::Frame;

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
    payload: std::borrow::Cow<'a, str>,
}

fn push_json(out: &mut Vec<u8>, stream: &str, seq: u64, frame: &Frame) {
    let line = JsonFrame {
        stream,
        seq,
        ts: Rfc3339(frame.ts_micros),
        kind: frame.kind.as_str(),
        payload: String::from_utf8_lossy(&frame.payload),
    };
    // Serializing plain strings and integers into a Vec cannot fail; should
    // it ever, the line is skipped rather than printed half-way.
    let start = out.len();
    if serde_json::to_writer(&mut *out, &line).is_err() {
        out.truncate(start);
    }
}

fn as_display<T: fmt::Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use bytes::Bytes;
    use tether_protocol::FrameKind;

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
    fn json_payloads_are_decoded_lossily() {
        let mut out = Vec::new();
        push_frame(&mut out, true, "s", 1, &frame(b"a\xffb", 0));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["payload"], "a\u{fffd}b");
        assert_eq!(value["ts"], "1970-01-01T00:00:00.000000Z");
    }
}
