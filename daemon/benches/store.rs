//! Store micro-benchmarks: appending one group commit (1,024 frames of 256
//! bytes, committed durably), reading 1,024 frames from a given seq, and
//! one compaction batch (deleting 4,096 frames from the front).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tether_protocol::{Frame, FrameKind};
use tetherd::store::{ReadLimits, Store, StreamMeta};

const BATCH: u64 = 1024;
const PAYLOAD: usize = 256;
const STREAM_ID: u64 = 1;
const NAME: &str = "bench";

fn frame() -> Frame {
    Frame {
        ts_micros: 1_700_000_000_000_000,
        kind: FrameKind::Data,
        payload: Bytes::from(vec![b'x'; PAYLOAD]),
    }
}

/// Appends one batch after `meta.last_seq` and records it in `meta`.
fn append_batch(store: &Store, meta: &mut StreamMeta, frame: &Frame) {
    store
        .write(|txn| {
            for _ in 0..BATCH {
                meta.last_seq += 1;
                meta.frames += 1;
                txn.put_frame(STREAM_ID, meta.last_seq, frame)?;
            }
            txn.put_stream(NAME, meta)
        })
        .unwrap();
}

fn open() -> (tempfile::TempDir, Store, StreamMeta) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("bench.redb")).unwrap();
    (dir, store, StreamMeta::new(STREAM_ID, 0))
}

fn store(c: &mut Criterion) {
    let frame = frame();
    let mut group = c.benchmark_group("store");
    group.throughput(Throughput::Elements(BATCH));

    let (_dir, store, mut meta) = open();
    group.bench_function("append batch of 1024 (durable commit)", |b| {
        b.iter(|| append_batch(&store, &mut meta, &frame))
    });

    // W0's commit: one frame, logged (the log's sync is not included).
    group.throughput(Throughput::Elements(1));
    let (_dir, store, mut meta) = open();
    group.bench_function("append one frame (logged commit, unsynced)", |b| {
        b.iter(|| {
            store
                .write_logged(
                    |txn| {
                        meta.last_seq += 1;
                        meta.frames += 1;
                        txn.put_frame(STREAM_ID, meta.last_seq, &frame)?;
                        txn.put_stream(NAME, &meta)
                    },
                    |_| {},
                )
                .unwrap()
        })
    });
    group.throughput(Throughput::Elements(BATCH));

    let (_dir, store, mut meta) = open();
    for _ in 0..100 {
        append_batch(&store, &mut meta, &frame);
    }
    let limits = ReadLimits {
        max_frames: BATCH as usize,
        max_bytes: usize::MAX,
        through_seq: u64::MAX,
    };
    let mut from = 1;
    group.bench_function("range read of 1024", |b| {
        b.iter(|| {
            // Starts inside a chunk, so that two are read.
            from = (from + 4999) % (meta.last_seq - BATCH) + 1;
            let read = store.read_frames(NAME, from, limits).unwrap();
            assert_eq!(read.frames.len(), BATCH as usize);
            black_box(read);
        })
    });

    const COMPACT: u64 = 4096;
    group.throughput(Throughput::Elements(COMPACT));
    let (_dir, store, mut meta) = open();
    group.bench_function("compaction of 4096", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                while meta.last_seq < meta.first_seq + COMPACT {
                    append_batch(&store, &mut meta, &frame);
                }
                let start = Instant::now();
                let first = meta.first_seq;
                let deleted = store
                    .write(|txn| txn.delete_prefix(STREAM_ID, first, first + COMPACT - 1, |_| true))
                    .unwrap();
                spent += start.elapsed();
                meta.first_seq += deleted.frames;
            }
            spent
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Short runs: these track regressions, they are not a lab measurement.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = store
}
criterion_main!(benches);
