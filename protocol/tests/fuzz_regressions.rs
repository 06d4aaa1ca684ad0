//! Regression inputs for the decoder fuzz target, replayed on every test run.
//!
//! Every file in `tests/fuzz_regressions/` is one input in the format of
//! `fuzz/fuzz_targets/decode.rs`: the first byte picks how the rest is split
//! into reads, the rest is the byte stream. A crash the fuzzer finds, once
//! minimized with `cargo fuzz tmin`, is copied into that directory under a
//! name saying what it is, and from then on guards against the bug here
//! without libFuzzer or a nightly toolchain (see `scripts/fuzz.sh`).
//!
//! [`check_input`] runs exactly the fuzz target's checks: both decoders
//! drain the stream, once in one read and once in seed-sized reads, must
//! agree, and every decoded message must re-encode and decode back equal
//! with a stable encoding. The fuzz crate is not a workspace member (it
//! needs libFuzzer), so the checks are repeated here rather than shared;
//! the two must change together.
//!
//! On top of "never panics", the hand-picked inputs have their outcome
//! pinned: which messages decode and the exact error that ends the stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use tether_protocol::{
    Capabilities, ClientCodec, Error, Hello, HelloOk, Request, Response, ServerCodec,
};
use tokio_util::codec::{Decoder, Encoder};

/// The fuzz target's frame limit: hostile length prefixes meet it often.
const MAX_FRAME_LEN: usize = 64 * 1024;

/// Fewer files than this means the directory was emptied or not found in
/// full; either way the regression suite would silently shrink.
const MIN_INPUTS: usize = 12;

/// How each [`Error`] variant the decoder can end a stream with begins when
/// displayed. Every refusal must be one of them, followed by its details:
/// a clear, named problem.
const NAMED_PROBLEMS: [&str; 3] = ["frame of ", "truncated frame: ", "malformed message: "];

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

// ---------------------------------------------------------------------------
// The fuzz target's checks
// ---------------------------------------------------------------------------

/// What a decoder made of a whole stream: the messages in order, then the
/// error that ended it, if any.
#[derive(Debug, PartialEq)]
struct Outcome<T> {
    messages: Vec<T>,
    error: Option<String>,
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

/// What both sides made of one input: the daemon's decoder (requests) and
/// the client's (responses). `None` for an empty input, which the fuzz
/// target skips.
#[derive(Debug)]
struct Outcomes {
    server: Outcome<Request>,
    client: Outcome<Response>,
}

/// The body of the decode fuzz target, returning what it saw.
fn check_input(data: &[u8]) -> Option<Outcomes> {
    let (&seed, stream) = data.split_first()?;
    let server = check_stream(
        stream,
        seed,
        || ServerCodec::with_max_frame_len(MAX_FRAME_LEN),
        ClientCodec::new,
        ServerCodec::new,
    );
    let client = check_stream(
        stream,
        seed,
        || ClientCodec::with_max_frame_len(MAX_FRAME_LEN),
        ServerCodec::new,
        ClientCodec::new,
    );
    Some(Outcomes { server, client })
}

/// Runs the stream through a fresh decoder twice (one read, then reads
/// sized from `seed`), requires both to agree, and round-trips every
/// message through the peer's encoder and a fresh decoder.
fn check_stream<T, D, E>(
    stream: &[u8],
    seed: u8,
    decoder: impl Fn() -> D,
    peer_encoder: impl Fn() -> E,
    fresh_decoder: impl Fn() -> D,
) -> Outcome<T>
where
    T: PartialEq + Debug + Clone,
    D: Decoder<Item = T, Error = Error>,
    E: Encoder<T, Error = Error>,
{
    let whole = run(decoder(), stream, std::iter::repeat(stream.len().max(1)));
    let split = run(decoder(), stream, ChunkSizes::new(seed));
    assert_eq!(whole, split, "the read boundaries changed the result");

    for message in &whole.messages {
        let first = encode(peer_encoder(), message);
        let mut src = first.clone();
        let again = fresh_decoder()
            .decode(&mut src)
            .unwrap_or_else(|e| panic!("re-encoded {message:?} does not decode: {e}"));
        assert_eq!(again.as_ref(), Some(message), "round trip changed it");
        assert!(src.is_empty(), "re-encoded frame has leftover bytes");
        let second = encode(peer_encoder(), message);
        assert_eq!(first, second, "encoding is not deterministic");
    }
    whole
}

fn encode<T: Clone + Debug, E: Encoder<T, Error = Error>>(mut encoder: E, message: &T) -> BytesMut {
    let mut dst = BytesMut::new();
    encoder
        .encode(message.clone(), &mut dst)
        .unwrap_or_else(|e| panic!("decoded {message:?} does not re-encode: {e}"));
    dst
}

/// Feeds `stream` to `decoder` in reads of the given sizes, draining it
/// after each read the way a framed reader does, then signals end of stream.
fn run<T, D>(mut decoder: D, stream: &[u8], sizes: impl IntoIterator<Item = usize>) -> Outcome<T>
where
    D: Decoder<Item = T, Error = Error>,
{
    let mut outcome = Outcome::messages(Vec::new());
    let mut src = BytesMut::new();
    let mut rest = stream;
    let mut sizes = sizes.into_iter();
    while !rest.is_empty() {
        let size = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (read, tail) = rest.split_at(size);
        rest = tail;
        src.extend_from_slice(read);
        loop {
            match decoder.decode(&mut src) {
                Ok(Some(message)) => outcome.messages.push(message),
                Ok(None) => break,
                Err(e) => {
                    outcome.error = Some(e.to_string());
                    return outcome;
                }
            }
        }
    }
    loop {
        match decoder.decode_eof(&mut src) {
            Ok(Some(message)) => outcome.messages.push(message),
            Ok(None) => break,
            Err(e) => {
                outcome.error = Some(e.to_string());
                break;
            }
        }
    }
    outcome
}

/// The fuzz target's read sizes: a small linear congruential generator
/// seeded by the input's first byte. Seed 0 means one-byte reads.
#[derive(Debug)]
struct ChunkSizes {
    state: u32,
    max: usize,
}

impl ChunkSizes {
    fn new(seed: u8) -> Self {
        Self {
            state: u32::from(seed),
            max: 1 + usize::from(seed) * 4,
        }
    }
}

impl Iterator for ChunkSizes {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.state = self.state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        Some(1 + (self.state >> 16) as usize % self.max)
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
        // Postcard drops serde's own wording for an unknown variant.
        (
            "unknown-variant.bin",
            "malformed message: Serde Deserialization Error",
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
