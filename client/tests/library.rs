//! The client library against a scripted fake daemon: resends after lost
//! sessions, transient refusals, resyncs on unexpected seqs, gap notices
//! and consumer acks. The fake speaks the real wire protocol over a real
//! unix socket, and lets each test decide what every session does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tether::{
    ConnectOptions, Connector, Endpoint, Error, Event, Greeting, Publisher, PublisherOptions,
    Start, SubscribeOptions, Subscriber,
};
use tether_protocol::{
    Appended, Capabilities, Durable, DurableAck, DurableResume, ErrorCode, ErrorFrame, Frame,
    FrameKind, Gap, HelloOk, Request, Response, ServerCodec, StartAt, Subscribe, Subscribed,
    PROTOCOL_VERSION,
};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::Framed;

type Session = Framed<UnixStream, ServerCodec>;
type Script = Arc<dyn Fn(usize, Session) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A fake daemon: accepts sessions, answers Hello, then hands the session
/// and its number (0, 1, ...) to the test's script.
struct Fake {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Fake {
    fn start(script: Script) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let mut session = Framed::new(stream, ServerCodec::new());
                let Some(Ok(Request::Hello(_))) = session.next().await else {
                    continue;
                };
                session
                    .send(Response::HelloOk(HelloOk {
                        version: PROTOCOL_VERSION,
                        capabilities: Capabilities::DURABLE,
                        daemon: "fake".into(),
                    }))
                    .await
                    .unwrap();
                tokio::spawn(script(n, session));
                n += 1;
            }
        });
        Self { _dir: dir, path }
    }

    fn connector(&self) -> Connector {
        connector(&self.path)
    }
}

fn connector(path: &Path) -> Connector {
    Connector::new(
        Endpoint::unix(path),
        ConnectOptions {
            retry_window: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(1),
            backoff_cap: Duration::from_millis(20),
            ..ConnectOptions::default()
        },
    )
}

fn script<F, Fut>(f: F) -> Script
where
    F: Fn(usize, Session) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |n, session| Box::pin(f(n, session)))
}

fn frame(seq: u64) -> Frame {
    Frame {
        ts_micros: seq,
        kind: FrameKind::Data,
        payload: Bytes::from(format!("line {seq}")),
    }
}

fn durable(seq: u64) -> Response {
    Response::Durable(Durable {
        seq,
        frame: frame(seq),
    })
}

/// A producer-side store with the daemon's dedupe rule.
#[derive(Default)]
struct Store {
    frames: Vec<Bytes>,
    producer_high: u64,
}

impl Store {
    fn append(&mut self, producer_seq: u64, payload: Bytes) {
        if producer_seq > self.producer_high {
            self.producer_high = producer_seq;
            self.frames.push(payload);
        }
    }
}

async fn publish_all(connector: Connector, lines: u64) -> Publisher {
    let mut publisher = Publisher::new(connector, "s", "p", PublisherOptions::default()).unwrap();
    for i in 1..=lines {
        publisher
            .publish(i, Bytes::from(format!("line {i}")))
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    publisher
}

fn expected_lines(n: u64) -> Vec<Bytes> {
    (1..=n).map(|i| Bytes::from(format!("line {i}"))).collect()
}

#[tokio::test]
async fn lost_sessions_are_resent_in_order_and_stored_once() {
    let store = Arc::new(Mutex::new(Store::default()));
    let shared = store.clone();
    // Each session stores everything it reads, but the first sessions die
    // after some appends, before acknowledging the last ones.
    let fake = Fake::start(script(move |n, mut session| {
        let store = shared.clone();
        async move {
            let mut seen = 0;
            while let Some(Ok(Request::Append(append))) = session.next().await {
                store
                    .lock()
                    .unwrap()
                    .append(append.producer_seq, append.payload.clone());
                seen += 1;
                if n < 3 && seen == 700 {
                    return;
                }
                if seen % 3 != 0 {
                    continue;
                }
                let ack = Response::Appended(Appended {
                    stream: append.stream,
                    producer: append.producer,
                    producer_seq: append.producer_seq,
                    seq: 0,
                });
                if session.send(ack).await.is_err() {
                    return;
                }
            }
        }
    }));
    let publisher = publish_all(fake.connector(), 3000).await;
    assert_eq!(publisher.acked_through(), 3000);
    assert_eq!(publisher.unacknowledged(), 0);
    assert_eq!(store.lock().unwrap().frames, expected_lines(3000));
}

#[tokio::test]
async fn a_transient_refusal_is_retried_and_a_permanent_one_is_not() {
    let fake = Fake::start(script(|n, mut session| async move {
        while let Some(Ok(Request::Append(append))) = session.next().await {
            let answer = if n == 0 {
                Response::Error(ErrorFrame {
                    code: ErrorCode::STORAGE_FULL,
                    message: "disk full".into(),
                })
            } else {
                Response::Appended(Appended {
                    stream: append.stream,
                    producer: append.producer,
                    producer_seq: append.producer_seq,
                    seq: append.producer_seq,
                })
            };
            let _ = session.send(answer).await;
            if n == 0 {
                return;
            }
        }
    }));
    let publisher = publish_all(fake.connector(), 10).await;
    assert_eq!(publisher.acked_through(), 10);

    let refusing = Fake::start(script(|_, mut session| async move {
        let _ = session.next().await;
        let _ = session
            .send(Response::Error(ErrorFrame {
                code: ErrorCode::INVALID_REQUEST,
                message: "no".into(),
            }))
            .await;
    }));
    let mut publisher =
        Publisher::new(refusing.connector(), "s", "p", PublisherOptions::default()).unwrap();
    publisher
        .publish(1, Bytes::from_static(b"x"))
        .await
        .unwrap();
    let err = publisher.flush().await.unwrap_err();
    assert_eq!(err.daemon_code(), Some(ErrorCode::INVALID_REQUEST));
}

#[tokio::test]
async fn a_session_idle_for_longer_than_the_window_still_gets_a_full_window() {
    // Session 0 dies on the first append; session 1 works.
    let fake = Fake::start(script(|n, mut session| async move {
        while let Some(Ok(Request::Append(append))) = session.next().await {
            if n == 0 {
                return;
            }
            let ack = Response::Appended(Appended {
                stream: append.stream,
                producer: append.producer,
                producer_seq: append.producer_seq,
                seq: append.producer_seq,
            });
            let _ = session.send(ack).await;
        }
    }));
    let window = Duration::from_millis(200);
    let connector = Connector::new(
        Endpoint::unix(&fake.path),
        ConnectOptions {
            retry_window: window,
            ..ConnectOptions::default()
        },
    );
    let mut publisher = Publisher::new(connector, "s", "p", PublisherOptions::default()).unwrap();
    publisher.connect().await.unwrap();
    tokio::time::sleep(window * 2).await;
    publisher
        .publish(1, Bytes::from_static(b"x"))
        .await
        .unwrap();
    publisher.flush().await.unwrap();
    assert_eq!(publisher.acked_through(), 1);
}

/// Records every subscribe request the fake receives.
type Requests = Arc<Mutex<Vec<Request>>>;

async fn collect(sub: &mut Subscriber, limit: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.len() < limit {
        match sub.next().await.unwrap() {
            Some(event) => events.push(event),
            None => break,
        }
    }
    events
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Frame { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect()
}

fn oldest(follow: bool) -> SubscribeOptions {
    SubscribeOptions {
        stream: "s".into(),
        start: Start::Oldest,
        follow,
        consumer: None,
    }
}

fn resume(after: u64, follow: bool) -> Request {
    Request::DurableResume(DurableResume {
        stream: "s".into(),
        acked_through: after,
        follow,
        consumer: None,
    })
}

/// Session 0 sends `first`; later sessions send the rest of 1..=10 after
/// the position they were asked to resume from, then End.
fn stream_of_ten(first: Vec<Response>, requests: Requests) -> Script {
    script(move |n, mut session| {
        let first = first.clone();
        let requests = requests.clone();
        async move {
            let Some(Ok(request)) = session.next().await else {
                return;
            };
            requests.lock().unwrap().push(request.clone());
            session
                .send(Response::Subscribed(Subscribed {
                    first_seq: 1,
                    last_seq: 10,
                }))
                .await
                .unwrap();
            if n == 0 {
                for response in first {
                    session.send(response).await.unwrap();
                }
                // Keep the session open: only the client may end it.
                let _ = session.next().await;
                return;
            }
            let Request::DurableResume(DurableResume { acked_through, .. }) = request else {
                panic!("session {n} did not resume: {request:?}");
            };
            for seq in acked_through + 1..=10 {
                session.send(durable(seq)).await.unwrap();
            }
            session.send(Response::End { last_seq: 10 }).await.unwrap();
            let _ = session.next().await;
        }
    })
}

#[tokio::test]
async fn a_skipped_seq_makes_the_subscriber_resume_after_the_last_one_it_yielded() {
    let requests = Requests::default();
    let first = vec![durable(1), durable(2), durable(3), durable(5)];
    let fake = Fake::start(stream_of_ten(first, requests.clone()));
    let mut sub = Subscriber::open(fake.connector(), oldest(false))
        .await
        .unwrap();
    let events = collect(&mut sub, 100).await;
    assert_eq!(seqs(&events), (1..=10).collect::<Vec<_>>());
    assert_eq!(events.last(), Some(&Event::End { last_seq: 10 }));
    let requests = requests.lock().unwrap();
    assert_eq!(requests[1], resume(3, false));
}

#[tokio::test]
async fn a_repeated_seq_is_a_resync_too_never_a_silent_skip() {
    let requests = Requests::default();
    let first = vec![durable(1), durable(2), durable(3), durable(3)];
    let fake = Fake::start(stream_of_ten(first, requests.clone()));
    let mut sub = Subscriber::open(fake.connector(), oldest(false))
        .await
        .unwrap();
    let events = collect(&mut sub, 100).await;
    assert_eq!(seqs(&events), (1..=10).collect::<Vec<_>>());
    assert_eq!(requests.lock().unwrap()[1], resume(3, false));
}

#[tokio::test]
async fn a_dropped_session_resumes_after_the_last_yielded_seq() {
    let requests = Requests::default();
    let shared = requests.clone();
    let fake = Fake::start(script(move |n, mut session| {
        let requests = shared.clone();
        async move {
            let Some(Ok(request)) = session.next().await else {
                return;
            };
            requests.lock().unwrap().push(request.clone());
            let range = Response::Subscribed(Subscribed {
                first_seq: 1,
                last_seq: 4,
            });
            session.send(range).await.unwrap();
            let from = if n == 0 { 1 } else { 5 };
            for seq in from..from + 4 {
                session.send(durable(seq)).await.unwrap();
            }
            if n > 0 {
                let _ = session.next().await;
            }
            // Session 0 ends here: the connection drops mid-follow.
        }
    }));
    let mut sub = Subscriber::open(fake.connector(), oldest(true))
        .await
        .unwrap();
    let events = collect(&mut sub, 8).await;
    assert_eq!(seqs(&events), (1..=8).collect::<Vec<_>>());
    let requests = requests.lock().unwrap();
    assert_eq!(
        requests[0],
        Request::Subscribe(Subscribe {
            stream: "s".into(),
            start: StartAt::Oldest,
            follow: true,
            consumer: None,
        })
    );
    assert_eq!(requests[1], resume(4, true));
}

#[tokio::test]
async fn a_gap_notice_is_yielded_and_moves_the_expected_seq() {
    let fake = Fake::start(script(|_, mut session| async move {
        let _ = session.next().await;
        let responses = vec![
            Response::Subscribed(Subscribed {
                first_seq: 5,
                last_seq: 7,
            }),
            Response::Gap(Gap {
                requested: 2,
                first_available: 5,
            }),
            durable(5),
            durable(6),
            durable(7),
            Response::End { last_seq: 7 },
        ];
        for response in responses {
            session.send(response).await.unwrap();
        }
        let _ = session.next().await;
    }));
    let options = SubscribeOptions {
        start: Start::After(1),
        ..oldest(false)
    };
    let mut sub = Subscriber::open(fake.connector(), options).await.unwrap();
    let events = collect(&mut sub, 100).await;
    assert_eq!(
        events[0],
        Event::Gap(Gap {
            requested: 2,
            first_available: 5
        })
    );
    assert_eq!(seqs(&events), vec![5, 6, 7]);
    assert_eq!(sub.next().await.unwrap(), None);
}

#[tokio::test]
async fn a_missing_stream_is_not_found_and_not_retried() {
    let fake = Fake::start(script(|_, mut session| async move {
        let _ = session.next().await;
        let _ = session
            .send(Response::Error(ErrorFrame {
                code: ErrorCode::NOT_FOUND,
                message: "no such stream \"s\"".into(),
            }))
            .await;
    }));
    let err = Subscriber::open(fake.connector(), oldest(true))
        .await
        .unwrap_err();
    assert_eq!(err.exit_code(), 3);
}

#[tokio::test]
async fn the_final_ack_is_confirmed_on_a_session_of_its_own() {
    let requests = Requests::default();
    let shared = requests.clone();
    let fake = Fake::start(script(move |n, mut session| {
        let requests = shared.clone();
        async move {
            let _ = session.next().await;
            let subscribed = Response::Subscribed(Subscribed {
                first_seq: 1,
                last_seq: 3,
            });
            session.send(subscribed).await.unwrap();
            if n == 0 {
                for seq in 1..=3 {
                    session.send(durable(seq)).await.unwrap();
                }
                session.send(Response::End { last_seq: 3 }).await.unwrap();
                let _ = session.next().await;
                return;
            }
            while let Some(Ok(request)) = session.next().await {
                requests.lock().unwrap().push(request.clone());
                if let Request::DurableAck(ack) = request {
                    session.send(Response::Acked(ack)).await.unwrap();
                }
            }
        }
    }));
    let options = SubscribeOptions {
        consumer: Some("c".into()),
        start: Start::ConsumerAck,
        ..oldest(false)
    };
    let mut sub = Subscriber::open(fake.connector(), options).await.unwrap();
    let events = collect(&mut sub, 100).await;
    assert_eq!(seqs(&events), vec![1, 2, 3]);
    assert!(sub.ack(4).is_err(), "acking an unseen seq is refused");
    sub.ack(3).unwrap();
    sub.wait_acked().await.unwrap();
    assert_eq!(sub.acked_durable(), 3);
    assert_eq!(
        requests.lock().unwrap().as_slice(),
        &[Request::DurableAck(DurableAck { through_seq: 3 })]
    );
}

fn greeted(connector: Connector) -> Publisher {
    let options = PublisherOptions {
        greeting: Some(Greeting {
            request: Request::ListStreams,
            accepts: |r| matches!(r, Response::Streams(_)),
        }),
        ..PublisherOptions::default()
    };
    Publisher::new(connector, "s", "p", options).unwrap()
}

#[tokio::test]
async fn a_greeting_opens_every_session_and_a_transient_refusal_of_it_is_retried() {
    let firsts = Requests::default();
    let store = Arc::new(Mutex::new(Store::default()));
    let (shared_firsts, shared_store) = (firsts.clone(), store.clone());
    // Session 0 is shutting down; session 1 stores five appends and drops
    // before acknowledging the last ones; session 2 works.
    let fake = Fake::start(script(move |n, mut session| {
        let firsts = shared_firsts.clone();
        let store = shared_store.clone();
        async move {
            let Some(Ok(first)) = session.next().await else {
                return;
            };
            firsts.lock().unwrap().push(first);
            if n == 0 {
                let refusal = Response::Error(ErrorFrame {
                    code: ErrorCode::SHUTTING_DOWN,
                    message: "restarting".into(),
                });
                let _ = session.send(refusal).await;
                return;
            }
            session.send(Response::Streams(vec![])).await.unwrap();
            let mut seen = 0;
            while let Some(Ok(Request::Append(append))) = session.next().await {
                store
                    .lock()
                    .unwrap()
                    .append(append.producer_seq, append.payload.clone());
                seen += 1;
                if n == 1 && seen == 5 {
                    return;
                }
                if n == 1 && seen > 2 {
                    continue;
                }
                let ack = Response::Appended(Appended {
                    stream: append.stream,
                    producer: append.producer,
                    producer_seq: append.producer_seq,
                    seq: append.producer_seq,
                });
                let _ = session.send(ack).await;
            }
        }
    }));
    let mut publisher = greeted(fake.connector());
    for i in 1..=20 {
        publisher
            .publish(i, Bytes::from(format!("line {i}")))
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    assert_eq!(store.lock().unwrap().frames, expected_lines(20));
    let firsts = firsts.lock().unwrap();
    assert!(firsts.len() >= 3, "{firsts:?}");
    assert!(
        firsts.iter().all(|r| *r == Request::ListStreams),
        "{firsts:?}"
    );
    assert_eq!(publisher.sessions(), firsts.len() as u64 - 1);
}

#[tokio::test]
async fn a_permanently_refused_greeting_is_an_error_of_its_own() {
    let fake = Fake::start(script(|_, mut session| async move {
        let _ = session.next().await;
        let refusal = Response::Error(ErrorFrame {
            code: ErrorCode::NOT_FOUND,
            message: "no such execution".into(),
        });
        let _ = session.send(refusal).await;
    }));
    let mut publisher = greeted(fake.connector());
    let err = publisher.connect().await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Refused {
                request: "ListStreams",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.exit_code(), 3);
    assert!(err.to_string().contains("no such execution"), "{err}");
}
