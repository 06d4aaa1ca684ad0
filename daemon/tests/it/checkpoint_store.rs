//! Checkpoints and durable steps in the queue: ids, retention, the seq a
//! checkpoint records, durability across a reopen, corruption, refusals,
//! and what a restarted attempt resumes from.

use std::path::Path;

use bytes::Bytes;
use tether_protocol::{Append, CheckpointSave, ErrorCode, FrameKind};
use tetherd::checkpoint::Resume;
use tetherd::engine::{Queue, QueueOptions};
use tetherd::store::corrupt_checkpoint_for_tests;
use tetherd::subscription::SubEvent;
use tetherd::Error;

const JOB: &str = "job-aaaaaa";

fn options(keep: usize) -> QueueOptions {
    QueueOptions {
        checkpoint_keep: keep,
        max_checkpoint_bytes: 1024,
        ..QueueOptions::default()
    }
}

/// A queue holding the execution `JOB` (the queue keeps manifests opaque).
async fn open_with_job(path: &Path, opts: QueueOptions) -> Queue {
    let queue = Queue::open(path, opts).unwrap();
    if queue.load_executions().await.unwrap().is_empty() {
        queue
            .record_execution(JOB, b"manifest".to_vec(), Vec::new())
            .await
            .unwrap();
    }
    queue
}

fn save(data: &str) -> CheckpointSave {
    CheckpointSave {
        execution: JOB.into(),
        schema_version: 1,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

async fn output(queue: &Queue, lines: &[&str], first_pseq: u64) {
    let appends: Vec<_> = lines
        .iter()
        .zip(first_pseq..)
        .map(|(line, pseq)| Append {
            stream: JOB.into(),
            producer: "worker".into(),
            producer_seq: pseq,
            kind: FrameKind::Stdout,
            payload: Bytes::copy_from_slice(line.as_bytes()),
        })
        .collect();
    queue.append(appends).await.unwrap();
}

async fn loaded(queue: &Queue) -> Option<(u64, String)> {
    queue
        .load_checkpoint(JOB)
        .await
        .unwrap()
        .map(|c| (c.meta.id, String::from_utf8(c.data.to_vec()).unwrap()))
}

async fn listed(queue: &Queue) -> Vec<(u64, bool)> {
    queue
        .list_checkpoints(JOB)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.id, m.valid))
        .collect()
}

async fn event_texts(queue: &Queue) -> Vec<String> {
    let mut sub = queue.subscribe(JOB, 0, false).unwrap();
    let mut out = Vec::new();
    loop {
        match sub.next().await.unwrap() {
            SubEvent::Frames(frames) => out.extend(
                frames
                    .into_iter()
                    .filter(|(_, f)| f.kind == FrameKind::Event)
                    .map(|(_, f)| String::from_utf8(f.payload.to_vec()).unwrap()),
            ),
            SubEvent::End { .. } => return out,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_the_newest_n_and_ids_keep_growing() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open_with_job(&dir.path().join("t.redb"), options(3)).await;
    for i in 1..=7u64 {
        let meta = queue
            .save_checkpoint(save(&format!("state {i}")))
            .await
            .unwrap();
        assert_eq!(meta.id, i);
        assert!(meta.valid);
        assert_eq!(meta.size, format!("state {i}").len() as u64);
    }
    assert_eq!(
        listed(&queue).await,
        [(7, true), (6, true), (5, true)],
        "newest first, only the newest 3"
    );
    assert_eq!(loaded(&queue).await, Some((7, "state 7".into())));
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_records_the_streams_last_seq_and_shows_in_ps() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open_with_job(&dir.path().join("t.redb"), options(10)).await;
    assert_eq!(queue.last_checkpoint(JOB), None);
    let first = queue.save_checkpoint(save("empty stream")).await.unwrap();
    assert_eq!(first.seq, 0, "the execution has no stream yet");
    output(&queue, &["a", "b", "c"], 1).await;
    let meta = queue.save_checkpoint(save("after c")).await.unwrap();
    assert_eq!(meta.seq, 3);
    let shown = queue.last_checkpoint(JOB).unwrap();
    assert_eq!((shown.seq, shown.created_micros), (3, meta.created_micros));
    let checkpoint = queue.load_checkpoint(JOB).await.unwrap().unwrap();
    assert_eq!(checkpoint.meta, meta);
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_checkpoint_survives_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    for i in 1..=10u64 {
        // A new queue each time, the previous one dropped without a
        // clean close: what was acknowledged must still be there.
        let queue = open_with_job(&path, options(4)).await;
        if i > 1 {
            assert_eq!(
                loaded(&queue).await,
                Some((i - 1, format!("state {}", i - 1)))
            );
        }
        let meta = queue
            .save_checkpoint(save(&format!("state {i}")))
            .await
            .unwrap();
        assert_eq!(meta.id, i, "ids continue across reopening");
        drop(queue);
    }
    let queue = open_with_job(&path, options(4)).await;
    assert_eq!(
        listed(&queue).await,
        [(10, true), (9, true), (8, true), (7, true)]
    );
    assert_eq!(queue.last_checkpoint(JOB).map(|r| r.seq), Some(0));
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_checkpoint_is_skipped_for_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let queue = open_with_job(&path, options(10)).await;
    for i in 1..=3 {
        output(&queue, &["line"], i).await;
        queue
            .save_checkpoint(save(&format!("state {i}")))
            .await
            .unwrap();
    }
    queue.close().await.unwrap();
    corrupt_checkpoint_for_tests(&path, JOB, 3).unwrap();

    let queue = open_with_job(&path, options(10)).await;
    assert_eq!(loaded(&queue).await, Some((2, "state 2".into())));
    assert_eq!(listed(&queue).await, [(3, false), (2, true), (1, true)]);
    assert_eq!(
        queue.last_checkpoint(JOB).map(|r| r.seq),
        Some(2),
        "ps shows the newest valid one"
    );
    queue.close().await.unwrap();

    corrupt_checkpoint_for_tests(&path, JOB, 2).unwrap();
    corrupt_checkpoint_for_tests(&path, JOB, 1).unwrap();
    let queue = open_with_job(&path, options(10)).await;
    assert_eq!(loaded(&queue).await, None, "none valid: nothing to load");
    assert_eq!(listed(&queue).await, [(3, false), (2, false), (1, false)]);
    assert_eq!(queue.last_checkpoint(JOB), None);
    // A new save is valid and becomes the newest, with the next id.
    let meta = queue.save_checkpoint(save("fresh")).await.unwrap();
    assert_eq!(meta.id, 4);
    assert_eq!(loaded(&queue).await, Some((4, "fresh".into())));
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corruption_hook_refuses_a_store_held_open_and_a_missing_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let queue = open_with_job(&path, options(10)).await;
    queue.save_checkpoint(save("x")).await.unwrap();
    assert!(corrupt_checkpoint_for_tests(&path, JOB, 1).is_err());
    queue.close().await.unwrap();
    let e = corrupt_checkpoint_for_tests(&path, JOB, 9).unwrap_err();
    assert!(e.to_string().contains("no checkpoint 9"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_keeps_its_first_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let queue = open_with_job(&path, options(10)).await;
    assert_eq!(queue.step(JOB, "step 1").await.unwrap(), None);
    let kept = queue
        .put_step(JOB, "step 1", Bytes::from_static(b"first"))
        .await
        .unwrap();
    assert_eq!(kept, Bytes::from_static(b"first"));
    let kept = queue
        .put_step(JOB, "step 1", Bytes::from_static(b"second"))
        .await
        .unwrap();
    assert_eq!(
        kept,
        Bytes::from_static(b"first"),
        "the first result is kept"
    );
    queue.close().await.unwrap();
    let queue = open_with_job(&path, options(10)).await;
    assert_eq!(
        queue.step(JOB, "step 1").await.unwrap(),
        Some(Bytes::from_static(b"first"))
    );
    assert_eq!(queue.step(JOB, "step 2").await.unwrap(), None);
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_execution_is_not_found_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open_with_job(&dir.path().join("t.redb"), options(10)).await;
    let other = "nobody-bbbbbb";
    let not_found = |e: Error| {
        assert!(
            matches!(&e, Error::ExecutionNotFound(id) if id == other),
            "{e}"
        );
        assert_eq!(e.code(), ErrorCode::NOT_FOUND);
    };
    let mut unknown = save("x");
    unknown.execution = other.into();
    not_found(queue.save_checkpoint(unknown).await.unwrap_err());
    not_found(queue.load_checkpoint(other).await.unwrap_err());
    not_found(queue.list_checkpoints(other).await.unwrap_err());
    not_found(queue.step(other, "s").await.unwrap_err());
    not_found(
        queue
            .put_step(other, "s", Bytes::from_static(b"r"))
            .await
            .unwrap_err(),
    );
    // Refusing them left the writer and the known execution unharmed.
    assert_eq!(queue.save_checkpoint(save("ok")).await.unwrap().id, 1);
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_over_the_size_limit_is_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open_with_job(&dir.path().join("t.redb"), options(10)).await;
    let e = queue
        .save_checkpoint(save(&"x".repeat(1025)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_REQUEST);
    assert_eq!(
        e.to_string(),
        "checkpoint of 1025 bytes exceeds the limit of 1024 bytes"
    );
    let e = queue
        .put_step(JOB, "big", Bytes::from(vec![0u8; 2000]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_REQUEST);
    assert!(queue.save_checkpoint(save(&"x".repeat(1024))).await.is_ok());
    assert_eq!(
        listed(&queue).await,
        [(1, true)],
        "the refused one left no trace"
    );
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_start_says_what_it_resumes_from_in_the_same_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let queue = open_with_job(&path, options(10)).await;
    let start = |queue: &Queue, n: u32| {
        let queue = queue.clone();
        async move {
            queue
                .record_attempt_start(
                    JOB,
                    b"manifest".to_vec(),
                    vec![Bytes::from(format!("starting attempt {n}"))],
                    None,
                )
                .await
                .unwrap()
        }
    };
    // No checkpoint at all: fresh, and nothing more is said.
    assert_eq!(start(&queue, 2).await, (1, Resume::Fresh));

    output(&queue, &["a", "b"], 1).await; // seqs 2, 3
    queue.save_checkpoint(save("at 3")).await.unwrap();
    output(&queue, &["c", "d"], 3).await; // seqs 4, 5
    let (last, resume) = start(&queue, 3).await; // "starting" is seq 6
    assert_eq!(
        resume,
        Resume::From {
            checkpoint: 1,
            seq: 3,
            through: 6
        }
    );
    assert_eq!(last, 7);
    queue.close().await.unwrap();

    corrupt_checkpoint_for_tests(&path, JOB, 1).unwrap();
    let queue = open_with_job(&path, options(10)).await;
    assert_eq!(start(&queue, 4).await, (9, Resume::NoValid));
    assert_eq!(
        event_texts(&queue).await,
        [
            "starting attempt 2",
            "starting attempt 3",
            "resumed from checkpoint 1 (seq 3); frames 4..6 came from the abandoned attempt",
            "starting attempt 4",
            "no valid checkpoint; starting fresh",
        ]
    );
    queue.close().await.unwrap();
}
