//! Ingest micro-benchmark: decoding 1,024 buffered appends of 256 bytes
//! (one producer, one stream, as in workload W1), read in place by the
//! daemon's session codec and, for comparison, one by one into owned
//! `Append`s by the protocol's codec.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tether_protocol::codec::encode_into;
use tether_protocol::{Append, FrameKind, Request, ServerCodec};
use tetherd::ingest::SessionCodec;
use tokio_util::codec::Decoder;

const FRAMES: u64 = 1024;
const PAYLOAD: usize = 256;

/// What a producer's socket holds with a full window.
fn wire() -> Bytes {
    let mut wire = BytesMut::new();
    for seq in 1..=FRAMES {
        let append = Request::Append(Append {
            stream: "bench-stream".into(),
            producer: "bench-producer".into(),
            producer_seq: seq,
            kind: FrameKind::Data,
            payload: Bytes::from(vec![b'x'; PAYLOAD]),
        });
        encode_into(&append, &mut wire, usize::MAX).unwrap();
    }
    wire.freeze()
}

/// Decodes everything in `wire` with `codec`; returns how many items.
fn drain<D: Decoder>(codec: &mut D, wire: &[u8]) -> usize
where
    D::Error: std::fmt::Debug,
{
    let mut src = BytesMut::from(wire);
    let mut items = 0;
    while let Some(item) = codec.decode(&mut src).unwrap() {
        black_box(item);
        items += 1;
    }
    items
}

fn ingest(c: &mut Criterion) {
    let wire = wire();
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(FRAMES));
    let mut session = SessionCodec::new(usize::MAX);
    group.bench_function("decode 1024 appends in place (session codec)", |b| {
        b.iter(|| drain(&mut session, &wire))
    });
    let mut server = ServerCodec::with_max_frame_len(usize::MAX);
    group.bench_function("decode 1024 appends one by one (protocol codec)", |b| {
        b.iter(|| drain(&mut server, &wire))
    });
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
