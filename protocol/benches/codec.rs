//! Codec micro-benchmarks: one `Append` (the producer's hot path) and one
//! `Durable` (the follower's) through the length-delimited postcard codec,
//! both ways, with a 256-byte payload as in workload W1.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tether_protocol::codec::encode_durable;
use tether_protocol::{Append, Durable, Frame, FrameKind, FrameView, Request, Response};
use tether_protocol::{ClientCodec, ServerCodec};
use tokio_util::codec::{Decoder, Encoder};

const PAYLOAD: usize = 256;

fn append() -> Request {
    Request::Append(Append {
        stream: "bench-stream".into(),
        producer: "bench-producer".into(),
        producer_seq: 123_456,
        kind: FrameKind::Data,
        payload: Bytes::from(vec![b'x'; PAYLOAD]),
    })
}

fn durable() -> Response {
    Response::Durable(Durable {
        seq: 987_654,
        frame: Frame {
            ts_micros: 1_700_000_000_000_000,
            kind: FrameKind::Data,
            payload: Bytes::from(vec![b'x'; PAYLOAD]),
        },
    })
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(1));

    let mut client = ClientCodec::new();
    let mut server = ServerCodec::new();
    let mut buf = BytesMut::with_capacity(4096);
    group.bench_function("encode Append", |b| {
        b.iter(|| {
            buf.clear();
            client.encode(black_box(append()), &mut buf).unwrap();
        })
    });
    let mut wire = BytesMut::new();
    client.encode(append(), &mut wire).unwrap();
    let wire = wire.freeze();
    group.bench_function("decode Append", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(&wire[..]);
            black_box(server.decode(&mut src).unwrap().unwrap());
        })
    });

    group.bench_function("encode Durable", |b| {
        b.iter(|| {
            buf.clear();
            server.encode(black_box(durable()), &mut buf).unwrap();
        })
    });
    // Replay's path: a stored frame written from its parts.
    let payload = vec![b'x'; PAYLOAD];
    group.bench_function("encode Durable from parts", |b| {
        b.iter(|| {
            buf.clear();
            let frame = FrameView {
                ts_micros: 1_700_000_000_000_000,
                kind: FrameKind::Data,
                payload: black_box(&payload),
            };
            encode_durable(black_box(987_654), frame, &mut buf).unwrap();
        })
    });
    let mut wire = BytesMut::new();
    server.encode(durable(), &mut wire).unwrap();
    let wire = wire.freeze();
    group.bench_function("decode Durable", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(&wire[..]);
            black_box(client.decode(&mut src).unwrap().unwrap());
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Short runs: these track regressions, they are not a lab measurement.
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = codec
}
criterion_main!(benches);
