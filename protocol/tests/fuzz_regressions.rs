//! Regression inputs for the decoder fuzz target, replayed on every test run.
//!
//! Every file in `tests/fuzz_regressions/` is one input in the format of
//! `fuzz/fuzz_targets/decode.rs`: the first byte picks how the rest is split
//! into reads, the rest is the byte stream. A crash the fuzzer finds, once
//! minimized with `cargo fuzz tmin`, is copied into that directory under a
//! name saying what it is, and from then on guards against the bug here
//! without libFuzzer or a nightly toolchain (see `scripts/fuzz.sh`).
//!
//! [`check_input`] is the fuzz target's own body (`decode_checks`, shared
//! with it by path).
//!
//! On top of "never panics", the hand-picked inputs have their outcome
//! pinned: which messages decode and the exact error that ends the stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod decode_checks;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use decode_checks::{check_input, Outcome, Outcomes};
use tether_protocol::{Capabilities, Hello, HelloOk, Request, Response};

/// Fewer files than this means the directory was emptied or not found in
/// full; either way the regression suite would silently shrink.
const MIN_INPUTS: usize = 12;

/// How each `tether_protocol::Error` variant the decoder can end a stream with begins when
/// displayed. Every refusal must be one of them, followed by its details:
/// a clear, named problem.
const NAMED_PROBLEMS: [&str; 5] = [
    "frame of ",
    "truncated frame: ",
    "malformed message: ",
    "unknown request type ",
    "unknown response type ",
];

fn regression_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions")
}

/// Every regression input, by file name, in name order. Panics when the
/// directory is missing, unreadable or holds too few files, so that a wrong
/// path cannot make the suite pass by replaying nothing.
fn inputs() -> Vec<(String, Vec<u8>)> {
    let dir = regression_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "cannot read the regression inputs in {}: {e}",
            dir.display()
        )
    });
    let mut inputs: Vec<(String, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    inputs.sort();
    assert!(
        inputs.len() >= MIN_INPUTS,
        "{} holds {} inputs, expected at least {MIN_INPUTS}",
        dir.display(),
        inputs.len()
    );
    inputs
}

fn input(name: &str) -> Vec<u8> {
    let path = regression_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

impl<T> Outcome<T> {
    fn messages(messages: Vec<T>) -> Self {
        Self {
            messages,
            error: None,
        }
    }

    fn refused(messages: Vec<T>, error: &str) -> Self {
        Self {
            messages,
            error: Some(error.to_owned()),
        }
    }
}

/// The error text, when it is not one of the decoder's named problems.
fn unnamed_problem<T>(outcome: &Outcome<T>) -> Option<&str> {
    let error = outcome.error.as_deref()?;
    let named = NAMED_PROBLEMS.iter().any(|p| {
        error
            .strip_prefix(p)
            .is_some_and(|detail| !detail.trim().is_empty())
    });
    (!named).then_some(error)
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn the_regression_directory_exists_and_is_not_empty() {
    let inputs = inputs();
    assert!(
        inputs.iter().any(|(_, bytes)| bytes.len() > 1),
        "every regression input is empty"
    );
}

#[test]
fn every_regression_input_passes_the_decode_fuzz_checks() {
    let mut failures = Vec::new();
    for (name, bytes) in inputs() {
        match catch_unwind(AssertUnwindSafe(|| check_input(&bytes))) {
            Err(panic) => failures.push(format!("{name}: panicked: {}", panic_text(&*panic))),
            Ok(None) => {}
            Ok(Some(outcomes)) => {
                if let Some(error) = unnamed_problem(&outcomes.server) {
                    failures.push(format!("{name}: daemon side, unclear error {error:?}"));
                }
                if let Some(error) = unnamed_problem(&outcomes.client) {
                    failures.push(format!("{name}: client side, unclear error {error:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Decodes a hand-picked input on both sides.
fn outcomes(name: &str) -> Outcomes {
    check_input(&input(name)).unwrap_or_else(|| panic!("{name} is empty"))
}

const UNEXPECTED_END: &str = "malformed message: Hit the end of buffer, expected more data";

#[test]
fn a_length_prefix_over_the_limit_is_refused_before_any_body_arrives() {
    let huge = "frame of 4294967295 bytes exceeds the maximum of 65536 bytes";
    let o = outcomes("length-prefix-4GiB.bin");
    assert_eq!(o.server, Outcome::refused(vec![], huge));
    assert_eq!(o.client, Outcome::refused(vec![], huge));

    let one_over = "frame of 65537 bytes exceeds the maximum of 65536 bytes";
    let o = outcomes("length-prefix-one-over-limit.bin");
    assert_eq!(o.server, Outcome::refused(vec![], one_over));
    assert_eq!(o.client, Outcome::refused(vec![], one_over));
}

#[test]
fn a_frame_of_exactly_the_limit_is_awaited_and_reported_truncated_at_eof() {
    let o = outcomes("length-prefix-at-limit-then-eof.bin");
    let truncated = "truncated frame: the connection ended after 14 of 65540 bytes";
    assert_eq!(o.server, Outcome::refused(vec![], truncated));
    assert_eq!(o.client, Outcome::refused(vec![], truncated));
}

#[test]
fn a_stream_cut_short_names_how_much_of_the_frame_arrived() {
    let o = outcomes("truncated-length-prefix.bin");
    let prefix = "truncated frame: the connection ended after 2 of 4 bytes";
    assert_eq!(o.server, Outcome::refused(vec![], prefix));

    let o = outcomes("truncated-hello.bin");
    let hello = "truncated frame: the connection ended after 11 of 20 bytes";
    assert_eq!(o.server, Outcome::refused(vec![], hello));
    assert_eq!(o.client, Outcome::refused(vec![], hello));
}

#[test]
fn bodies_that_are_not_messages_are_malformed_with_the_reason() {
    let cases = [
        ("zero-length-frame.bin", UNEXPECTED_END),
        ("nested-length-overflow.bin", UNEXPECTED_END),
        ("huge-vec-length.bin", UNEXPECTED_END),
        (
            "invalid-utf8-stream-name.bin",
            "malformed message: Tried to parse invalid utf-8",
        ),
        (
            "varint-never-terminates.bin",
            "malformed message: Found a varint that didn't terminate. \
             Is the usize too big for this platform?",
        ),
        (
            "bool-out-of-range.bin",
            "malformed message: Found a bool that wasn't 0 or 1",
        ),
        (
            "option-tag-out-of-range.bin",
            "malformed message: Found an Option discriminant that wasn't 0 or 1",
        ),
        // A Status request with junk after it: refused, not taken for
        // the message it begins with.
        (
            "trailing-bytes-inside-frame.bin",
            "malformed message: 2 bytes left over after a Request message",
        ),
        // A message type past the last known one: a newer peer.
        (
            "unknown-variant.bin",
            "unknown request type 127: this build knows types 0 to 42; \
             the peer is newer than this build",
        ),
    ];
    for (name, error) in cases {
        let o = outcomes(name);
        assert_eq!(o.server, Outcome::refused(vec![], error), "{name}");
    }
}

#[test]
fn an_error_code_wider_than_u16_is_malformed_for_the_client() {
    let o = outcomes("error-code-over-u16.bin");
    assert_eq!(
        o.client,
        Outcome::refused(
            vec![],
            "malformed message: Found a varint that didn't terminate. \
             Is the usize too big for this platform?"
        )
    );
}

#[test]
fn a_hello_of_another_version_decodes_for_the_session_to_refuse() {
    // Judging the version is the daemon's job: the codec must hand the
    // Hello over intact so that the refusal can name the version.
    let o = outcomes("hello-version-999.bin");
    let hello = Request::Hello(Hello {
        version: 999,
        capabilities: Capabilities::NONE,
        client: "test".into(),
    });
    assert_eq!(o.server, Outcome::messages(vec![hello]));
    let hello_ok = Response::HelloOk(HelloOk {
        version: 999,
        capabilities: Capabilities::NONE,
        daemon: "test".into(),
    });
    assert_eq!(o.client, Outcome::messages(vec![hello_ok]));
}

#[test]
fn messages_before_a_bad_frame_are_delivered_and_the_bad_one_ends_the_stream() {
    let o = outcomes("valid-frame-then-4GiB-prefix.bin");
    assert_eq!(
        o.server,
        Outcome::refused(
            vec![Request::ListStreams],
            "frame of 4294967295 bytes exceeds the maximum of 65536 bytes"
        )
    );
}

#[test]
fn one_byte_reads_decode_the_same_frames_as_one_big_read() {
    let o = outcomes("fifty-frames-byte-by-byte.bin");
    assert_eq!(o.server, Outcome::messages(vec![Request::Status; 50]));
}
