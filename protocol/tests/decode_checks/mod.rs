//! The decoder fuzz target's checks, shared by the target itself
//! (`fuzz/fuzz_targets/decode.rs`, which includes this file by path: the
//! fuzz crate is not a workspace member) and by the regression test
//! `tests/fuzz_regressions.rs`, which replays saved inputs through them.
//!
//! An input's first byte picks how the rest is split into reads; the rest
//! is the byte stream. Both decoders drain the stream until it errors
//! (where a real connection would be closed) or the bytes run out.
//! Properties checked:
//!
//! * nothing panics, whatever the bytes;
//! * the split does not matter: one big read and many small reads yield the
//!   same messages and the same error;
//! * every decoded message re-encodes, decodes back equal, and its encoding
//!   is stable (encoding the decoded copy gives the same bytes again).

use std::fmt::Debug;

use bytes::BytesMut;
use tether_protocol::{ClientCodec, Error, Request, Response, ServerCodec};
use tokio_util::codec::{Decoder, Encoder};

/// Small enough that hostile length prefixes hit the limit often, large
/// enough for any input libFuzzer generates to hold several whole frames.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// What a decoder made of a whole stream: the messages in order, then the
/// error that ended it, if any.
#[derive(Debug, PartialEq)]
pub struct Outcome<T> {
    pub messages: Vec<T>,
    pub error: Option<String>,
}

/// What both sides made of one input: the daemon's decoder (requests) and
/// the client's (responses). `None` for an empty input, which the fuzz
/// target skips.
#[derive(Debug)]
pub struct Outcomes {
    pub server: Outcome<Request>,
    pub client: Outcome<Response>,
}

/// The body of the decode fuzz target, returning what it saw.
pub fn check_input(data: &[u8]) -> Option<Outcomes> {
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
    let mut outcome = Outcome {
        messages: Vec::new(),
        error: None,
    };
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
