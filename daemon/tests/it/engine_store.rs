//! Durability, compaction, retention and the exact errors of the queue.

use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_protocol::{Append, ClientCodec, ConsumerInfo, Durable, FrameKind, Gap, Response};
use tetherd::config::Retention;
use tetherd::engine::{Queue, QueueOptions};
use tetherd::subscription::{SubEvent, Subscription, WireForm};
use tetherd::Error;
use tokio_util::codec::Decoder;

fn appends(stream: &str, producer: &str, pseqs: std::ops::RangeInclusive<u64>) -> Vec<Append> {
    pseqs
        .map(|pseq| Append {
            stream: stream.into(),
            producer: producer.into(),
            producer_seq: pseq,
            kind: FrameKind::Data,
            payload: Bytes::from(format!("{producer}-{pseq:04}")),
        })
        .collect()
}

fn no_retention() -> QueueOptions {
    QueueOptions {
        retention: Retention {
            max_frames: None,
            max_bytes: None,
            max_age: None,
        },
        ..QueueOptions::default()
    }
}

fn open(path: &Path, opts: QueueOptions) -> Queue {
    Queue::open(path, opts).unwrap()
}

/// Every event of a non-following read after `after`.
async fn read_all(queue: &Queue, stream: &str, after: u64) -> Vec<SubEvent> {
    drain(queue.subscribe(stream, after, false).unwrap()).await
}

/// Every event of a non-following read after `after`, with store reads
/// encoded as a session given `form` sends them.
async fn read_all_encoded(
    queue: &Queue,
    stream: &str,
    after: u64,
    form: WireForm,
) -> Vec<SubEvent> {
    let mut sub = queue.subscribe(stream, after, false).unwrap();
    sub.encode_as(form);
    drain(sub).await
}

/// Every event of a non-following subscription, through its end.
async fn drain(mut sub: Subscription) -> Vec<SubEvent> {
    let mut events = Vec::new();
    loop {
        let event = sub.next().await.unwrap();
        let end = matches!(event, SubEvent::End { .. });
        events.push(event);
        if end {
            return events;
        }
    }
}

/// What a client decodes from encoded events, as the plain events they
/// stand for (seqs come from `Durable`; `Live` frames carry none, so they
/// are numbered on from the previous event's last seq).
fn decoded(events: &[SubEvent], after: u64) -> Vec<SubEvent> {
    let mut next = after + 1;
    let mut out = Vec::new();
    for e in events {
        let SubEvent::Encoded { wire, last_seq } = e else {
            if let SubEvent::Gap(g) = e {
                next = g.first_available;
            }
            out.push(e.clone());
            continue;
        };
        let mut src = BytesMut::from(&wire[..]);
        let mut frames = Vec::new();
        while let Some(response) = ClientCodec::new().decode(&mut src).unwrap() {
            match response {
                Response::Durable(Durable { seq, frame }) => frames.push((seq, frame)),
                Response::Live(frame) => frames.push((next + frames.len() as u64, frame)),
                other => panic!("a store read encoded {other:?}"),
            }
        }
        assert!(src.is_empty(), "an encoded read ends with a whole frame");
        assert_eq!(frames.last().map(|(s, _)| *s), Some(*last_seq));
        next = last_seq + 1;
        out.push(SubEvent::Frames(frames));
    }
    out
}

#[tokio::test]
async fn encoded_reads_decode_to_the_same_frames_and_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    // Enough frames for several reads, some big enough to end a read on
    // bytes rather than on the frame count.
    let mut batch = appends("s", "p", 1..=3000);
    for a in batch.iter_mut().filter(|a| a.producer_seq % 500 == 0) {
        a.payload = Bytes::from(vec![b'x'; 100 * 1024]);
    }
    queue.append(batch).await.unwrap();
    queue.open_consumer("s", "c").await.unwrap();
    queue.ack("s", "c", 40).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("s"), Some((41, 3000)));

    for after in [0, 41, 1499, 2999] {
        let plain = read_all(&queue, "s", after).await;
        let durable = read_all_encoded(&queue, "s", after, WireForm::Durable).await;
        assert_eq!(decoded(&durable, after), plain, "durable after {after}");
        let live = read_all_encoded(&queue, "s", after, WireForm::Live).await;
        assert_eq!(decoded(&live, after), plain, "live after {after}");
    }
}

#[tokio::test]
async fn encoded_live_batches_decode_to_the_frames_appended() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    queue.append(appends("s", "p", 1..=10)).await.unwrap();
    let mut sub = queue.subscribe("s", 0, true).unwrap();
    sub.encode_as(WireForm::Durable);
    let mut events = vec![sub.next().await.unwrap()];
    for batch in [11..=20, 21..=30] {
        // The subscription has caught up and waits on the live channel
        // while the batch is appended.
        let (event, appended) = tokio::join!(sub.next(), queue.append(appends("s", "p", batch)));
        appended.unwrap();
        events.push(event.unwrap());
    }
    while !matches!(events.last(), Some(SubEvent::Encoded { last_seq: 30, .. })) {
        events.push(sub.next().await.unwrap());
    }
    let mut seqs = Vec::new();
    for event in decoded(&events, 0) {
        let SubEvent::Frames(frames) = event else {
            panic!("a following read delivered {event:?}");
        };
        for (seq, frame) in frames {
            assert_eq!(frame.payload, Bytes::from(format!("p-{seq:04}")));
            seqs.push(seq);
        }
    }
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
}

/// The seqs delivered by a read, and the gap notices among them.
fn seqs(events: &[SubEvent]) -> (Vec<u64>, Vec<Gap>) {
    let mut seqs = Vec::new();
    let mut gaps = Vec::new();
    for e in events {
        match e {
            SubEvent::Frames(f) => seqs.extend(f.iter().map(|(s, _)| *s)),
            SubEvent::Gap(g) => gaps.push(*g),
            SubEvent::End { .. } => {}
            SubEvent::Encoded { .. } => panic!("plain subscriptions deliver frames as values"),
        }
    }
    (seqs, gaps)
}

#[tokio::test]
async fn acks_of_all_consumers_compact_and_a_resume_below_first_gets_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    queue.append(appends("s", "p", 1..=100)).await.unwrap();
    assert_eq!(queue.open_consumer("s", "a").await.unwrap(), 0);
    assert_eq!(queue.open_consumer("s", "b").await.unwrap(), 0);
    queue.ack("s", "a", 50).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(
        queue.stream_range("s"),
        Some((1, 100)),
        "b has acked nothing"
    );

    queue.ack("s", "b", 30).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("s"), Some((31, 100)));
    let (got, gaps) = seqs(&read_all(&queue, "s", 0).await);
    assert_eq!(
        gaps,
        [Gap {
            requested: 1,
            first_available: 31
        }]
    );
    assert_eq!(got, (31..=100).collect::<Vec<_>>());

    // Acks never go backwards.
    queue.ack("s", "b", 10).await.unwrap();
    queue.ack("s", "b", 80).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("s"), Some((51, 100)));
    let (got, gaps) = seqs(&read_all(&queue, "s", 40).await);
    assert_eq!(
        gaps,
        [Gap {
            requested: 41,
            first_available: 51
        }]
    );
    assert_eq!(got.first(), Some(&51));
    assert_eq!(got.len(), 50);

    // A new consumer starts before the first retained frame.
    assert_eq!(queue.open_consumer("s", "c").await.unwrap(), 50);

    let info = queue.list_streams().await.unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (info[0].first_seq, info[0].last_seq, info[0].frames),
        (51, 100, 50)
    );
    assert_eq!(info[0].bytes, 50 * 6);
    assert_eq!(
        info[0].consumers,
        [
            ConsumerInfo {
                name: "a".into(),
                acked_through: 50
            },
            ConsumerInfo {
                name: "b".into(),
                acked_through: 80
            },
            ConsumerInfo {
                name: "c".into(),
                acked_through: 50
            },
        ]
    );
    queue.close().await.unwrap();
}

#[tokio::test]
async fn compaction_runs_by_itself_when_the_writer_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    // More than one compaction batch.
    for chunk in 0..10 {
        queue
            .append(appends("s", "p", chunk * 1000 + 1..=chunk * 1000 + 1000))
            .await
            .unwrap();
    }
    queue.ack("s", "only", 9_990).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while queue.stream_range("s") != Some((9_991, 10_000)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "compaction did not run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (got, _) = seqs(&read_all(&queue, "s", 9_990).await);
    assert_eq!(got, (9_991..=10_000).collect::<Vec<_>>());
    queue.close().await.unwrap();
}

#[tokio::test]
async fn retention_limits_frames_bytes_and_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let mut opts = no_retention();
    opts.retention.max_frames = Some(10);
    let queue = open(&path, opts);
    queue.append(appends("s", "p", 1..=25)).await.unwrap();
    queue.open_consumer("s", "slow").await.unwrap();
    queue.compact().await.unwrap();
    // Retention applies even to frames a consumer has not acked.
    assert_eq!(queue.stream_range("s"), Some((16, 25)));
    let (got, gaps) = seqs(&read_all(&queue, "s", 0).await);
    assert_eq!(gaps.len(), 1);
    assert_eq!(got, (16..=25).collect::<Vec<_>>());
    queue.close().await.unwrap();

    // Payloads are 6 bytes: 60 bytes keep 10 frames.
    let mut opts = no_retention();
    opts.retention.max_bytes = Some(60);
    let queue = open(&path, opts);
    queue.append(appends("b", "p", 1..=25)).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("b"), Some((16, 25)));
    queue.close().await.unwrap();

    // An append and the compaction after it must fit within the age limit
    // even on a loaded machine: at 300 ms they sometimes did not.
    let max_age = Duration::from_secs(2);
    let past_max_age = max_age + Duration::from_millis(200);
    let mut opts = no_retention();
    opts.retention.max_age = Some(max_age);
    let queue = open(&path, opts);
    queue.append(appends("t", "p", 1..=5)).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("t"), Some((1, 5)));
    tokio::time::sleep(past_max_age).await;
    queue.append(appends("t", "p", 6..=7)).await.unwrap();
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("t"), Some((6, 7)));
    tokio::time::sleep(past_max_age).await;
    queue.compact().await.unwrap();
    // Nothing retained: first = last + 1, and seqs go on.
    assert_eq!(queue.stream_range("t"), Some((8, 7)));
    let out = queue.append(appends("t", "p", 8..=8)).await.unwrap();
    assert_eq!(out[0].seq, 8);
    queue.close().await.unwrap();
}

#[tokio::test]
async fn refusals_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    queue.append(appends("s", "p", 1..=5)).await.unwrap();

    match queue.ack("s", "c", 6).await {
        Err(Error::InvalidRequest(msg)) => {
            assert_eq!(
                msg,
                "ack through seq 6 is beyond the last seq 5 of stream s"
            )
        }
        other => panic!("{other:?}"),
    }
    match queue.subscribe("s", 9, true) {
        Err(Error::InvalidRequest(msg)) => {
            assert_eq!(
                msg,
                "resume after seq 9 is beyond the last seq 5 of stream s"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(queue.subscribe("nope", 0, true), Err(Error::StreamNotFound(s)) if s == "nope")
    );
    assert!(matches!(
        queue.subscribe_live("nope"),
        Err(Error::StreamNotFound(_))
    ));
    assert!(matches!(
        queue.ack("nope", "c", 0).await,
        Err(Error::StreamNotFound(_))
    ));
    assert!(matches!(
        queue.open_consumer("nope", "c").await,
        Err(Error::StreamNotFound(_))
    ));
    assert_eq!(queue.stream_range("nope"), None);

    // A bad name refuses the whole call and stores nothing of it.
    let mut bad = appends("s", "p", 6..=7);
    bad[1].stream = "has space".into();
    assert!(matches!(
        queue.append(bad).await,
        Err(Error::Protocol(tether_protocol::Error::InvalidName { .. }))
    ));
    assert_eq!(queue.stream_range("s"), Some((1, 5)));
    assert_eq!(queue.stream_count(), 1);

    // An ack of an unknown consumer creates it.
    queue.ack("s", "late", 3).await.unwrap();
    assert_eq!(queue.open_consumer("s", "late").await.unwrap(), 3);
    queue.close().await.unwrap();
}

#[tokio::test]
async fn dropped_queue_reopens_with_everything_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let queue = open(&path, no_retention());
    let out = queue.append(appends("s", "p", 1..=10)).await.unwrap();
    assert_eq!(out.last().unwrap().seq, 10);
    queue.append(appends("other", "q", 1..=3)).await.unwrap();
    queue.ack("s", "c", 4).await.unwrap();
    // No close: the handle just goes away.
    drop(queue);

    let queue = open(&path, no_retention());
    // The one consumer acked through 4: compaction may drop those.
    queue.compact().await.unwrap();
    assert_eq!(queue.stream_range("s"), Some((5, 10)));
    assert_eq!(queue.stream_count(), 2);
    assert!(queue.store_bytes() > 0);
    assert_eq!(queue.open_consumer("s", "c").await.unwrap(), 4);
    // The producer's resend is recognised across the reopen...
    let resent = queue.append(appends("s", "p", 8..=12)).await.unwrap();
    let dups: Vec<(bool, u64)> = resent.iter().map(|o| (o.duplicate, o.seq)).collect();
    assert_eq!(
        dups,
        [(true, 10), (true, 10), (true, 10), (false, 11), (false, 12)]
    );
    // ...and seqs continue without reuse.
    let (got, gaps) = seqs(&read_all(&queue, "s", 4).await);
    assert!(gaps.is_empty());
    assert_eq!(got, (5..=12).collect::<Vec<_>>());
    let mut sub = queue.subscribe("s", 10, false).unwrap();
    match sub.next().await.unwrap() {
        SubEvent::Frames(frames) => {
            assert_eq!(frames[0].1.payload, Bytes::from("p-0011"));
            assert_eq!(frames[0].1.kind, FrameKind::Data);
            assert!(frames[0].1.ts_micros > 0);
        }
        other => panic!("{other:?}"),
    }
    queue.close().await.unwrap();
}

#[tokio::test]
async fn duplicates_inside_one_call_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    let mut batch = appends("s", "p", 1..=3);
    batch.extend(appends("s", "p", 2..=4));
    batch.extend(appends("s", "q", 1..=1));
    let out = queue.append(batch).await.unwrap();
    let got: Vec<(u64, bool, u64)> = out
        .iter()
        .map(|o| (o.producer_seq, o.duplicate, o.seq))
        .collect();
    assert_eq!(
        got,
        [
            (1, false, 1),
            (2, false, 2),
            (3, false, 3),
            (2, true, 3),
            (3, true, 3),
            (4, false, 4),
            (1, false, 5)
        ]
    );
    queue.close().await.unwrap();
}

#[tokio::test]
async fn interleaved_producers_keep_their_own_dedupe_state() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    let mut batch = Vec::new();
    for (producer, pseq) in [("p", 1), ("q", 1), ("p", 1), ("p", 2), ("q", 1), ("q", 2)] {
        batch.extend(appends("s", producer, pseq..=pseq));
    }
    batch.extend(appends("t", "p", 1..=1));
    let out = queue.append(batch).await.unwrap();
    let got: Vec<(&str, &str, u64, bool, u64)> = out
        .iter()
        .map(|o| (&*o.stream, &*o.producer, o.producer_seq, o.duplicate, o.seq))
        .collect();
    assert_eq!(
        got,
        [
            ("s", "p", 1, false, 1),
            ("s", "q", 1, false, 2),
            ("s", "p", 1, true, 1),
            ("s", "p", 2, false, 3),
            ("s", "q", 1, true, 2),
            ("s", "q", 2, false, 4),
            ("t", "p", 1, false, 1),
        ]
    );
    queue.close().await.unwrap();
}

/// Commands wait for a share of the in-flight budget; one bigger than
/// all of it must still get through, and so must those queued with it.
#[tokio::test]
async fn batches_bigger_than_the_in_flight_budget_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir.path().join("tether.redb"), no_retention());
    let big = Bytes::from(vec![b'x'; 3 * 1024 * 1024]);
    let batch = |producer: &str| -> Vec<Append> {
        (1..=4)
            .map(|pseq| Append {
                stream: "big".into(),
                producer: producer.into(),
                producer_seq: pseq,
                kind: FrameKind::Data,
                payload: big.clone(),
            })
            .collect()
    };
    let (a, b, c) = tokio::join!(
        queue.append(batch("a")),
        queue.append(batch("b")),
        queue.append(batch("c"))
    );
    for out in [a, b, c] {
        assert_eq!(out.unwrap().iter().filter(|o| !o.duplicate).count(), 4);
    }
    assert_eq!(queue.stream_range("big"), Some((1, 12)));
    queue.close().await.unwrap();
}

#[test]
fn a_store_that_is_not_a_redb_file_is_refused_by_name_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    std::fs::write(
        &path,
        b"this is not a database, just some text that got here",
    )
    .unwrap();
    let before = std::fs::read(&path).unwrap();
    match Queue::open(&path, no_retention()) {
        Err(Error::CorruptStore { path: p, .. }) => assert_eq!(p, path),
        Err(other) => panic!("expected CorruptStore, got {other:?}"),
        Ok(_) => panic!("a garbage file opened as a store"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let message = Queue::open(&path, no_retention()).unwrap_err().to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[test]
fn a_truncated_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let queue = open(&path, no_retention());
        queue.append(appends("s", "p", 1..=2000)).await.unwrap();
        queue.close().await.unwrap();
    });
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    match Queue::open(&path, no_retention()) {
        Err(Error::CorruptStore { path: p, .. }) => assert_eq!(p, path),
        Err(other) => panic!("expected CorruptStore, got {other:?}"),
        Ok(_) => panic!("a truncated file opened as a store"),
    }
}
