//! The worker SDK against a fake daemon that keeps checkpoints, step
//! results and appended frames in memory. The fake speaks the real wire
//! protocol over a real unix socket; it can be told to drop a session
//! instead of answering, to prove that requests survive a lost session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tether::worker::Error;
use tether::{CheckpointTrigger, ConnectOptions, Connector, Endpoint, Worker};
use tether_protocol::{
    Appended, Checkpoint, CheckpointMeta, ErrorCode, ErrorFrame, FrameKind, Request, Response,
};
use tokio::net::{UnixListener, UnixStream};

mod fake_daemon;

const EXECUTION: &str = "agent-abc123";

/// What the fake daemon holds.
#[derive(Default)]
struct State {
    /// Checkpoints, oldest first.
    checkpoints: Vec<Checkpoint>,
    steps: BTreeMap<String, Bytes>,
    /// (producer, producer seq, kind, payload) of every stored append.
    frames: Vec<(String, u64, FrameKind, Bytes)>,
    /// Requests seen, by name.
    requests: Vec<&'static str>,
}

struct Fake {
    _dir: tempfile::TempDir,
    path: PathBuf,
    state: Arc<Mutex<State>>,
    /// The next this-many requests are not answered: the session is closed
    /// instead, after the request was carried out.
    drop_next: Arc<AtomicUsize>,
}

impl Fake {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let drop_next = Arc::new(AtomicUsize::new(0));
        let (st, dn) = (state.clone(), drop_next.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, st.clone(), dn.clone()));
            }
        });
        Self {
            _dir: dir,
            path,
            state,
            drop_next,
        }
    }

    fn worker(&self) -> Worker {
        let connector = Connector::new(
            Endpoint::unix(&self.path),
            ConnectOptions {
                retry_window: Duration::from_secs(5),
                backoff_initial: Duration::from_millis(1),
                backoff_cap: Duration::from_millis(20),
                ..ConnectOptions::default()
            },
        );
        Worker::new(EXECUTION, connector, false).unwrap()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn put_checkpoint(&self, schema_version: u32, data: &[u8]) {
        let mut state = self.state();
        let id = state.checkpoints.len() as u64 + 1;
        state.checkpoints.push(Checkpoint {
            meta: meta(id, schema_version, data.len()),
            data: Bytes::copy_from_slice(data),
        });
    }
}

fn meta(id: u64, schema_version: u32, size: usize) -> CheckpointMeta {
    CheckpointMeta {
        id,
        seq: id * 10,
        schema_version,
        size: size as u64,
        created_micros: 1_700_000_000_000_000 + id,
        valid: true,
    }
}

async fn serve(stream: UnixStream, state: Arc<Mutex<State>>, drop_next: Arc<AtomicUsize>) {
    let Some(mut session) = fake_daemon::greet(stream).await else {
        return;
    };
    while let Some(Ok(request)) = session.next().await {
        let answer = answer(&state, request);
        let dropping = drop_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if dropping {
            return;
        }
        let refused = matches!(answer, Response::Error(_));
        if session.send(answer).await.is_err() || refused {
            return;
        }
    }
}

/// The daemon's rules, in memory.
fn answer(state: &Mutex<State>, request: Request) -> Response {
    let mut state = state.lock().unwrap();
    state.requests.push(request.name());
    let not_found = |message: &str| {
        Response::Error(ErrorFrame {
            code: ErrorCode::NOT_FOUND,
            message: message.into(),
        })
    };
    match request {
        Request::CheckpointSave(save) => {
            let id = state.checkpoints.len() as u64 + 1;
            let meta = meta(id, save.schema_version, save.data.len());
            state.checkpoints.push(Checkpoint {
                meta: meta.clone(),
                data: save.data,
            });
            Response::CheckpointSaved(meta)
        }
        Request::CheckpointLoad { .. } => match state.checkpoints.last() {
            Some(checkpoint) => Response::Checkpoint(checkpoint.clone()),
            None => not_found("no checkpoint"),
        },
        Request::StepGet { step, .. } => Response::StepResult(state.steps.get(&step).cloned()),
        Request::StepPut { step, result, .. } => {
            let kept = state.steps.entry(step).or_insert(result).clone();
            Response::StepRecorded(kept)
        }
        Request::Append(append) => {
            let (producer, seq) = (append.producer.clone(), append.producer_seq);
            state
                .frames
                .push((producer.clone(), seq, append.kind, append.payload));
            Response::Appended(Appended {
                stream: append.stream,
                producer,
                producer_seq: seq,
                seq: state.frames.len() as u64,
            })
        }
        other => Response::Error(ErrorFrame {
            code: ErrorCode::INVALID_REQUEST,
            message: format!("the fake does not do {}", other.name()),
        }),
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
struct Plan {
    next: u32,
    notes: Vec<String>,
}

#[tokio::test]
async fn a_checkpoint_restores_as_the_same_value() {
    let fake = Fake::start();
    let worker = fake.worker();
    assert_eq!(worker.restore::<Plan>(1).await.unwrap(), None);
    let plan = Plan {
        next: 4,
        notes: vec!["searched".into(), "drafted".into()],
    };
    let meta = worker.checkpoint(&plan, 1).await.unwrap();
    assert_eq!((meta.id, meta.schema_version), (1, 1));
    assert_eq!(worker.restore::<Plan>(1).await.unwrap(), Some(plan));
    // The NOT_FOUND of the first restore closed that session; the later
    // requests went over a new one.
    assert_eq!(
        fake.state().requests,
        ["CheckpointLoad", "CheckpointSave", "CheckpointLoad"]
    );
}

#[tokio::test]
async fn another_schema_version_is_a_typed_error_not_garbage() {
    let fake = Fake::start();
    fake.put_checkpoint(3, br#"{"next":1,"notes":[]}"#);
    let err = fake.worker().restore::<Plan>(2).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::SchemaMismatch {
                stored: 3,
                expected: 2
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn data_that_does_not_fit_the_type_is_a_decode_error() {
    let fake = Fake::start();
    fake.put_checkpoint(1, br#"{"next":"soon"}"#);
    let err = fake.worker().restore::<Plan>(1).await.unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("checkpoint 1"), "{err}");
}

#[tokio::test]
async fn a_recorded_step_returns_its_result_without_running_again() {
    let fake = Fake::start();
    let worker = fake.worker();
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(vec![1u32, 2, 3])
    };
    let first: Vec<u32> = worker.step("fetch", body).await.unwrap();
    let again: Vec<u32> = worker.step("fetch", body).await.unwrap();
    assert_eq!(first, vec![1, 2, 3]);
    assert_eq!(again, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        fake.state().requests,
        ["StepGet", "StepPut", "StepGet"],
        "the second call only looked the result up"
    );
}

#[tokio::test]
async fn the_first_recorded_result_wins_over_a_late_one() {
    let fake = Fake::start();
    // Another attempt recorded the step between our lookup and our put:
    // simulated by a result that appears only for the put.
    let worker = fake.worker();
    let state = fake.state.clone();
    let out: String = worker
        .step("plan", || async move {
            state
                .lock()
                .unwrap()
                .steps
                .insert("plan".into(), Bytes::from_static(b"\"first\""));
            Ok::<_, std::io::Error>("second".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(out, "first");
}

#[tokio::test]
async fn a_failing_step_records_nothing_and_runs_again_next_time() {
    let fake = Fake::start();
    let worker = fake.worker();
    let err = worker
        .step("flaky", || async {
            Err::<u32, _>(std::io::Error::other("upstream timed out"))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Step { .. }), "{err:?}");
    assert!(err.to_string().contains("upstream timed out"), "{err}");
    assert!(fake.state().steps.is_empty());
    let ok: u32 = worker
        .step("flaky", || async { Ok::<_, std::io::Error>(7) })
        .await
        .unwrap();
    assert_eq!(ok, 7);
}

#[tokio::test]
async fn a_lost_session_is_reopened_and_the_request_sent_again() {
    let fake = Fake::start();
    let worker = fake.worker();
    fake.drop_next.store(1, Ordering::SeqCst);
    let meta = worker.checkpoint(&Plan::default(), 1).await.unwrap();
    // The first save was stored but its answer lost; the resent one is
    // stored again, which is the documented cost.
    assert_eq!(meta.id, 2);
    fake.drop_next.store(1, Ordering::SeqCst);
    let runs = AtomicUsize::new(0);
    let out: u32 = worker
        .step("s", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(5)
        })
        .await
        .unwrap();
    assert_eq!((out, runs.load(Ordering::SeqCst)), (5, 1));
}

#[tokio::test]
async fn emit_appends_to_the_execution_stream_as_this_process() {
    let fake = Fake::start();
    let worker = fake.worker();
    worker.emit(FrameKind::Data, "thinking").await.unwrap();
    worker
        .emit(FrameKind::Stdout, Bytes::from_static(b"done"))
        .await
        .unwrap();
    let state = fake.state();
    let producer = format!("worker-{EXECUTION}-{}", std::process::id());
    assert_eq!(state.frames.len(), 2, "durable on return");
    assert!(state.frames.iter().all(|f| f.0 == producer));
    assert!(
        state.frames[0].1 < state.frames[1].1,
        "producer seqs increase"
    );
    assert_eq!(state.frames[0].2, FrameKind::Data);
    assert_eq!(state.frames[1].3, Bytes::from_static(b"done"));
}

#[test]
fn a_trigger_checkpoints_on_the_chosen_events() {
    #[derive(Debug)]
    enum Event {
        Thought,
        StepDone(u32),
    }
    // Step 0 is the plan itself, not worth a checkpoint of its own.
    let mut trigger =
        CheckpointTrigger::when(|e: &Event| matches!(e, Event::StepDone(n) if *n > 0)).every(2);
    let events = [
        Event::StepDone(0),
        Event::Thought,
        Event::StepDone(1),
        Event::Thought,
        Event::StepDone(2),
        Event::StepDone(3),
        Event::StepDone(4),
    ];
    let fired: Vec<String> = events
        .iter()
        .filter(|e| trigger.should_checkpoint(e))
        .map(|e| format!("{e:?}"))
        .collect();
    assert_eq!(fired, ["StepDone(2)", "StepDone(4)"]);
}
