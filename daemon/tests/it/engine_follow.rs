//! Following streams: the hand-over from store reads to live batches, slow
//! followers switched to the store, and live (no replay) subscriptions.

use std::time::Duration;

use bytes::Bytes;
use tether_protocol::{Append, FrameKind};
use tetherd::engine::{Queue, QueueOptions};
use tetherd::hub::FollowerBudget;
use tetherd::subscription::{SubEvent, Subscription};

fn appends(stream: &str, producer: &str, pseqs: std::ops::Range<u64>, len: usize) -> Vec<Append> {
    pseqs
        .map(|pseq| Append {
            stream: stream.into(),
            producer: producer.into(),
            producer_seq: pseq,
            kind: FrameKind::Stdout,
            payload: Bytes::from(format!("{producer}:{pseq:0>width$}", width = len)),
        })
        .collect()
}

/// Reads until `last` has been delivered, checking that seqs come exactly
/// once, in order, from `first` on.
async fn expect_contiguous(sub: &mut Subscription, first: u64, last: u64) {
    let mut next = first;
    while next <= last {
        let event = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap_or_else(|_| panic!("stalled waiting for seq {next}"))
            .unwrap();
        match event {
            SubEvent::Frames(frames) => {
                assert!(!frames.is_empty());
                for (seq, _) in frames {
                    assert_eq!(seq, next, "seqs arrive exactly once and in order");
                    next += 1;
                }
            }
            other => panic!("unexpected {other:?} at seq {next}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_follower_gets_every_seq_across_the_store_to_live_handover() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    for round in 0..25u64 {
        let stream = format!("s{round}");
        // Some history to replay, then a writer at full speed while the
        // subscriber resumes after seq k, inside the history.
        let seeded = 150 + round * 7;
        let k = round * 5;
        queue
            .append(appends(&stream, "seed", 1..seeded + 1, 8))
            .await
            .unwrap();
        let total: u64 = 600;
        let writer = {
            let queue = queue.clone();
            let stream = stream.clone();
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < total {
                    let n = (1 + sent % 13).min(total - sent);
                    let first = sent + 1;
                    queue
                        .append(appends(&stream, "fast", first..first + n, 8))
                        .await
                        .unwrap();
                    sent += n;
                }
            })
        };
        let mut sub = queue.subscribe(&stream, k, true).unwrap();
        expect_contiguous(&mut sub, k + 1, seeded + total).await;
        writer.await.unwrap();
        assert_eq!(queue.stream_range(&stream), Some((1, seeded + total)));
    }
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_are_group_committed_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    queue.append(appends("g", "seed", 1..2, 1)).await.unwrap();
    let mut sub = queue.subscribe("g", 0, true).unwrap();
    let mut tasks = Vec::new();
    for p in 0..8 {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let producer = format!("p{p}");
            for i in 1..=250u64 {
                let out = queue
                    .append(appends("g", &producer, i..i + 1, 4))
                    .await
                    .unwrap();
                assert!(!out[0].duplicate);
            }
        }));
    }
    expect_contiguous(&mut sub, 1, 2001).await;
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(queue.stream_range("g"), Some((1, 2001)));
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_follower_is_served_from_the_store_and_gets_every_frame_once() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    queue
        .append(appends("slow", "seed", 1..2, 100))
        .await
        .unwrap();
    let mut sub = queue.subscribe("slow", 0, true).unwrap();
    // Reading the one frame and then waiting makes it a live follower.
    expect_contiguous(&mut sub, 1, 1).await;
    let pending = tokio::time::timeout(Duration::from_millis(50), sub.next()).await;
    assert!(pending.is_err(), "nothing to deliver yet");

    // 50k frames of ~100 bytes: several MiB, far beyond the follower's budget.
    let total = 50_000u64;
    let mut pseq = 1;
    while pseq <= total {
        let n = 500.min(total + 1 - pseq);
        queue
            .append(appends("slow", "bulk", pseq..pseq + n, 100))
            .await
            .unwrap();
        pseq += n;
    }
    expect_contiguous(&mut sub, 2, total + 1).await;
    let peak = sub.peak_queued_bytes();
    let most = FollowerBudget::default().max();
    assert!(
        peak <= most,
        "queued {peak} bytes for one follower, at most {most} allowed"
    );
    assert!(peak > most / 2, "the budget was actually reached");

    // Caught up again, it follows live.
    queue
        .append(appends("slow", "late", 1..4, 10))
        .await
        .unwrap();
    expect_contiguous(&mut sub, total + 2, total + 4).await;
    queue.close().await.unwrap();
}

#[tokio::test]
async fn live_subscription_starts_after_the_frames_stored_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    queue.append(appends("live", "a", 1..11, 4)).await.unwrap();
    let mut sub = queue.subscribe_live("live").unwrap();
    assert_eq!(sub.next_seq(), 11);
    queue.append(appends("live", "a", 11..14, 4)).await.unwrap();
    match sub.next().await.unwrap() {
        SubEvent::Frames(frames) => {
            let seqs: Vec<u64> = frames.iter().map(|(s, _)| *s).collect();
            assert_eq!(seqs, [11, 12, 13]);
            assert_eq!(frames[0].1.payload, Bytes::from("a:0011"));
        }
        other => panic!("unexpected {other:?}"),
    }
    queue.close().await.unwrap();
}

#[tokio::test]
async fn non_following_subscription_ends_at_the_last_seq_of_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    queue.append(appends("e", "a", 1..2001, 4)).await.unwrap();
    let mut sub = queue.subscribe("e", 10, false).unwrap();
    queue
        .append(appends("e", "a", 2001..2011, 4))
        .await
        .unwrap();
    expect_contiguous(&mut sub, 11, 2000).await;
    assert_eq!(sub.next().await.unwrap(), SubEvent::End { last_seq: 2000 });
    assert_eq!(sub.next().await.unwrap(), SubEvent::End { last_seq: 2000 });
    let mut at_end = queue.subscribe("e", 2010, false).unwrap();
    assert_eq!(
        at_end.next().await.unwrap(),
        SubEvent::End { last_seq: 2010 }
    );
    queue.close().await.unwrap();
}

#[tokio::test]
async fn followers_end_with_shutting_down_when_the_queue_closes() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    queue.append(appends("c", "a", 1..3, 4)).await.unwrap();
    let mut sub = queue.subscribe("c", 0, true).unwrap();
    expect_contiguous(&mut sub, 1, 2).await;
    let waiting = tokio::spawn(async move { sub.next().await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    queue.close().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(result, Err(tetherd::Error::ShuttingDown)),
        "{result:?}"
    );
    assert!(matches!(
        queue.append(appends("c", "a", 3..4, 4)).await,
        Err(tetherd::Error::ShuttingDown)
    ));
}
