//! Checkpoints and step results committed through the log: a copy of the
//! files taken while the queue is open (as `kill -9` leaves them) opens
//! with every acknowledged save, pruning, step result and cleared step;
//! a checkpoint too large for the log's record is committed durably
//! instead, and survives as well.

use std::path::Path;

use bytes::Bytes;
use tether_protocol::CheckpointSave;
use tetherd::engine::{Queue, QueueOptions};

const JOB: &str = "job-logged";

fn options(log_capacity: u64) -> QueueOptions {
    QueueOptions {
        checkpoint_keep: 4,
        max_checkpoint_bytes: 1024 * 1024,
        log_capacity,
        ..QueueOptions::default()
    }
}

fn save(data: Vec<u8>) -> CheckpointSave {
    CheckpointSave {
        execution: JOB.into(),
        schema_version: 1,
        data: Bytes::from(data),
    }
}

/// Checkpoint `n`'s data, `len` bytes.
fn data(n: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ n).collect()
}

/// Copies the store and its log from `from` to `to`, both named `t`.
fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["t.redb", "t.wal"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

async fn open_with_job(path: &Path, log_capacity: u64) -> Queue {
    let queue = Queue::open(path, options(log_capacity)).unwrap();
    queue
        .record_execution(JOB, b"manifest".to_vec(), Vec::new())
        .await
        .unwrap();
    queue
}

async fn checkpoint_ids(queue: &Queue) -> Vec<u64> {
    let listed = queue.list_checkpoints(JOB).await.unwrap();
    listed.iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_taken_while_open_holds_every_acknowledged_checkpoint_and_step() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let queue = open_with_job(&live.join("t.redb"), 8 * 1024 * 1024).await;
    for n in 1..=6 {
        queue.save_checkpoint(save(data(n, 3000))).await.unwrap();
    }
    for (name, result) in [("a", "ra"), ("b", "rb"), ("c", "rc")] {
        let kept = queue
            .put_step(JOB, name, Bytes::from_static(result.as_bytes()))
            .await
            .unwrap();
        assert_eq!(kept, result.as_bytes());
    }
    assert_eq!(
        queue
            .clear_steps(JOB, Some(vec!["b".into(), "none".into()]))
            .await
            .unwrap(),
        1
    );
    let crash = dir.path().join("crash");
    copy_files(&live, &crash);
    queue.close().await.unwrap();

    let queue = Queue::open(&crash.join("t.redb"), options(8 * 1024 * 1024)).unwrap();
    assert_eq!(checkpoint_ids(&queue).await, [6, 5, 4, 3], "pruned to 4");
    let newest = queue.load_checkpoint(JOB).await.unwrap().unwrap();
    assert_eq!((newest.meta.id, newest.data.to_vec()), (6, data(6, 3000)));
    let steps: Vec<String> = queue
        .list_steps(JOB)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(steps, ["a", "c"]);
    assert_eq!(
        queue.step(JOB, "a").await.unwrap().as_deref(),
        Some(&b"ra"[..])
    );
    assert_eq!(queue.step(JOB, "b").await.unwrap(), None);
    // Ids go on above the replayed ones.
    let next = queue.save_checkpoint(save(data(7, 10))).await.unwrap();
    assert_eq!(next.id, 7);
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_larger_than_the_log_is_committed_durably_and_survives() {
    const LOG: u64 = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let queue = open_with_job(&live.join("t.redb"), LOG).await;
    let small = queue.save_checkpoint(save(data(1, 2000))).await.unwrap();
    let big = queue
        .save_checkpoint(save(data(2, 512 * 1024)))
        .await
        .unwrap();
    assert_eq!((small.id, big.id), (1, 2));
    let after = queue.save_checkpoint(save(data(3, 2000))).await.unwrap();
    let crash = dir.path().join("crash");
    copy_files(&live, &crash);
    queue.close().await.unwrap();

    let queue = Queue::open(&crash.join("t.redb"), options(LOG)).unwrap();
    assert_eq!(checkpoint_ids(&queue).await, [3, 2, 1]);
    let newest = queue.load_checkpoint(JOB).await.unwrap().unwrap();
    assert_eq!((newest.meta, newest.data.to_vec()), (after, data(3, 2000)));
    let listed = queue.list_checkpoints(JOB).await.unwrap();
    assert_eq!(listed[1], big, "the large one, as acknowledged");
    queue.close().await.unwrap();
}
