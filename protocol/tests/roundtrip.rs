//! Every message survives the codec: encoded into a buffer, delivered in
//! arbitrary chunks and decoded incrementally, it comes back equal, and
//! several messages in one buffer come back in order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use tether_protocol::codec::{
    decode_durable_view, decode_message, encode_append, encode_durable, encode_frame, encode_live,
};
use tether_protocol::{
    Append, AppendView, Appended, Capabilities, ClientCodec, ConsumerInfo, Durable, DurableAck,
    DurableResume, ErrorCode, ErrorFrame, Frame, FrameKind, Gap, Hello, HelloOk, Request, Response,
    ServerCodec, StartAt, StatusInfo, StreamInfo, Subscribe, Subscribed,
};
use tokio_util::codec::{Decoder, Encoder};

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// Any string: the codec does not validate names, so it must carry whatever
/// it is given, including multi-byte and control characters.
fn text() -> impl Strategy<Value = String> {
    ".{0,40}"
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(text())
}

/// Payloads of a few KiB, enough to span many chunks and to need more than
/// one byte of varint length.
fn payload() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..4096).prop_map(Bytes::from)
}

fn capabilities() -> impl Strategy<Value = Capabilities> {
    any::<u64>().prop_map(Capabilities)
}

fn frame_kind() -> impl Strategy<Value = FrameKind> {
    prop_oneof![
        Just(FrameKind::Data),
        Just(FrameKind::Stdout),
        Just(FrameKind::Stderr),
        Just(FrameKind::Event),
        Just(FrameKind::User),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u64>(), frame_kind(), payload()).prop_map(|(ts_micros, kind, payload)| Frame {
        ts_micros,
        kind,
        payload,
    })
}

fn start_at() -> impl Strategy<Value = StartAt> {
    prop_oneof![
        Just(StartAt::Oldest),
        any::<u64>().prop_map(StartAt::Last),
        Just(StartAt::ConsumerAck),
        Just(StartAt::Now),
    ]
}

fn hello() -> impl Strategy<Value = Hello> {
    (any::<u32>(), capabilities(), text()).prop_map(|(version, capabilities, client)| Hello {
        version,
        capabilities,
        client,
    })
}

fn append() -> impl Strategy<Value = Append> {
    (text(), text(), any::<u64>(), frame_kind(), payload()).prop_map(
        |(stream, producer, producer_seq, kind, payload)| Append {
            stream,
            producer,
            producer_seq,
            kind,
            payload,
        },
    )
}

fn subscribe() -> impl Strategy<Value = Subscribe> {
    (text(), start_at(), any::<bool>(), opt_text()).prop_map(|(stream, start, follow, consumer)| {
        Subscribe {
            stream,
            start,
            follow,
            consumer,
        }
    })
}

fn durable_resume() -> impl Strategy<Value = DurableResume> {
    (text(), any::<u64>(), any::<bool>(), opt_text()).prop_map(
        |(stream, acked_through, follow, consumer)| DurableResume {
            stream,
            acked_through,
            follow,
            consumer,
        },
    )
}

fn durable_ack() -> impl Strategy<Value = DurableAck> {
    any::<u64>().prop_map(|through_seq| DurableAck { through_seq })
}

/// Every [`Request`] variant with every field drawn.
fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        hello().prop_map(Request::Hello),
        append().prop_map(Request::Append),
        subscribe().prop_map(Request::Subscribe),
        durable_resume().prop_map(Request::DurableResume),
        durable_ack().prop_map(Request::DurableAck),
        Just(Request::ListStreams),
        Just(Request::Status),
    ]
}

fn hello_ok() -> impl Strategy<Value = HelloOk> {
    (any::<u32>(), capabilities(), text()).prop_map(|(version, capabilities, daemon)| HelloOk {
        version,
        capabilities,
        daemon,
    })
}

/// Any `u16`, not just the named codes: a client must carry codes newer
/// than itself.
fn error_frame() -> impl Strategy<Value = ErrorFrame> {
    (any::<u16>(), text()).prop_map(|(code, message)| ErrorFrame {
        code: ErrorCode(code),
        message,
    })
}

fn appended() -> impl Strategy<Value = Appended> {
    (text(), text(), any::<u64>(), any::<u64>()).prop_map(
        |(stream, producer, producer_seq, seq)| Appended {
            stream,
            producer,
            producer_seq,
            seq,
        },
    )
}

fn subscribed() -> impl Strategy<Value = Subscribed> {
    (any::<u64>(), any::<u64>()).prop_map(|(first_seq, last_seq)| Subscribed {
        first_seq,
        last_seq,
    })
}

fn durable() -> impl Strategy<Value = Durable> {
    (any::<u64>(), frame()).prop_map(|(seq, frame)| Durable { seq, frame })
}

fn gap() -> impl Strategy<Value = Gap> {
    (any::<u64>(), any::<u64>()).prop_map(|(requested, first_available)| Gap {
        requested,
        first_available,
    })
}

fn consumer_info() -> impl Strategy<Value = ConsumerInfo> {
    (text(), any::<u64>()).prop_map(|(name, acked_through)| ConsumerInfo {
        name,
        acked_through,
    })
}

fn stream_info() -> impl Strategy<Value = StreamInfo> {
    (
        text(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        vec(consumer_info(), 0..4),
    )
        .prop_map(
            |(name, first_seq, last_seq, frames, bytes, consumers)| StreamInfo {
                name,
                first_seq,
                last_seq,
                frames,
                bytes,
                consumers,
            },
        )
}

fn status_info() -> impl Strategy<Value = StatusInfo> {
    (
        (text(), any::<u32>(), any::<u32>(), any::<u64>(), text()),
        (
            text(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (version, protocol, pid, uptime_secs, socket),
                (state_dir, store_bytes, streams, executions, connections),
            )| StatusInfo {
                version,
                protocol,
                pid,
                uptime_secs,
                socket,
                state_dir,
                store_bytes,
                streams,
                executions,
                connections,
            },
        )
}

/// Every [`Response`] variant with every field drawn.
fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        hello_ok().prop_map(Response::HelloOk),
        error_frame().prop_map(Response::Error),
        appended().prop_map(Response::Appended),
        subscribed().prop_map(Response::Subscribed),
        durable().prop_map(Response::Durable),
        frame().prop_map(Response::Live),
        gap().prop_map(Response::Gap),
        any::<u64>().prop_map(|last_seq| Response::End { last_seq }),
        durable_ack().prop_map(Response::Acked),
        vec(stream_info(), 0..4).prop_map(Response::Streams),
        status_info().prop_map(Response::Status),
    ]
}

/// Chunk sizes for splitting a byte stream. Mostly small (down to single
/// bytes, which split even the length prefix), sometimes large.
fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    vec(
        prop_oneof![3 => 1usize..8, 2 => 8usize..512, 1 => 512usize..8192],
        1..16,
    )
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Encodes `items` back to back with `encoder` and returns the bytes and the
/// offset at which each frame ends.
fn encode_all<E, T>(encoder: &mut E, items: &[T]) -> (Bytes, Vec<usize>)
where
    E: Encoder<T, Error = tether_protocol::Error>,
    T: Clone,
{
    let mut buf = BytesMut::new();
    let mut ends = Vec::with_capacity(items.len());
    for item in items {
        encoder.encode(item.clone(), &mut buf).unwrap();
        ends.push(buf.len());
    }
    (buf.freeze(), ends)
}

/// Feeds `bytes` to `decoder` in chunks of the given sizes (cycled), draining
/// the decoder after every chunk the way a framed reader does. Checks that,
/// after each chunk, exactly the frames wholly received so far have been
/// decoded: a partial frame must be `Ok(None)`, never an error or a message.
fn decode_chunked<D, T>(decoder: &mut D, bytes: &[u8], ends: &[usize], sizes: &[usize]) -> Vec<T>
where
    D: Decoder<Item = T, Error = tether_protocol::Error>,
{
    let mut src = BytesMut::new();
    let mut out = Vec::new();
    let mut fed = 0;
    for &size in sizes.iter().cycle() {
        if fed == bytes.len() {
            break;
        }
        let next = (fed + size).min(bytes.len());
        src.extend_from_slice(&bytes[fed..next]);
        fed = next;
        while let Some(item) = decoder.decode(&mut src).unwrap() {
            out.push(item);
        }
        let complete = ends.iter().filter(|&&end| end <= fed).count();
        assert_eq!(out.len(), complete, "after {fed} of {} bytes", bytes.len());
    }
    assert!(src.is_empty(), "{} bytes left undecoded", src.len());
    assert!(decoder.decode_eof(&mut src).unwrap().is_none());
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_request_round_trips_through_chunked_decoding(
        msg in request(),
        sizes in chunk_sizes(),
    ) {
        let (bytes, ends) = encode_all(&mut ClientCodec::new(), std::slice::from_ref(&msg));
        let decoded = decode_chunked(&mut ServerCodec::new(), &bytes, &ends, &sizes);
        prop_assert_eq!(decoded, vec![msg]);
    }

    #[test]
    fn every_response_round_trips_through_chunked_decoding(
        msg in response(),
        sizes in chunk_sizes(),
    ) {
        let (bytes, ends) = encode_all(&mut ServerCodec::new(), std::slice::from_ref(&msg));
        let decoded = decode_chunked(&mut ClientCodec::new(), &bytes, &ends, &sizes);
        prop_assert_eq!(decoded, vec![msg]);
    }

    #[test]
    fn requests_back_to_back_decode_in_order(
        msgs in vec(request(), 1..8),
        sizes in chunk_sizes(),
    ) {
        let (bytes, ends) = encode_all(&mut ClientCodec::new(), &msgs);
        let decoded = decode_chunked(&mut ServerCodec::new(), &bytes, &ends, &sizes);
        prop_assert_eq!(decoded, msgs);
    }

    #[test]
    fn responses_back_to_back_decode_in_order(
        msgs in vec(response(), 1..8),
        sizes in chunk_sizes(),
    ) {
        let (bytes, ends) = encode_all(&mut ServerCodec::new(), &msgs);
        let decoded = decode_chunked(&mut ClientCodec::new(), &bytes, &ends, &sizes);
        prop_assert_eq!(decoded, msgs);
    }

    /// The codec and `encode_frame` give the same bytes, the prefix is the
    /// body's length, and the body is what `decode_message` parses.
    #[test]
    fn every_encoding_path_produces_the_same_frame(msg in request(), resp in response()) {
        let mut by_value = BytesMut::new();
        ClientCodec::new().encode(msg.clone(), &mut by_value).unwrap();
        prop_assert_eq!(&by_value, &encode_frame(&msg).unwrap());
        let body_len = u32::from_be_bytes(by_value[..4].try_into().unwrap()) as usize;
        prop_assert_eq!(body_len, by_value.len() - 4);
        prop_assert_eq!(decode_message::<Request>(&by_value[4..]).unwrap(), msg);

        let mut resp_by_value = BytesMut::new();
        ServerCodec::new().encode(resp.clone(), &mut resp_by_value).unwrap();
        prop_assert_eq!(&resp_by_value, &encode_frame(&resp).unwrap());
        prop_assert_eq!(decode_message::<Response>(&resp_by_value[4..]).unwrap(), resp);
    }

    /// Encoding appends: what was already in the buffer is kept intact.
    #[test]
    fn encoding_appends_after_existing_bytes(prefix in vec(any::<u8>(), 0..64), msg in response()) {
        let mut buf = BytesMut::from(&prefix[..]);
        ServerCodec::new().encode(msg.clone(), &mut buf).unwrap();
        prop_assert_eq!(&buf[..prefix.len()], &prefix[..]);
        prop_assert_eq!(&buf[prefix.len()..], &encode_frame(&msg).unwrap()[..]);
    }

    /// A stored frame written from its parts is byte for byte what serde
    /// writes for the same `Durable` or `Live` response, after whatever the
    /// buffer held.
    #[test]
    fn frames_written_from_parts_match_serde(
        prefix in vec(any::<u8>(), 0..64),
        seq in any::<u64>(),
        frame in frame(),
    ) {
        let mut buf = BytesMut::from(&prefix[..]);
        encode_durable(seq, frame.view(), &mut buf).unwrap();
        let durable = Response::Durable(Durable { seq, frame: frame.clone() });
        prop_assert_eq!(&buf[..prefix.len()], &prefix[..]);
        prop_assert_eq!(&buf[prefix.len()..], &encode_frame(&durable).unwrap()[..]);

        let mut live = BytesMut::new();
        encode_live(frame.view(), &mut live).unwrap();
        prop_assert_eq!(&live[..], &encode_frame(&Response::Live(frame.clone())).unwrap()[..]);

        // And a reader takes it back in place.
        let read = decode_durable_view(&buf[prefix.len() + 4..]).unwrap();
        prop_assert_eq!(read, Some((seq, frame.view())));
        prop_assert_eq!(decode_durable_view(&live[4..]).unwrap(), None);
    }

    /// An append written from borrowed parts is byte for byte what serde
    /// writes for the owned request.
    #[test]
    fn appends_written_from_parts_match_serde(
        stream in "\\PC{1,20}",
        producer in "\\PC{1,20}",
        producer_seq in any::<u64>(),
        frame in frame(),
    ) {
        let view = AppendView {
            stream: &stream,
            producer: &producer,
            producer_seq,
            kind: frame.kind,
            payload: &frame.payload,
        };
        let mut buf = BytesMut::new();
        encode_append(view, &mut buf, usize::MAX).unwrap();
        let request = Request::Append(Append {
            stream: stream.clone(),
            producer: producer.clone(),
            producer_seq,
            kind: frame.kind,
            payload: frame.payload.clone(),
        });
        prop_assert_eq!(&buf[..], &encode_frame(&request).unwrap()[..]);
    }
}
