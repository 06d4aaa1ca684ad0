//! Checkpoints through the socket and resuming restarted attempts.
//!
//! The daemon runs in-process and starts a stand-in shim (a shell script
//! that keeps its spec and pid for the test, then sleeps); the test speaks
//! the shim's side of the protocol, so it decides when each attempt ends.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tether_protocol::{
    Append, CheckpointSave, ErrorCode, ExecState, ExecutionInfo, ExitStatus, FrameKind, Request,
    Response, RestartPolicy, RunSpec, ShimHello, StartAt, Subscribe, WorkerExited,
};
use tetherd::supervisor::procfs::{self, ProcessId};

use crate::support::*;

/// The shim's side of one attempt, with a stand-in worker.
struct Attempt {
    session: Client,
    worker: std::process::Child,
    id: String,
    attempt: u32,
    pseq: u64,
}

impl Attempt {
    /// Says hello as the shim of `attempt`; the attempt is then running.
    async fn start(socket: &Path, id: &str, attempt: u32, shim: ProcessId) -> Attempt {
        let worker = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let worker_id = procfs::identify(worker.id()).unwrap();
        let mut session = Client::connect(socket).await;
        let hello = Request::ShimHello(ShimHello {
            execution: id.into(),
            attempt,
            shim_pid: shim.pid,
            shim_start_ticks: shim.start_ticks,
            worker_pid: Some(worker_id.pid),
            worker_start_ticks: worker_id.start_ticks,
            boot_id: procfs::boot_id().unwrap(),
        });
        assert!(matches!(session.call(hello).await, Response::ShimAccepted));
        Attempt {
            session,
            worker,
            id: id.into(),
            attempt,
            pseq: 0,
        }
    }

    /// One line of the worker's output, acknowledged.
    async fn line(&mut self, line: &str) {
        self.pseq += 1;
        let append = Request::Append(Append {
            stream: self.id.clone(),
            producer: format!("shim-{}-{}", self.id, self.attempt),
            producer_seq: self.pseq,
            kind: FrameKind::Stdout,
            payload: Bytes::copy_from_slice(line.as_bytes()),
        });
        assert!(matches!(
            self.session.call(append).await,
            Response::Appended(_)
        ));
    }

    /// The worker's exit with `code`, recorded.
    async fn exit(mut self, code: i32) {
        let exited = Request::WorkerExited(WorkerExited {
            execution: self.id.clone(),
            attempt: self.attempt,
            status: ExitStatus::Code(code),
        });
        assert!(matches!(
            self.session.call(exited).await,
            Response::ExitRecorded
        ));
        let _ = self.worker.kill();
        let _ = self.worker.wait();
    }
}

async fn save(socket: &Path, id: &str, data: &str) -> tether_protocol::CheckpointMeta {
    let request = Request::CheckpointSave(CheckpointSave {
        execution: id.into(),
        schema_version: 2,
        data: Bytes::copy_from_slice(data.as_bytes()),
    });
    match call(socket, request).await {
        Response::CheckpointSaved(meta) => meta,
        other => panic!("expected CheckpointSaved, got {other:?}"),
    }
}

async fn ps(socket: &Path, id: &str) -> ExecutionInfo {
    match call(socket, Request::ListExecutions { all: true }).await {
        Response::Executions(list) => list.into_iter().find(|e| e.id == id).unwrap(),
        other => panic!("expected Executions, got {other:?}"),
    }
}

async fn wait_attempt(socket: &Path, id: &str, attempt: u32) -> ExecutionInfo {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = ps(socket, id).await;
        if info.attempt == attempt && info.state == ExecState::Starting {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "never attempt {attempt}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The stream's frames as (seq, kind, text).
async fn frames(socket: &Path, id: &str) -> Vec<(u64, FrameKind, String)> {
    let mut client = Client::connect(socket).await;
    let subscribe = Request::Subscribe(Subscribe {
        stream: id.into(),
        start: StartAt::Oldest,
        follow: false,
        consumer: None,
    });
    assert!(matches!(
        client.call(subscribe).await,
        Response::Subscribed(_)
    ));
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, client.0.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Response::Durable(d) => out.push((
                d.seq,
                d.frame.kind,
                String::from_utf8_lossy(&d.frame.payload).into_owned(),
            )),
            Response::End { .. } => return out,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn run_spec() -> RunSpec {
    RunSpec {
        name: Some("agent".into()),
        command: vec!["agent".into()],
        cwd: None,
        env: Vec::new(),
        restart: RestartPolicy::OnFailure,
        max_restarts: None,
        deadline_ms: None,
    }
}

async fn run(socket: &Path) -> String {
    match call(socket, Request::Run(run_spec())).await {
        Response::Started { execution } => execution,
        other => panic!("expected Started, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_attempt_resumes_from_the_newest_checkpoint() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &env.socket();
    let id = run(socket).await;
    let shim = env.shim_of(&id, 1).await;
    assert!(!env.spec_of(&id, 1).resumed, "a first attempt starts fresh");
    match call(
        socket,
        Request::CheckpointLoad {
            execution: id.clone(),
        },
    )
    .await
    {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::NOT_FOUND);
            assert!(e.message.contains("no valid checkpoint"), "{}", e.message);
        }
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }

    // Attempt 1 writes "one", checkpoints, writes "two" and fails.
    let mut attempt = Attempt::start(socket, &id, 1, shim).await;
    attempt.line("one").await;
    let meta = save(socket, &id, "after one").await;
    assert_eq!((meta.id, meta.schema_version, meta.size), (1, 2, 9));
    attempt.line("two").await;
    attempt.exit(1).await;

    let info = ps(socket, &id).await;
    let shown = info.last_checkpoint.unwrap();
    assert_eq!(
        (shown.seq, shown.created_micros),
        (meta.seq, meta.created_micros)
    );

    wait_attempt(socket, &id, 2).await;
    env.shim_of(&id, 2).await;
    assert!(
        env.spec_of(&id, 2).resumed,
        "TETHER_RESUMED=1 for attempt 2"
    );

    let story = frames(socket, &id).await;
    let resumed = story
        .iter()
        .find(|(_, _, text)| text.starts_with("resumed from"))
        .unwrap_or_else(|| panic!("no resume frame: {story:?}"));
    let before = resumed.0 - 1;
    assert_eq!(
        resumed.2,
        format!(
            "resumed from checkpoint 1 (seq {}); frames {}..{before} came from the abandoned attempt",
            meta.seq,
            meta.seq + 1
        )
    );
    // The checkpoint was taken right after "one"; "two" came after it.
    let one = story.iter().find(|(_, _, t)| t == "one").unwrap();
    assert_eq!(one.0, meta.seq);
    let texts: Vec<&str> = story.iter().map(|(_, _, t)| t.as_str()).collect();
    let tail = &texts[texts.len() - 5..];
    assert_eq!(tail[0], "two");
    assert_eq!(tail[1], "exited 1");
    assert!(tail[2].starts_with("restarting in"), "{tail:?}");
    assert_eq!(tail[3], "starting attempt 2: agent");
    assert!(tail[4].starts_with("resumed from checkpoint 1"));

    match call(
        socket,
        Request::CheckpointLoad {
            execution: id.clone(),
        },
    )
    .await
    {
        Response::Checkpoint(c) => {
            assert_eq!(c.meta, meta);
            assert_eq!(&c.data[..], b"after one");
        }
        other => panic!("expected Checkpoint, got {other:?}"),
    }
    match call(
        socket,
        Request::CheckpointList {
            execution: id.clone(),
        },
    )
    .await
    {
        Response::Checkpoints(list) => assert_eq!(list, [meta]),
        other => panic!("expected Checkpoints, got {other:?}"),
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_attempt_with_only_corrupt_checkpoints_starts_fresh_and_says_so() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &env.socket();
    let id = run(socket).await;
    let shim = env.shim_of(&id, 1).await;
    save(socket, &id, "state").await;
    daemon.stop().await;
    // The daemon is down: its shim dies, and the checkpoint is damaged.
    kill(shim);
    let store = env.state_dir().join("tether.redb");
    tetherd::store::corrupt_checkpoint_for_tests(&store, &id, 1).unwrap();

    let daemon = env.start().await;
    wait_attempt(socket, &id, 2).await;
    env.shim_of(&id, 2).await;
    assert!(!env.spec_of(&id, 2).resumed);
    let texts: Vec<String> = frames(socket, &id).await.into_iter().map(|f| f.2).collect();
    let tail = &texts[texts.len() - 2..];
    assert_eq!(tail[0], "starting attempt 2: agent", "{texts:?}");
    assert_eq!(tail[1], "no valid checkpoint; starting fresh");
    assert_eq!(ps(socket, &id).await.last_checkpoint, None);
    match call(
        socket,
        Request::CheckpointList {
            execution: id.clone(),
        },
    )
    .await
    {
        Response::Checkpoints(list) => {
            assert_eq!(list.len(), 1);
            assert!(!list[0].valid);
        }
        other => panic!("expected Checkpoints, got {other:?}"),
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_checkpoints_adds_no_resume_frame() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &env.socket();
    let id = run(socket).await;
    let shim = env.shim_of(&id, 1).await;
    let mut attempt = Attempt::start(socket, &id, 1, shim).await;
    attempt.line("hello").await;
    attempt.exit(1).await;
    wait_attempt(socket, &id, 2).await;
    env.shim_of(&id, 2).await;
    assert!(!env.spec_of(&id, 2).resumed);
    let texts: Vec<String> = frames(socket, &id).await.into_iter().map(|f| f.2).collect();
    assert_eq!(
        texts.last().unwrap(),
        "starting attempt 2: agent",
        "{texts:?}"
    );
    assert!(texts.iter().all(|t| !t.contains("checkpoint")));
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_requests_for_an_unknown_execution_are_not_found() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &env.socket();
    let requests = [
        Request::CheckpointSave(CheckpointSave {
            execution: "nobody-aaaaaa".into(),
            schema_version: 1,
            data: Bytes::from_static(b"x"),
        }),
        Request::CheckpointLoad {
            execution: "nobody-aaaaaa".into(),
        },
        Request::CheckpointList {
            execution: "nobody-aaaaaa".into(),
        },
        Request::StepGet {
            execution: "nobody-aaaaaa".into(),
            step: "s".into(),
        },
        Request::StepPut {
            execution: "nobody-aaaaaa".into(),
            step: "s".into(),
            result: Bytes::from_static(b"r"),
        },
    ];
    for request in requests {
        match call(socket, request).await {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::NOT_FOUND, "{}", e.message),
            other => panic!("expected NOT_FOUND, got {other:?}"),
        }
    }
    let id = run(socket).await;
    let put = Request::StepPut {
        execution: id.clone(),
        step: "step 1".into(),
        result: Bytes::from_static(b"done"),
    };
    assert!(matches!(call(socket, put).await, Response::StepRecorded(r) if &r[..] == b"done"));
    let get = Request::StepGet {
        execution: id.clone(),
        step: "step 1".into(),
    };
    assert!(matches!(call(socket, get).await, Response::StepResult(Some(r)) if &r[..] == b"done"));
    env.shim_of(&id, 1).await;
    daemon.stop().await;
}
