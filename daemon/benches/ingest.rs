//! Ingest micro-benchmark: decoding 1,024 buffered appends of 256 bytes
//! (one producer, one stream, as in workload W1), read in place by the
//! daemon's session codec and, for comparison, one by one into owned
//! `Append`s by the protocol's codec; and the same as `AppendStamped`s, as
//! shims send them, read in place.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tether_protocol::codec::encode_into;
use tether_protocol::{Append, AppendStamped, FrameKind, Request, ServerCodec};
use tetherd::ingest::SessionCodec;
use tokio_util::codec::Decoder;

const FRAMES: u64 = 1024;
const PAYLOAD: usize = 256;

/// What a producer's socket holds with a full window; `stamped`: a shim's.
fn wire(stamped: bool) -> Bytes {
    let mut wire = BytesMut::new();
    for seq in 1..=FRAMES {
        let append = Append {
            stream: "bench-stream".into(),
            producer: "bench-producer".into(),
            producer_seq: seq,
            kind: FrameKind::Data,
            payload: Bytes::from(vec![b'x'; PAYLOAD]),
        };
        let request = match stamped {
            false => Request::Append(append),
            true => Request::AppendStamped(AppendStamped {
                stream: append.stream,
                producer: append.producer,
                producer_seq: append.producer_seq,
                kind: append.kind,
                payload: append.payload,
                ts_micros: 1_800_000_000_000_000 + seq,
            }),
        };
        encode_into(&request, &mut wire, usize::MAX).unwrap();
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
    let plain = wire(false);
    let stamped = wire(true);
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(FRAMES));
    let mut session = SessionCodec::new(usize::MAX);
    group.bench_function("decode 1024 appends in place (session codec)", |b| {
        b.iter(|| drain(&mut session, &plain))
    });
    group.bench_function(
        "decode 1024 stamped appends in place (session codec)",
        |b| b.iter(|| drain(&mut session, &stamped)),
    );
    let mut server = ServerCodec::with_max_frame_len(usize::MAX);
    group.bench_function("decode 1024 appends one by one (protocol codec)", |b| {
        b.iter(|| drain(&mut server, &plain))
    });
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
