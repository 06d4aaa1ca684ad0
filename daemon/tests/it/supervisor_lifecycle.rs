//! The supervisor end to end through the socket: runs, shims attaching
//! and reporting exits, restart policy, stop, lost shims and recovery after
//! a daemon restart.
//!
//! The daemon runs in-process and starts a stand-in shim (a shell script
//! that keeps its spec and pid for the test and then sleeps). The test then
//! speaks the shim's side of the protocol itself, with real processes
//! standing in for workers, so every step of the exchange is under its
//! control.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_protocol::{
    Append, ErrorCode, ExecState, ExecutionInfo, ExitStatus, FrameKind, Request, Response,
    RestartPolicy, RunSpec, StartAt, Subscribe, WorkerExited,
};
use tetherd::supervisor::manifest::Manifest;
use tetherd::supervisor::procfs::{self, ProcessId};

use crate::support::*;

/// A stand-in worker: a real process with a real identity.
struct Worker {
    child: Child,
    id: ProcessId,
}

impl Worker {
    fn spawn(script: &str) -> Worker {
        let child = Command::new("sh").args(["-c", script]).spawn().unwrap();
        let id = procfs::identify(child.id()).unwrap();
        Worker { child, id }
    }

    fn sleeper() -> Worker {
        Worker::spawn("exec sleep 60")
    }

    /// Its exit status once it has ended, waiting at most `WAIT`.
    fn ended(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker {} still runs",
                self.id.pid
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spec(command: &[&str], restart: RestartPolicy) -> RunSpec {
    RunSpec {
        name: None,
        command: command.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: Vec::new(),
        restart,
        max_restarts: None,
        deadline_ms: None,
    }
}

async fn run(socket: &Path, spec: RunSpec) -> String {
    match call(socket, Request::Run(spec)).await {
        Response::Started { execution } => execution,
        other => panic!("expected Started, got {other:?}"),
    }
}

async fn list(socket: &Path, all: bool) -> Vec<ExecutionInfo> {
    match call(socket, Request::ListExecutions { all }).await {
        Response::Executions(list) => list,
        other => panic!("expected Executions, got {other:?}"),
    }
}

async fn ps(socket: &Path, id: &str) -> ExecutionInfo {
    list(socket, true)
        .await
        .into_iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("{id} is not listed"))
}

async fn wait_state(socket: &Path, id: &str, state: ExecState) -> ExecutionInfo {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = ps(socket, id).await;
        if info.state == state {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "{id} is {:?}, never {state:?}: {info:?}",
            info.state
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The stream's frames as (kind, text), from the oldest.
async fn stream(socket: &Path, id: &str) -> Vec<(FrameKind, String)> {
    let mut client = Client::connect(socket).await;
    client
        .send(Request::Subscribe(Subscribe {
            stream: id.into(),
            start: StartAt::Oldest,
            follow: false,
            consumer: None,
        }))
        .await;
    let mut frames = Vec::new();
    loop {
        match client.recv().await {
            Response::Subscribed(_) => {}
            Response::Durable(d) => frames.push((
                d.frame.kind,
                String::from_utf8_lossy(&d.frame.payload).into_owned(),
            )),
            Response::End { .. } => return frames,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn events(socket: &Path, id: &str) -> Vec<String> {
    stream(socket, id)
        .await
        .into_iter()
        .filter(|(kind, _)| *kind == FrameKind::Event)
        .map(|(_, text)| text)
        .collect()
}

fn refusal(response: Response) -> (ErrorCode, String) {
    match response {
        Response::Error(e) => (e.code, e.message),
        other => panic!("expected an error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_starts_a_shim_and_its_whole_story_is_on_the_stream() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let mut run_spec = spec(&["sh", "-c", "echo hi"], RestartPolicy::Never);
    run_spec.name = Some("greeter".into());
    run_spec.env = vec![("A".into(), "1".into())];
    run_spec.cwd = Some("/".into());
    let id = run(socket, run_spec.clone()).await;
    assert!(id.starts_with("greeter-"), "{id}");

    let shim = env.shim_of(&id, 1).await;
    let handed = env.spec_of(&id, 1);
    assert_eq!(handed.execution, id);
    assert_eq!(handed.attempt, 1);
    assert_eq!(handed.command, run_spec.command);
    assert_eq!(handed.env, run_spec.env);
    assert_eq!(handed.cwd.as_deref(), Some("/"));
    assert_eq!(Path::new(&handed.socket), socket.as_path());
    assert!(!handed.resumed);
    assert_eq!(
        procfs::stat(shim.pid).unwrap().session,
        shim.pid,
        "own session"
    );
    assert_eq!(
        wait_state(socket, &id, ExecState::Starting).await.attempt,
        1
    );

    let worker = Worker::sleeper();
    let mut session = Client::shim(socket, &id, 1, shim, Some(worker.id)).await;
    let info = wait_state(socket, &id, ExecState::Running).await;
    assert_eq!(info.pid, Some(worker.id.pid));
    for (seq, line) in ["hi", "there"].iter().enumerate() {
        session
            .send(Request::Append(Append {
                stream: id.clone(),
                producer: format!("shim-{id}-1"),
                producer_seq: seq as u64 + 1,
                kind: FrameKind::Stdout,
                payload: Bytes::from_static(line.as_bytes()),
            }))
            .await;
    }
    let mut acked = 0;
    while acked < 2 {
        match session.recv().await {
            Response::Appended(a) => acked = a.producer_seq,
            other => panic!("unexpected {other:?}"),
        }
    }
    session.exited(&id, 1, ExitStatus::Code(0)).await;
    let info = wait_state(socket, &id, ExecState::Completed).await;
    assert_eq!(info.last_exit, Some(ExitStatus::Code(0)));
    assert_eq!(info.pid, None);
    assert!(list(socket, false).await.iter().all(|e| e.id != id));
    match call(socket, Request::Status).await {
        Response::Status(status) => assert_eq!(status.executions, 1),
        other => panic!("unexpected {other:?}"),
    }

    // The shim exits after its exit was recorded: that is not a loss.
    kill(shim);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ps(socket, &id).await.state, ExecState::Completed);

    let frames = stream(socket, &id).await;
    let expected = [
        (
            FrameKind::Event,
            "submitted: sh -c 'echo hi' (restart never)".to_owned(),
        ),
        (
            FrameKind::Event,
            "starting attempt 1: sh -c 'echo hi'".to_owned(),
        ),
        (FrameKind::Event, format!("started pid {}", worker.id.pid)),
        (FrameKind::Stdout, "hi".to_owned()),
        (FrameKind::Stdout, "there".to_owned()),
        (FrameKind::Event, "exited 0".to_owned()),
        (FrameKind::Event, "completed".to_owned()),
    ];
    assert_eq!(frames, expected);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_worker_is_restarted_with_backoff_until_it_succeeds() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let id = run(socket, spec(&["agent"], RestartPolicy::OnFailure)).await;
    let mut exits_at = Vec::new();
    for (attempt, code) in [(1, 1), (2, 1), (3, 0)] {
        let shim = env.shim_of(&id, attempt).await;
        if let Some(exited) = exits_at.last() {
            let waited = Instant::now().duration_since(*exited);
            let least = Duration::from_millis(if attempt == 2 { 400 } else { 800 });
            assert!(waited >= least, "attempt {attempt} after only {waited:?}");
        }
        let worker = Worker::sleeper();
        let mut session = Client::shim(socket, &id, attempt, shim, Some(worker.id)).await;
        session.exited(&id, attempt, ExitStatus::Code(code)).await;
        exits_at.push(Instant::now());
        if code != 0 {
            let info = ps(socket, &id).await;
            assert_eq!(info.state, ExecState::Backoff);
            assert_eq!(info.last_exit, Some(ExitStatus::Code(code)));
        }
    }
    let info = wait_state(socket, &id, ExecState::Completed).await;
    assert_eq!((info.attempt, info.restarts), (3, 2));
    let events = events(socket, &id).await;
    let story = [
        "submitted: agent (restart on-failure)",
        "starting attempt 1: agent",
        "started pid ",
        "exited 1",
        "restarting in ",
        "starting attempt 2: agent",
        "started pid ",
        "exited 1",
        "restarting in ",
        "starting attempt 3: agent",
        "started pid ",
        "exited 0",
        "completed",
    ];
    assert_eq!(events.len(), story.len(), "{events:?}");
    for (event, expected) in events.iter().zip(story) {
        assert!(
            event.starts_with(expected),
            "{event:?} is not {expected:?}: {events:?}"
        );
    }
    assert!(events[4].starts_with("restarting in") && events[4].ends_with("(attempt 2)"));
    assert!(events[8].ends_with("(attempt 3)"), "{events:?}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_75_is_retried_at_once_and_exit_78_never() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let id = run(socket, spec(&["agent"], RestartPolicy::Always)).await;
    let shim = env.shim_of(&id, 1).await;
    let worker = Worker::sleeper();
    let mut session = Client::shim(socket, &id, 1, shim, Some(worker.id)).await;
    session.exited(&id, 1, ExitStatus::Code(75)).await;
    // At once: the exit's own commit already started attempt 2, with no
    // backoff in between.
    let info = ps(socket, &id).await;
    assert_eq!((info.state, info.attempt), (ExecState::Starting, 2));
    let shim = env.shim_of(&id, 2).await;
    let mut session = Client::shim(socket, &id, 2, shim, Some(worker.id)).await;
    session.exited(&id, 2, ExitStatus::Code(78)).await;
    let info = wait_state(socket, &id, ExecState::Failed).await;
    assert_eq!(info.reason.as_deref(), Some("exit code 78 is not retried"));
    assert_eq!(info.restarts, 1);
    let events = events(socket, &id).await;
    assert_eq!(
        events[events.len() - 2..],
        [
            "exited 78".to_owned(),
            "failed: exit code 78 is not retried".to_owned()
        ]
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !env.has_shim(&id, 3),
        "78 is never retried, even under always"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_start_fails_at_once_with_the_reason() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let id = run(
        socket,
        spec(&["/no/such/program"], RestartPolicy::OnFailure),
    )
    .await;
    let shim = env.shim_of(&id, 1).await;
    let mut session = Client::shim(socket, &id, 1, shim, None).await;
    let why = "No such file or directory (os error 2)".to_owned();
    session
        .exited(&id, 1, ExitStatus::SpawnFailed(why.clone()))
        .await;
    let info = wait_state(socket, &id, ExecState::Failed).await;
    assert_eq!(info.last_exit, Some(ExitStatus::SpawnFailed(why.clone())));
    assert_eq!(
        info.reason,
        Some(format!("the worker could not be started: {why}"))
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !env.has_shim(&id, 2),
        "a command that cannot start is not retried"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_shim_program_fails_the_run_at_once() {
    let env = Env::new();
    let mut config = env.config();
    config.shim = Some(env.path().join("no-such-shim"));
    let daemon = env.start_with(config).await;
    let socket = &daemon.socket;
    let id = run(socket, spec(&["true"], RestartPolicy::Always)).await;
    let info = wait_state(socket, &id, ExecState::Failed).await;
    let reason = info.reason.unwrap();
    assert!(reason.contains("cannot start the shim"), "{reason}");
    assert!(reason.contains("no-such-shim"), "{reason}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_the_right_code() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;

    let (code, message) =
        refusal(call(socket, Request::Run(spec(&[], RestartPolicy::Never))).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert!(message.contains("command is empty"), "{message}");
    let mut bad_env = spec(&["true"], RestartPolicy::Never);
    bad_env.env = vec![("A=B".into(), "1".into())];
    let (code, _) = refusal(call(socket, Request::Run(bad_env)).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);

    let stop = Request::Stop {
        execution: "nope-aaaaaa".into(),
        timeout_ms: 10,
    };
    let (code, message) = refusal(call(socket, stop).await);
    assert_eq!(code, ErrorCode::NOT_FOUND);
    assert!(message.contains("nope-aaaaaa"), "{message}");

    let ghost = ProcessId {
        pid: std::process::id(),
        start_ticks: 1,
    };
    let (code, _) = refusal(call(socket, shim_hello("nope-aaaaaa", 1, ghost, None)).await);
    assert_eq!(code, ErrorCode::NOT_FOUND);

    // An exit report needs the attempt's hello on the same connection.
    let id = run(socket, spec(&["true"], RestartPolicy::Never)).await;
    let shim = env.shim_of(&id, 1).await;
    let exited = Request::WorkerExited(WorkerExited {
        execution: id.clone(),
        attempt: 1,
        status: ExitStatus::Code(0),
    });
    let (code, _) = refusal(call(socket, exited).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    // A process claiming to be the shim is checked against the one started.
    let (code, message) = refusal(call(socket, shim_hello(&id, 1, ghost, None)).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert!(message.contains("is not the shim"), "{message}");

    let mut session = Client::shim(socket, &id, 1, shim, None).await;
    session.exited(&id, 1, ExitStatus::Code(0)).await;
    // A repeated report (a resend after a reconnect) is already recorded.
    session.exited(&id, 1, ExitStatus::Code(0)).await;
    wait_state(socket, &id, ExecState::Completed).await;
    // Once ended, a shim saying hello is told so (and kills its worker).
    let (code, message) = refusal(call(socket, shim_hello(&id, 1, shim, None)).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert!(message.contains("has ended"), "{message}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shim_is_lost_its_worker_killed_and_the_run_restarted() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let id = run(socket, spec(&["agent"], RestartPolicy::OnFailure)).await;
    let shim = env.shim_of(&id, 1).await;
    let mut worker = Worker::sleeper();
    let _session = Client::shim(socket, &id, 1, shim, Some(worker.id)).await;
    wait_state(socket, &id, ExecState::Running).await;
    kill(shim);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        worker.ended().signal(),
        Some(libc::SIGKILL),
        "an orphaned worker must not run next to the next attempt"
    );
    env.shim_of(&id, 2).await;
    let events = events(socket, &id).await;
    assert!(
        events.contains(&format!("lost: shim pid {} is gone", shim.pid)),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("restarting in") && e.ends_with("(attempt 2)")),
        "{events:?}"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_a_worker_that_ignores_sigterm_after_the_timeout() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let id = run(&socket, spec(&["stubborn"], RestartPolicy::Always)).await;
    let shim = env.shim_of(&id, 1).await;
    let mut worker = Worker::spawn("trap '' TERM; while :; do sleep 0.05; done");
    let mut session = Client::shim(&socket, &id, 1, shim, Some(worker.id)).await;
    // Give the shell time to set its trap before the stop's SIGTERM.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopper = {
        let (socket, id) = (socket.clone(), id.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let stop = Request::Stop {
                execution: id,
                timeout_ms: 300,
            };
            (call(&socket, stop).await, started.elapsed())
        })
    };
    // Play the shim: report the worker's end when it comes.
    let status = tokio::task::spawn_blocking(move || worker.ended())
        .await
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "SIGTERM is ignored");
    session
        .exited(&id, 1, ExitStatus::Signal(libc::SIGKILL))
        .await;
    let (answer, took) = stopper.await.unwrap();
    let info = match answer {
        Response::Stopped(info) => info,
        other => panic!("expected Stopped, got {other:?}"),
    };
    assert!(took >= Duration::from_millis(300), "killed after {took:?}");
    assert_eq!(info.state, ExecState::Cancelled);
    assert_eq!(info.last_exit, Some(ExitStatus::Signal(libc::SIGKILL)));
    let events = events(&socket, &id).await;
    assert_eq!(
        events[events.len() - 3..],
        [
            "stopping: SIGTERM, then SIGKILL after 300ms".to_owned(),
            "killed by signal 9".to_owned(),
            "cancelled".to_owned()
        ]
    );
    // Stopping what has ended answers at once with how it ended.
    match call(
        &socket,
        Request::Stop {
            execution: id.clone(),
            timeout_ms: 10,
        },
    )
    .await
    {
        Response::Stopped(again) => assert_eq!(again.state, ExecState::Cancelled),
        other => panic!("expected Stopped, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !env.has_shim(&id, 2),
        "a stopped execution is not restarted"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cancels_a_backing_off_execution_at_once() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let id = run(socket, spec(&["agent"], RestartPolicy::OnFailure)).await;
    let shim = env.shim_of(&id, 1).await;
    let mut session = Client::shim(socket, &id, 1, shim, None).await;
    session.exited(&id, 1, ExitStatus::Code(3)).await;
    let started = Instant::now();
    let stop = Request::Stop {
        execution: id.clone(),
        timeout_ms: 10_000,
    };
    match call(socket, stop).await {
        Response::Stopped(info) => assert_eq!(info.state, ExecState::Cancelled),
        other => panic!("expected Stopped, got {other:?}"),
    }
    // Far sooner than the 10 s the stop would allow a running worker.
    assert!(started.elapsed() < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!env.has_shim(&id, 2), "the cancelled backoff never fires");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_reattaches_live_shims_and_restarts_lost_ones() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    // A: alive across the restart. B: its shim dies while the daemon is
    // down. C: backing off when the daemon stops.
    let a = run(&socket, spec(&["a"], RestartPolicy::OnFailure)).await;
    let b = run(&socket, spec(&["b"], RestartPolicy::OnFailure)).await;
    let c = run(&socket, spec(&["c"], RestartPolicy::OnFailure)).await;
    let (shim_a, shim_b, shim_c) = (
        env.shim_of(&a, 1).await,
        env.shim_of(&b, 1).await,
        env.shim_of(&c, 1).await,
    );
    let mut worker_a = Worker::sleeper();
    let mut worker_b = Worker::sleeper();
    drop(Client::shim(&socket, &a, 1, shim_a, Some(worker_a.id)).await);
    drop(Client::shim(&socket, &b, 1, shim_b, Some(worker_b.id)).await);
    let mut session_c = Client::shim(&socket, &c, 1, shim_c, None).await;
    session_c.exited(&c, 1, ExitStatus::Code(1)).await;
    wait_state(&socket, &a, ExecState::Running).await;
    wait_state(&socket, &b, ExecState::Running).await;
    daemon.stop().await;

    kill(shim_b);
    let daemon = env.start().await;
    // A's shim reconnects and is taken back as it was.
    let events_before = events(&socket, &a).await;
    drop(Client::shim(&socket, &a, 1, shim_a, Some(worker_a.id)).await);
    let info = ps(&socket, &a).await;
    assert_eq!((info.state, info.attempt), (ExecState::Running, 1));
    assert_eq!(info.pid, Some(worker_a.id.pid));
    assert!(worker_a.is_running());
    // B is lost, its worker killed, and it is restarted.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(worker_b.ended().signal(), Some(libc::SIGKILL));
    env.shim_of(&b, 2).await;
    // C's backoff timer survived the restart.
    env.shim_of(&c, 2).await;
    assert_eq!(
        events(&socket, &a).await,
        events_before,
        "nothing happened to A"
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_naming_a_reused_pid_is_lost_and_that_process_left_alone() {
    let env = Env::new();
    std::fs::create_dir_all(env.state_dir()).unwrap();
    // Unrelated live processes whose pids a stale manifest names, with
    // start times that are not theirs: as if the pids had been reused.
    let mut stranger_shim = Worker::sleeper();
    let mut stranger_worker = Worker::sleeper();
    let boot = procfs::boot_id().unwrap();
    let mut stale = Manifest::new(
        "stale-aaaaaa".into(),
        spec(&["agent"], RestartPolicy::Never).into(),
        1,
        boot.clone(),
    );
    stale.state = ExecState::Running;
    stale.attempt = 1;
    stale.shim = Some(ProcessId {
        start_ticks: stranger_shim.id.start_ticks + 1,
        ..stranger_shim.id
    });
    stale.worker = Some(ProcessId {
        start_ticks: stranger_worker.id.start_ticks + 1,
        ..stranger_worker.id
    });
    let mut rebooted = stale.clone();
    rebooted.id = "rebooted-aaaaaa".into();
    rebooted.boot_id = "00000000-0000-0000-0000-000000000000".into();
    // The right identity, but recorded in another boot.
    rebooted.shim = Some(stranger_shim.id);
    {
        let queue = tetherd::engine::Queue::open(
            &env.config().store_path(),
            tetherd::engine::QueueOptions::default(),
        )
        .unwrap();
        for m in [&stale, &rebooted] {
            queue
                .record_execution(&m.id, m.encode().unwrap(), Vec::new())
                .await
                .unwrap();
        }
        queue.close().await.unwrap();
    }
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let info = wait_state(socket, &stale.id, ExecState::Lost).await;
    assert_eq!(
        info.reason,
        Some(format!("shim pid {} is gone", stranger_shim.id.pid))
    );
    let info = wait_state(socket, &rebooted.id, ExecState::Lost).await;
    assert!(info.reason.unwrap().contains("earlier boot"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        stranger_shim.is_running(),
        "a reused pid is never signalled"
    );
    assert!(
        stranger_worker.is_running(),
        "a reused pid is never signalled"
    );
    daemon.stop().await;
}
