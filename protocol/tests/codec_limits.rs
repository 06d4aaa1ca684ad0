//! The codec's edges: oversized, truncated and malformed frames, encode
//! limits, reading the version of a `Hello` from a newer peer, and name
//! validation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use serde::Serialize;
use tether_protocol::codec::{
    decode_append_view, decode_wire_message, encode_frame, peek_hello_version, peek_kind,
};
use tether_protocol::{
    validate_name, Append, AppendView, Capabilities, ClientCodec, DurableAck, Error, FrameKind,
    Hello, Message, Request, Response, ServerCodec, Subscribed, DEFAULT_MAX_FRAME_LEN,
    MAX_NAME_LEN, PROTOCOL_VERSION,
};
use tokio_util::codec::{Decoder, Encoder};

fn hello() -> Request {
    Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::DURABLE,
        client: "tether test".into(),
    })
}

fn append(payload_len: usize) -> Request {
    Request::Append(Append {
        stream: "jobs".into(),
        producer: "p1".into(),
        producer_seq: 7,
        kind: FrameKind::Data,
        payload: Bytes::from(vec![b'x'; payload_len]),
    })
}

/// A frame whose length prefix says `len` but whose body is `body`.
fn raw_frame(len: u32, body: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(4 + body.len());
    buf.put_u32(len);
    buf.extend_from_slice(body);
    buf
}

/// A well-formed frame carrying `body` as is.
fn frame_of(body: &[u8]) -> BytesMut {
    raw_frame(u32::try_from(body.len()).unwrap(), body)
}

fn assert_too_large(result: Result<Option<Request>, Error>, want_len: usize, want_max: usize) {
    match result {
        Err(Error::FrameTooLarge { len, max }) => {
            assert_eq!((len, max), (want_len, want_max));
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
}

fn assert_malformed<T: std::fmt::Debug>(result: Result<Option<T>, Error>) {
    match result {
        Err(Error::Malformed(_)) => {}
        other => panic!("expected Malformed, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Oversized frames
// ---------------------------------------------------------------------------

#[test]
fn over_limit_prefix_is_refused_before_the_buffer_grows() {
    let max = 1024;
    let announced = 1_000_000;
    let mut codec = ServerCodec::with_max_frame_len(max);
    let mut src = raw_frame(announced, b"abc");
    let capacity_before = src.capacity();

    assert_too_large(codec.decode(&mut src), announced as usize, max);
    assert_eq!(src.capacity(), capacity_before);
    assert!(src.capacity() < announced as usize);
}

#[test]
fn one_byte_over_the_default_limit_is_refused_without_allocating() {
    let announced = DEFAULT_MAX_FRAME_LEN + 1;
    let mut codec = ServerCodec::new();
    let mut src = raw_frame(u32::try_from(announced).unwrap(), &[]);
    let capacity_before = src.capacity();

    assert_too_large(codec.decode(&mut src), announced, DEFAULT_MAX_FRAME_LEN);
    assert_eq!(src.capacity(), capacity_before);
}

#[test]
fn all_ones_prefix_is_refused_without_allocating() {
    let mut codec = ServerCodec::new();
    let mut src = BytesMut::from(&[0xFF, 0xFF, 0xFF, 0xFF, 0x00][..]);
    let capacity_before = src.capacity();

    assert_too_large(
        codec.decode(&mut src),
        u32::MAX as usize,
        DEFAULT_MAX_FRAME_LEN,
    );
    assert_eq!(src.capacity(), capacity_before);
}

#[test]
fn client_codec_refuses_oversized_responses_too() {
    let mut codec = ClientCodec::with_max_frame_len(16);
    let mut src = raw_frame(17, &[0; 17]);
    let capacity_before = src.capacity();
    match codec.decode(&mut src) {
        Err(Error::FrameTooLarge { len: 17, max: 16 }) => {}
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    assert_eq!(src.capacity(), capacity_before);
}

#[test]
fn a_frame_exactly_at_the_limit_is_accepted() {
    let msg = append(100);
    let frame = encode_frame(&msg).unwrap();
    let body_len = frame.len() - 4;

    let mut src = frame.clone();
    let decoded = ServerCodec::with_max_frame_len(body_len)
        .decode(&mut src)
        .unwrap();
    assert_eq!(decoded, Some(msg));

    let mut src = frame;
    assert_too_large(
        ServerCodec::with_max_frame_len(body_len - 1).decode(&mut src),
        body_len,
        body_len - 1,
    );
}

#[test]
fn a_limit_beyond_u32_is_clamped_to_what_the_prefix_can_express() {
    let codec = ServerCodec::with_max_frame_len(usize::MAX);
    assert_eq!(codec.max_frame_len(), u32::MAX as usize);
    assert_eq!(ServerCodec::new().max_frame_len(), DEFAULT_MAX_FRAME_LEN);
    assert_eq!(
        ServerCodec::default().max_frame_len(),
        DEFAULT_MAX_FRAME_LEN
    );
    assert_eq!(
        ServerCodec::with_max_frame_len(99).clone().max_frame_len(),
        99
    );
}

// ---------------------------------------------------------------------------
// Truncated frames
// ---------------------------------------------------------------------------

/// Every strict prefix of a frame, including a partial length prefix, is an
/// expected condition: `Ok(None)`, and nothing is consumed.
#[test]
fn every_truncation_of_a_frame_is_incomplete_not_an_error() {
    for msg in [hello(), append(300), Request::ListStreams] {
        let frame = encode_frame(&msg).unwrap();
        for cut in 0..frame.len() {
            let mut src = BytesMut::from(&frame[..cut]);
            let result = ServerCodec::new().decode(&mut src);
            assert!(
                matches!(result, Ok(None)),
                "cut at {cut}/{}: {result:?}",
                frame.len()
            );
            assert_eq!(&src[..], &frame[..cut], "bytes consumed at cut {cut}");
        }
    }
}

#[test]
fn a_stream_ending_inside_a_frame_is_truncated() {
    let frame = encode_frame(&hello()).unwrap();
    let mut src = BytesMut::from(&frame[..frame.len() - 1]);
    match ServerCodec::new().decode_eof(&mut src) {
        Err(Error::Truncated { received, expected }) => {
            assert_eq!((received, expected), (frame.len() - 1, frame.len()));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
}

#[test]
fn a_stream_ending_inside_the_length_prefix_is_truncated() {
    let mut src = BytesMut::from(&[0x00, 0x00][..]);
    match ClientCodec::new().decode_eof(&mut src) {
        Err(Error::Truncated {
            received: 2,
            expected: 4,
        }) => {}
        other => panic!("expected Truncated, got {other:?}"),
    }
}

#[test]
fn a_stream_ending_on_a_frame_boundary_is_clean() {
    let mut src = encode_frame(&hello()).unwrap();
    let mut codec = ServerCodec::new();
    assert_eq!(codec.decode_eof(&mut src).unwrap(), Some(hello()));
    assert_eq!(codec.decode_eof(&mut src).unwrap(), None);
}

#[test]
fn an_incomplete_frame_reserves_only_what_it_still_needs() {
    let max = 4096;
    let mut src = raw_frame(1000, &[0; 10]);
    assert!(matches!(
        ServerCodec::with_max_frame_len(max).decode(&mut src),
        Ok(None)
    ));
    // Room for the rest of this frame, and not unboundedly more.
    assert!(src.capacity() >= 4 + 1000);
    assert!(src.capacity() < 4 * (4 + 1000));
}

/// A peer that declares a large frame and sends little of it gets a
/// buffer the size of what it sent, not of what it declared; as the rest
/// arrives the buffer grows in steps (each at least doubling, so few
/// copies), never past the frame's end, and the frame decodes whole.
#[test]
fn a_large_frame_grows_the_buffer_only_as_it_arrives() {
    let msg = append(16 << 20);
    let wire = encode_frame(&msg).unwrap();
    let mut codec = ServerCodec::with_max_frame_len(32 << 20);
    let mut src = BytesMut::from(&wire[..10]);
    let mut sent = 10;
    let mut growths = 0;
    loop {
        let before = src.capacity();
        match codec.decode(&mut src).unwrap() {
            Some(decoded) => {
                assert_eq!(decoded, msg);
                break;
            }
            None => {
                assert!(src.capacity() <= wire.len(), "past the frame's end");
                assert!(
                    src.capacity() <= 2 * sent + 64 * 1024,
                    "{} bytes reserved for {sent} arrived",
                    src.capacity()
                );
                growths += usize::from(src.capacity() != before);
            }
        }
        // What a read brings: the room there is, as a socket full of the
        // frame would fill it.
        let room = src.capacity() - src.len();
        let piece = &wire[sent..(sent + room).min(wire.len())];
        src.extend_from_slice(piece);
        sent += piece.len();
    }
    assert!(growths < 16, "{growths} steps for 16 MiB");
}

#[test]
fn the_kind_of_a_message_is_known_from_its_first_bytes() {
    let body = &encode_frame(&append(1000)).unwrap()[4..];
    assert_eq!(peek_kind(&body[..1]).unwrap(), Some(Request::APPEND_KIND));
    assert_eq!(peek_kind(&[]).unwrap(), None);
    // A varint that goes on: more must arrive.
    assert_eq!(peek_kind(&[0x81]).unwrap(), None);
    assert_eq!(peek_kind(&[0x81, 0x01]).unwrap(), Some(129));
    assert!(matches!(peek_kind(&[0xFF; 6]), Err(Error::Malformed(_))));
}

// ---------------------------------------------------------------------------
// Malformed bodies
// ---------------------------------------------------------------------------

#[test]
fn an_empty_body_is_malformed() {
    assert_malformed(ServerCodec::new().decode(&mut frame_of(&[])));
    assert_malformed(ClientCodec::new().decode(&mut frame_of(&[])));
}

#[test]
fn an_unknown_variant_is_malformed() {
    assert_malformed(ServerCodec::new().decode(&mut frame_of(&[200])));
    assert_malformed(ClientCodec::new().decode(&mut frame_of(&[200])));
}

#[test]
fn an_overlong_varint_is_malformed() {
    assert_malformed(ServerCodec::new().decode(&mut frame_of(&[0xFF; 12])));
    assert_malformed(ClientCodec::new().decode(&mut frame_of(&[0xFF; 12])));
}

#[test]
fn a_message_cut_short_inside_its_frame_is_malformed() {
    let frame = encode_frame(&append(50)).unwrap();
    let body = &frame[4..frame.len() - 10];
    assert_malformed(ServerCodec::new().decode(&mut frame_of(body)));
}

#[test]
fn invalid_utf8_in_a_string_is_malformed() {
    // Hello: variant 0, version 1, capabilities 0, client = 2 bytes of non-UTF-8.
    let body = [0x00, 0x01, 0x00, 0x02, 0xC3, 0x28];
    assert_malformed(ServerCodec::new().decode(&mut frame_of(&body)));
}

#[test]
fn an_invalid_bool_is_malformed() {
    // DurableResume: variant 3, stream "s", acked_through 0, follow = 2.
    let body = [0x03, 0x01, b's', 0x00, 0x02, 0x00];
    assert_malformed(ServerCodec::new().decode(&mut frame_of(&body)));
}

/// A malformed frame is consumed whole, so the stream position stays on a
/// frame boundary (the connection is closed anyway, but nothing downstream
/// may see half a frame).
#[test]
fn a_malformed_frame_is_consumed_whole() {
    // DurableResume with an invalid bool (see above).
    let mut src = frame_of(&[0x03, 0x01, b's', 0x00, 0x02, 0x00]);
    let next = encode_frame(&Request::Status).unwrap();
    src.extend_from_slice(&next);
    assert_malformed(ServerCodec::new().decode(&mut src));
    assert_eq!(&src[..], &next[..]);
}

/// A frame holding a message and then more bytes is refused, naming the
/// leftover: it is a layout this build does not know. The length prefix,
/// not the parser, decides where the next frame starts.
#[test]
fn trailing_bytes_in_a_frame_are_refused_and_do_not_leak_into_the_next_frame() {
    let mut body = encode_frame(&Request::Status).unwrap()[4..].to_vec();
    body.extend_from_slice(&encode_frame(&Request::ListStreams).unwrap()[4..]);
    let mut src = frame_of(&body);
    src.extend_from_slice(&encode_frame(&hello()).unwrap());

    let mut codec = ServerCodec::new();
    let err = codec.decode(&mut src).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed message: 1 bytes left over after a Request message"
    );
    assert_eq!(codec.decode(&mut src).unwrap(), Some(hello()));
    assert!(src.is_empty());
}

/// A message type past the last one this build knows comes from a newer
/// peer: the error says so instead of "malformed".
#[test]
fn an_unknown_message_type_is_named_as_one_from_a_newer_peer() {
    let mut src = frame_of(&[Request::KINDS as u8, 0, 0]);
    let err = ServerCodec::new().decode(&mut src).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "unknown request type {}: this build knows types 0 to {}; the peer is newer than this build",
            Request::KINDS,
            Request::KINDS - 1
        )
    );
    // A known type with a body cut short (StepPut, 16) is malformed, not
    // unknown.
    let mut src = frame_of(&[16]);
    assert_malformed(ServerCodec::new().decode(&mut src));
}

#[test]
fn a_request_is_not_a_response() {
    // DurableAck is Request variant 4 but Response variant 4 is Durable,
    // whose body is longer: the bytes must not be mistaken for one.
    let frame = encode_frame(&Request::DurableAck(DurableAck { through_seq: 5 })).unwrap();
    assert_malformed(ClientCodec::new().decode(&mut BytesMut::from(&frame[..])));
}

// ---------------------------------------------------------------------------
// Appends read in place
// ---------------------------------------------------------------------------

#[test]
fn an_append_read_in_place_has_the_fields_it_was_sent_with() {
    let body = body_of(&append(3));
    assert_eq!(
        decode_append_view(&body).unwrap(),
        Some(AppendView {
            stream: "jobs",
            producer: "p1",
            producer_seq: 7,
            kind: FrameKind::Data,
            payload: b"xxx",
        })
    );
    assert_eq!(u32::from(body[0]), Request::APPEND_KIND);
}

#[test]
fn other_requests_are_not_read_as_appends() {
    for request in [hello(), Request::Status, Request::ListStreams] {
        assert_eq!(decode_append_view(&body_of(&request)).unwrap(), None);
    }
    // Not even a variant index: left for the full decoder to name.
    assert_eq!(decode_append_view(&[]).unwrap(), None);
    assert_eq!(decode_append_view(&[0xFF; 12]).unwrap(), None);
}

/// A bad append is refused in place with the error the full decoder gives.
#[test]
fn a_bad_append_read_in_place_fails_as_the_full_decoder_does() {
    let mut trailing = body_of(&append(3));
    trailing.push(0);
    let cut = body_of(&append(50));
    let cut = &cut[..cut.len() - 10];
    // Append: variant 1, stream = 2 bytes of non-UTF-8.
    let bad_utf8 = [0x01, 0x02, 0xC3, 0x28, 0x01, b'p', 0x01, 0x00, 0x00];
    for body in [&trailing[..], cut, &bad_utf8[..]] {
        let in_place = decode_append_view(body).unwrap_err().to_string();
        let full = decode_wire_message::<Request>(body)
            .unwrap_err()
            .to_string();
        assert_eq!(in_place, full);
    }
    assert_eq!(
        decode_append_view(&trailing).unwrap_err().to_string(),
        "malformed message: 1 bytes left over after a Request message"
    );
}

proptest! {
    /// Every append reads in place as the fields it was encoded from.
    #[test]
    fn any_append_reads_in_place_as_it_was_sent(
        stream in "\\PC{1,20}",
        producer in "\\PC{1,20}",
        producer_seq in any::<u64>(),
        event in any::<bool>(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let kind = if event { FrameKind::Event } else { FrameKind::Data };
        let request = Request::Append(Append {
            stream: stream.clone(),
            producer: producer.clone(),
            producer_seq,
            kind,
            payload: Bytes::from(payload.clone()),
        });
        let body = body_of(&request);
        let view = decode_append_view(&body).unwrap().unwrap();
        prop_assert_eq!(view, AppendView {
            stream: &stream,
            producer: &producer,
            producer_seq,
            kind,
            payload: &payload,
        });
    }

    /// Arbitrary bytes never panic the in-place reader either.
    #[test]
    fn arbitrary_bytes_never_panic_the_in_place_reader(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_append_view(&bytes);
    }

    /// Arbitrary bytes never panic the decoders; they yield messages, wait
    /// for more, or fail with a framing or parse error.
    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for max in [16, 1024] {
            let mut src = BytesMut::from(&bytes[..]);
            let mut codec = ServerCodec::with_max_frame_len(max);
            while let Ok(Some(_)) = codec.decode(&mut src) {}
            let mut src = BytesMut::from(&bytes[..]);
            let mut codec = ClientCodec::with_max_frame_len(max);
            while let Ok(Some(_)) = codec.decode(&mut src) {}
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding limits
// ---------------------------------------------------------------------------

#[test]
fn encoding_an_over_limit_message_fails_and_leaves_dst_unchanged() {
    let mut codec = ClientCodec::with_max_frame_len(64);
    let mut dst = BytesMut::new();
    codec.encode(Request::Status, &mut dst).unwrap();
    let before = dst.clone();

    match codec.encode(append(1000), &mut dst) {
        Err(Error::FrameTooLarge { len, max: 64 }) => assert!(len > 1000),
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    assert_eq!(dst, before);

    // The codec is still usable afterwards.
    codec.encode(Request::ListStreams, &mut dst).unwrap();
    let mut decoder = ServerCodec::new();
    assert_eq!(decoder.decode(&mut dst).unwrap(), Some(Request::Status));
    assert_eq!(
        decoder.decode(&mut dst).unwrap(),
        Some(Request::ListStreams)
    );
}

#[test]
fn the_server_encoder_enforces_its_limit_too() {
    let mut codec = ServerCodec::with_max_frame_len(3);
    let mut dst = BytesMut::from(&b"keep"[..]);
    let msg = Response::Subscribed(Subscribed {
        first_seq: 1,
        last_seq: u64::MAX,
    });
    assert!(matches!(
        codec.encode(msg, &mut dst),
        Err(Error::FrameTooLarge { max: 3, .. })
    ));
    assert_eq!(&dst[..], b"keep");
}

#[test]
fn the_encode_limit_is_inclusive() {
    let msg = append(10);
    let body_len = encode_frame(&msg).unwrap().len() - 4;
    let mut dst = BytesMut::new();
    ClientCodec::with_max_frame_len(body_len)
        .encode(msg, &mut dst)
        .unwrap();
    assert_eq!(dst.len(), 4 + body_len);
}

// ---------------------------------------------------------------------------
// Version negotiation with peers of other versions
// ---------------------------------------------------------------------------

/// What a later protocol version's `Hello` might look like: the same leading
/// `version`, then fields this build has never heard of.
#[derive(Serialize, Debug)]
struct FutureHello {
    version: u32,
    capabilities: u64,
    client: String,
    session_token: Option<[u8; 16]>,
    labels: Vec<(String, String)>,
}

/// A later request enum: `Hello` stays variant 0, others may be added.
#[derive(Serialize, Debug)]
enum FutureRequest {
    Hello(FutureHello),
    #[allow(dead_code)]
    Other(u8),
}

/// A later `Hello` whose fields after `version` were replaced entirely.
#[derive(Serialize, Debug)]
enum RedesignedRequest {
    Hello { version: u32, nonce: u128 },
}

fn body_of<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).unwrap()
}

#[test]
fn peek_reads_the_version_of_a_current_hello() {
    let frame = encode_frame(&hello()).unwrap();
    assert_eq!(peek_hello_version(&frame[4..]), Some(PROTOCOL_VERSION));
}

#[test]
fn peek_reads_the_version_of_a_future_hello_with_extra_fields() {
    let body = body_of(&FutureRequest::Hello(FutureHello {
        version: 7,
        capabilities: u64::MAX,
        client: "tether 9.0".into(),
        session_token: Some([0xAB; 16]),
        labels: vec![("zone".into(), "eu".into())],
    }));
    assert_eq!(peek_hello_version(&body), Some(7));
}

#[test]
fn peek_reads_the_version_of_a_redesigned_hello() {
    let body = body_of(&RedesignedRequest::Hello {
        version: 300_000,
        nonce: u128::MAX,
    });
    assert_eq!(peek_hello_version(&body), Some(300_000));
    let body = body_of(&RedesignedRequest::Hello {
        version: u32::MAX,
        nonce: 0,
    });
    assert_eq!(peek_hello_version(&body), Some(u32::MAX));
}

#[test]
fn peek_returns_none_for_other_requests() {
    for msg in [
        append(3),
        Request::ListStreams,
        Request::Status,
        Request::DurableAck(DurableAck { through_seq: 0 }),
    ] {
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(peek_hello_version(&frame[4..]), None, "{msg:?}");
    }
}

#[test]
fn peek_returns_none_for_bodies_without_a_version() {
    assert_eq!(peek_hello_version(&[]), None);
    // Variant 0 but the version varint is missing or unterminated.
    assert_eq!(peek_hello_version(&[0x00]), None);
    assert_eq!(peek_hello_version(&[0x00, 0x80]), None);
    // A varint too long for a u32.
    assert_eq!(
        peek_hello_version(&[0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
        None
    );
}

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

#[test]
fn ordinary_names_are_accepted() {
    let longest = "n".repeat(MAX_NAME_LEN);
    for name in [
        "a",
        "jobs",
        "build-42.log",
        "team/app:stderr",
        "données",
        "日本",
        "emoji-🚀",
        longest.as_str(),
    ] {
        validate_name("stream", name).unwrap();
    }
}

#[test]
fn names_the_doc_forbids_are_refused_with_the_reason() {
    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    // 128 two-byte characters: 128 chars but 256 bytes. The limit is bytes.
    let too_long_in_bytes = "é".repeat(128);
    let cases: &[(&str, &str)] = &[
        ("", "it is empty"),
        (&too_long, "it is longer than 255 bytes"),
        (&too_long_in_bytes, "it is longer than 255 bytes"),
        ("a b", "it contains whitespace or control characters"),
        (" lead", "it contains whitespace or control characters"),
        ("trail\n", "it contains whitespace or control characters"),
        ("tab\there", "it contains whitespace or control characters"),
        ("nul\0", "it contains whitespace or control characters"),
        ("del\u{7f}", "it contains whitespace or control characters"),
        (
            "esc\u{1b}[31m",
            "it contains whitespace or control characters",
        ),
        ("nbsp\u{a0}", "it contains whitespace or control characters"),
        (
            "line\u{2028}sep",
            "it contains whitespace or control characters",
        ),
        ("c1\u{85}", "it contains whitespace or control characters"),
    ];
    for &(name, want_why) in cases {
        match validate_name("consumer", name) {
            Err(Error::InvalidName {
                what: "consumer",
                name: got,
                why,
            }) => {
                assert_eq!(got, name);
                assert_eq!(why, want_why, "for {name:?}");
            }
            other => panic!("{name:?}: expected InvalidName, got {other:?}"),
        }
    }
}

#[test]
fn an_invalid_name_error_names_the_kind_and_the_name() {
    let err = validate_name("producer", "a b").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("producer"), "{text}");
    assert!(text.contains("\"a b\""), "{text}");
    assert!(text.contains("whitespace"), "{text}");
}

proptest! {
    /// Any name of 1..=255 bytes without whitespace or control characters
    /// is accepted, and adding one such character makes it refused.
    #[test]
    fn validate_name_matches_its_doc(
        base in "[^\\s\\p{Cc}]{1,60}",
        bad in prop_oneof![Just(' '), Just('\t'), Just('\n'), Just('\r'), Just('\0'), Just('\u{7f}'), Just('\u{3000}')],
        at in any::<prop::sample::Index>(),
    ) {
        let expect_ok = base.len() <= MAX_NAME_LEN;
        prop_assert_eq!(validate_name("stream", &base).is_ok(), expect_ok);

        let chars: Vec<char> = base.chars().collect();
        let i = at.index(chars.len() + 1);
        let mut broken: String = chars[..i].iter().collect();
        broken.push(bad);
        broken.extend(&chars[i..]);
        prop_assert!(validate_name("stream", &broken).is_err());
    }
}
