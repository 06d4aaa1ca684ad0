//! Execution records in the store: a manifest and its lifecycle events are
//! written in one transaction, and manifests are loaded back as written.

use bytes::Bytes;
use tether_protocol::FrameKind;
use tetherd::engine::{Queue, QueueOptions};
use tetherd::subscription::SubEvent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_stores_the_manifest_and_appends_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let queue = Queue::open(&path, QueueOptions::default()).unwrap();

    // A manifest alone creates no stream.
    let seq = queue
        .record_execution("job-aaaaaa", b"v1".to_vec(), Vec::new())
        .await
        .unwrap();
    assert_eq!(seq, 0);
    assert_eq!(queue.stream_range("job-aaaaaa"), None);

    let events = vec![
        Bytes::from_static(b"exited 1"),
        Bytes::from_static(b"failed"),
    ];
    let seq = queue
        .record_execution("job-aaaaaa", b"v2".to_vec(), events)
        .await
        .unwrap();
    assert_eq!(seq, 2);
    let mut sub = queue.subscribe("job-aaaaaa", 0, false).unwrap();
    let mut seen = Vec::new();
    loop {
        match sub.next().await.unwrap() {
            SubEvent::Frames(frames) => seen.extend(frames),
            SubEvent::End { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let texts: Vec<(u64, FrameKind, Bytes)> = seen
        .into_iter()
        .map(|(seq, f)| (seq, f.kind, f.payload))
        .collect();
    assert_eq!(
        texts,
        [
            (1, FrameKind::Event, Bytes::from_static(b"exited 1")),
            (2, FrameKind::Event, Bytes::from_static(b"failed")),
        ]
    );
    queue
        .record_execution("other-bbbbbb", b"x".to_vec(), Vec::new())
        .await
        .unwrap();
    queue.close().await.unwrap();

    let queue = Queue::open(&path, QueueOptions::default()).unwrap();
    let rows = queue.load_executions().await.unwrap();
    assert_eq!(
        rows,
        [
            ("job-aaaaaa".to_owned(), b"v2".to_vec()),
            ("other-bbbbbb".to_owned(), b"x".to_vec()),
        ]
    );
    assert_eq!(queue.stream_range("job-aaaaaa"), Some((1, 2)));
    queue.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_for_an_invalid_stream_name_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::open(&dir.path().join("tether.redb"), QueueOptions::default()).unwrap();
    let refused = queue
        .record_execution("two words", b"m".to_vec(), vec![Bytes::from_static(b"e")])
        .await;
    assert!(refused.is_err());
    assert!(queue.load_executions().await.unwrap().is_empty());
    queue.close().await.unwrap();
}
