//! Questions and inboxes end to end through the socket: asking, waiting,
//! answering (the first answer wins), keys and nonces across attempts,
//! timeouts (also across a daemon restart), the `waiting` state, inbox
//! order, bound and survival, and removal with the execution.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_protocol::{
    AnswerSpec, Answerer, AskSpec, ErrorCode, ExecState, ExecutionInfo, ExitStatus, FrameKind,
    InboxMessage, QuestionInfo, Request, Response, RestartPolicy, RunSpec, StartAt, Subscribe,
};
use tetherd::supervisor::procfs::{self, ProcessId};

use crate::support::*;

/// A stand-in worker: a real process with a real identity.
struct Worker(Child);

impl Worker {
    fn new() -> (Worker, ProcessId) {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        let id = procfs::identify(child.id()).unwrap();
        (Worker(child), id)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An execution whose attempt `attempt` runs, with its shim's session.
struct Running {
    id: String,
    _worker: Worker,
    worker_id: ProcessId,
    session: Client,
}

async fn run(socket: &Path, restart: RestartPolicy) -> String {
    let spec = RunSpec {
        name: None,
        command: vec!["work".into()],
        cwd: None,
        env: Vec::new(),
        restart,
        max_restarts: None,
        deadline_ms: None,
    };
    match call(socket, Request::Run(spec)).await {
        Response::Started { execution } => execution,
        other => panic!("expected Started, got {other:?}"),
    }
}

async fn attach(env: &Env, socket: &Path, id: &str, attempt: u32) -> Running {
    let shim = env.shim_of(id, attempt).await;
    let (worker, worker_id) = Worker::new();
    let session = Client::shim(socket, id, attempt, shim, Some(worker_id)).await;
    wait_state(socket, id, ExecState::Running).await;
    Running {
        id: id.to_owned(),
        _worker: worker,
        worker_id,
        session,
    }
}

async fn running(env: &Env, socket: &Path, restart: RestartPolicy) -> Running {
    let id = run(socket, restart).await;
    attach(env, socket, &id, 1).await
}

async fn ps(socket: &Path, id: &str) -> ExecutionInfo {
    match call(socket, Request::ListExecutions { all: true }).await {
        Response::Executions(list) => list.into_iter().find(|e| e.id == id).unwrap(),
        other => panic!("expected Executions, got {other:?}"),
    }
}

async fn wait_state(socket: &Path, id: &str, state: ExecState) -> ExecutionInfo {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = ps(socket, id).await;
        if info.state == state {
            return info;
        }
        assert!(Instant::now() < deadline, "{id} never {state:?}: {info:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ask_spec(id: &str, text: &str, choices: &[&str], nonce: u64) -> AskSpec {
    AskSpec {
        execution: id.into(),
        text: text.into(),
        choices: choices.iter().map(|c| c.to_string()).collect(),
        timeout_ms: None,
        default: None,
        key: None,
        nonce,
    }
}

async fn ask(socket: &Path, spec: AskSpec) -> QuestionInfo {
    question(call(socket, Request::Ask(spec)).await)
}

fn question(response: Response) -> QuestionInfo {
    match response {
        Response::Question(q) => q,
        other => panic!("expected Question, got {other:?}"),
    }
}

fn answer(id: &str, question: Option<u64>, text: &str) -> Request {
    Request::Answer(AnswerSpec {
        execution: id.into(),
        question,
        answer: text.into(),
    })
}

async fn await_answer(socket: PathBuf, question: u64) -> QuestionInfo {
    let request = Request::AwaitAnswer {
        question,
        wait_ms: 30_000,
    };
    let mut client = Client::connect(&socket).await;
    loop {
        let q = self::question(client.call(request.clone()).await);
        if q.outcome.is_some() {
            return q;
        }
    }
}

fn refusal(response: Response) -> (ErrorCode, String) {
    match response {
        Response::Error(e) => (e.code, e.message),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The frames of kinds `ask` and `answer` on the execution's stream.
async fn gate_frames(socket: &Path, id: &str) -> Vec<(u64, FrameKind, String)> {
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
            Response::Durable(d) => {
                if matches!(d.frame.kind, FrameKind::Ask | FrameKind::Answer) {
                    let text = String::from_utf8_lossy(&d.frame.payload).into_owned();
                    frames.push((d.seq, d.frame.kind, text));
                }
            }
            Response::End { .. } => return frames,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// This process's uid and the name the daemon gives it.
fn me() -> (u32, String) {
    let uid = tether_protocol::paths::current_uid();
    let name = match uid {
        0 => "root".to_owned(),
        uid => tetherd::access::user_name(uid).unwrap(),
    };
    (uid, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_answered_once_and_its_waiter_gets_the_answer() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let run = running(&env, socket, RestartPolicy::Never).await;
    let id = run.id.as_str();

    let asked = ask(socket, ask_spec(id, "Deploy?", &["yes", "no"], 1)).await;
    assert_eq!(
        (asked.id, asked.key.as_str(), asked.attempt, &asked.outcome),
        (1, "Deploy?#0", 1, &None)
    );
    let info = wait_state(socket, id, ExecState::Waiting).await;
    assert_eq!(info.reason.as_deref(), Some("Deploy?"));
    let waiter = tokio::spawn(await_answer(socket.clone(), asked.id));

    let (code, message) = refusal(call(socket, answer(id, None, "maybe")).await);
    assert_eq!(code, ErrorCode::INVALID_ANSWER);
    assert_eq!(
        message,
        format!("\"maybe\" is not one of the choices of question 1 of {id}: yes, no")
    );
    let answered = question(call(socket, answer(id, None, "yes")).await);
    let (uid, name) = me();
    let outcome = answered.outcome.clone().unwrap();
    assert_eq!(outcome.answer.as_deref(), Some("yes"));
    assert_eq!(
        outcome.by,
        Answerer::User {
            uid,
            name: Some(name.clone())
        }
    );
    assert_eq!(waiter.await.unwrap(), answered);

    let (code, message) = refusal(call(socket, answer(id, Some(1), "no")).await);
    assert_eq!(code, ErrorCode::ALREADY_ANSWERED);
    assert_eq!(
        message,
        format!("question 1 of {id} was already answered: \"yes\" by uid {uid} ({name})")
    );
    let (code, message) = refusal(call(socket, answer(id, None, "no")).await);
    assert_eq!(code, ErrorCode::NOT_FOUND);
    assert_eq!(message, format!("execution {id} has no open question"));
    let info = wait_state(socket, id, ExecState::Running).await;
    assert_eq!(info.reason, None);

    assert_eq!(
        gate_frames(socket, id).await,
        [
            (
                asked.seq,
                FrameKind::Ask,
                r#"{"question":1,"text":"Deploy?","choices":["yes","no"],"key":"Deploy?#0","default":null,"timeout_ms":null}"#.to_owned()
            ),
            (
                outcome.seq,
                FrameKind::Answer,
                format!(r#"{{"question":1,"answer":"yes","by":{{"uid":{uid},"user":"{name}"}}}}"#)
            ),
        ]
    );
    drop(run);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_nonces_find_the_recorded_question_across_attempts() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = &daemon.socket;
    let mut first = running(&env, socket, RestartPolicy::OnFailure).await;
    let id = first.id.clone();
    let deploy = |nonce| ask_spec(&id, "Deploy?", &[], nonce);

    assert_eq!(ask(socket, deploy(1)).await.id, 1);
    assert_eq!(ask(socket, deploy(1)).await.id, 1, "a nonce repeat");
    let second = ask(socket, deploy(2)).await;
    assert_eq!((second.id, second.key.as_str()), (2, "Deploy?#1"));
    let mut ship = ask_spec(&id, "Ship?", &[], 3);
    ship.key = Some("release".into());
    assert_eq!(ask(socket, ship.clone()).await.id, 3);
    ship.nonce = 4;
    assert_eq!(ask(socket, ship).await.id, 3, "the same key");
    question(call(socket, answer(&id, Some(1), "go")).await);
    let (code, message) = refusal(call(socket, answer(&id, None, "go")).await);
    assert_eq!(code, ErrorCode::INVALID_ANSWER);
    assert_eq!(
        message,
        format!(
            "execution {id} has 2 open questions; say which one with --question: \
             2 (\"Deploy?\"), 3 (\"Ship?\")"
        )
    );

    // Attempt 2: the questions attempt 1 left open do not make it wait.
    first.session.exited(&id, 1, ExitStatus::Code(1)).await;
    let _second = attach(&env, socket, &id, 2).await;
    let again = ask(socket, deploy(5)).await;
    assert_eq!(
        (again.id, again.outcome.unwrap().answer.as_deref()),
        (1, Some("go"))
    );
    assert_eq!(ask(socket, deploy(6)).await.id, 2);
    let info = wait_state(socket, &id, ExecState::Waiting).await;
    assert_eq!((info.attempt, info.reason.as_deref()), (2, Some("Deploy?")));
    let third = ask(socket, deploy(7)).await;
    assert_eq!(
        (third.id, third.key.as_str(), third.attempt),
        (4, "Deploy?#2", 2)
    );
    assert_eq!(ask(socket, deploy(5)).await.id, 1, "counted once");
    assert_eq!(ask(socket, deploy(8)).await.key, "Deploy?#3");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_time_out_with_their_default_or_none_also_across_a_restart() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let run = running(&env, &socket, RestartPolicy::Never).await;
    let id = run.id.clone();

    let mut quick = ask_spec(&id, "Quick?", &["yes", "no"], 1);
    quick.timeout_ms = Some(100);
    quick.default = Some("no".into());
    let asked = ask(&socket, quick).await;
    let closed = await_answer(socket.clone(), asked.id).await;
    let outcome = closed.outcome.unwrap();
    assert_eq!(
        (outcome.answer.as_deref(), &outcome.by),
        (Some("no"), &Answerer::Timeout)
    );
    let frames = gate_frames(&socket, &id).await;
    assert_eq!(
        frames[1],
        (
            outcome.seq,
            FrameKind::Answer,
            r#"{"question":1,"answer":"no","by":"timeout"}"#.to_owned()
        )
    );

    let mut slow = ask_spec(&id, "Slow?", &[], 2);
    slow.timeout_ms = Some(2_000);
    let asked = ask(&socket, slow).await;
    let deadline = asked.deadline_micros.unwrap();
    drop(run);
    daemon.stop().await;
    // Down past the deadline: the next daemon closes it as it starts.
    while tetherd_now() <= deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let daemon = env.start().await;
    let closed = await_answer(socket.clone(), asked.id).await;
    let outcome = closed.outcome.unwrap();
    assert_eq!((outcome.answer, outcome.by), (None, Answerer::Timeout));
    daemon.stop().await;
}

fn tetherd_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_execution_comes_back_waiting_after_a_daemon_restart() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let run = running(&env, &socket, RestartPolicy::Never).await;
    let id = run.id.clone();
    ask(&socket, ask_spec(&id, "Still there?", &[], 1)).await;
    wait_state(&socket, &id, ExecState::Waiting).await;
    daemon.stop().await;

    let daemon = env.start().await;
    let shim = env.shim_of(&id, 1).await;
    let _session = Client::shim(&socket, &id, 1, shim, Some(run.worker_id)).await;
    let info = wait_state(&socket, &id, ExecState::Waiting).await;
    assert_eq!(info.reason.as_deref(), Some("Still there?"));
    question(call(&socket, answer(&id, None, "yes")).await);
    wait_state(&socket, &id, ExecState::Running).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_told_of_shutdown_instead_of_holding_it_up() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let run = running(&env, &socket, RestartPolicy::Never).await;
    let asked = ask(&socket, ask_spec(&run.id, "Hold?", &[], 1)).await;
    let mut waiter = Client::connect(&socket).await;
    waiter
        .send(Request::AwaitAnswer {
            question: asked.id,
            wait_ms: 60_000,
        })
        .await;
    // Known to be waiting once a later request on another connection is
    // served; then the daemon stops.
    ps(&socket, &run.id).await;
    let stopping = tokio::spawn(daemon.stop());
    let (code, _) = refusal(waiter.recv().await);
    assert_eq!(code, ErrorCode::SHUTTING_DOWN);
    stopping.await.unwrap();
}

async fn send(socket: &Path, id: &str, text: &'static str) -> Response {
    let request = Request::Send {
        execution: id.into(),
        message: Bytes::from_static(text.as_bytes()),
    };
    call(socket, request).await
}

async fn recv(socket: &Path, id: &str, max: u32, wait_ms: u64) -> Vec<InboxMessage> {
    let request = Request::Recv {
        execution: id.into(),
        max,
        wait_ms,
    };
    match call(socket, request).await {
        Response::Messages(messages) => messages,
        other => panic!("expected Messages, got {other:?}"),
    }
}

fn texts(messages: &[InboxMessage]) -> Vec<(u64, &str)> {
    messages
        .iter()
        .map(|m| (m.id, std::str::from_utf8(&m.data).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_keeps_messages_in_order_until_dequeued_within_its_bound() {
    let env = Env::new();
    let mut config = env.config();
    config.inbox_max_messages = 3;
    let daemon = env.start_with(config.clone()).await;
    let socket = daemon.socket.clone();
    let run = running(&env, &socket, RestartPolicy::Never).await;
    let id = run.id.clone();

    assert!(recv(&socket, &id, 10, 0).await.is_empty());
    let waiter = {
        let (socket, id) = (socket.clone(), id.clone());
        tokio::spawn(async move { recv(&socket, &id, 10, 30_000).await })
    };
    assert!(matches!(
        send(&socket, &id, "one").await,
        Response::Queued { id: 1 }
    ));
    assert_eq!(texts(&waiter.await.unwrap()), [(1, "one")]);
    assert!(matches!(
        send(&socket, &id, "two").await,
        Response::Queued { id: 2 }
    ));
    assert!(matches!(
        send(&socket, &id, "three").await,
        Response::Queued { id: 3 }
    ));
    let (code, message) = refusal(send(&socket, &id, "four").await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert_eq!(
        message,
        format!("the inbox of execution {id} is full: 3 messages wait ([inbox] max_messages)")
    );
    assert_eq!(
        texts(&recv(&socket, &id, 2, 0).await),
        [(1, "one"), (2, "two")]
    );
    assert_eq!(recv(&socket, &id, 10, 0).await.len(), 3, "not removed");
    let dequeue = Request::Dequeue {
        execution: id.clone(),
        through: 2,
    };
    assert!(matches!(
        call(&socket, dequeue).await,
        Response::Dequeued(2)
    ));

    drop(run);
    daemon.stop().await;
    let daemon = env.start_with(config).await;
    let left = recv(&socket, &id, 10, 0).await;
    assert_eq!(texts(&left), [(3, "three")]);
    assert_eq!(left[0].sender_uid, tether_protocol::paths::current_uid());
    assert!(matches!(
        send(&socket, &id, "five").await,
        Response::Queued { id: 4 }
    ));
    let (code, _) = refusal(send(&socket, "no-such-run", "x").await);
    assert_eq!(code, ErrorCode::NOT_FOUND);
    let request = Request::Recv {
        execution: "no-such-run".into(),
        max: 1,
        wait_ms: 0,
    };
    let (code, message) = refusal(call(&socket, request).await);
    assert_eq!(
        (code, message.as_str()),
        (ErrorCode::NOT_FOUND, "no such execution \"no-such-run\"")
    );
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_execution_takes_no_questions_or_messages_and_rm_takes_them_away() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let mut run = running(&env, &socket, RestartPolicy::Never).await;
    let id = run.id.clone();
    ask(&socket, ask_spec(&id, "Left open?", &[], 1)).await;
    assert!(matches!(
        send(&socket, &id, "m").await,
        Response::Queued { .. }
    ));
    run.session.exited(&id, 1, ExitStatus::Code(0)).await;
    wait_state(&socket, &id, ExecState::Completed).await;

    let (code, message) =
        refusal(call(&socket, Request::Ask(ask_spec(&id, "Late?", &[], 2))).await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert_eq!(
        message,
        format!("execution {id} has ended (completed): it cannot ask a question")
    );
    let (code, message) = refusal(send(&socket, &id, "late").await);
    assert_eq!(code, ErrorCode::INVALID_REQUEST);
    assert_eq!(
        message,
        format!("execution {id} has ended (completed): its inbox takes no messages")
    );
    let remove = Request::Remove {
        executions: vec![id.clone()],
        force: false,
    };
    assert!(matches!(call(&socket, remove).await, Response::Removed(_)));
    let list = Request::ListQuestions {
        all: true,
        execution: None,
        after: 0,
        wait_ms: 0,
    };
    match call(&socket, list).await {
        Response::Questions(list) => assert!(list.is_empty(), "{list:?}"),
        other => panic!("expected Questions, got {other:?}"),
    }
    let request = Request::Recv {
        execution: id.clone(),
        max: 10,
        wait_ms: 0,
    };
    let (code, _) = refusal(call(&socket, request).await);
    assert_eq!(code, ErrorCode::NOT_FOUND, "gone with its inbox");
    daemon.stop().await;
}

async fn connections(socket: &Path) -> u64 {
    match call(socket, Request::Status).await {
        Response::Status(status) => status.connections,
        other => panic!("expected Status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_hangs_up_ends_its_session() {
    let env = Env::new();
    let daemon = env.start().await;
    let socket = daemon.socket.clone();
    let run = running(&env, &socket, RestartPolicy::Never).await;
    let asked = ask(&socket, ask_spec(&run.id, "Anyone?", &[], 1)).await;
    let mut waiter = Client::connect(&socket).await;
    waiter
        .send(Request::AwaitAnswer {
            question: asked.id,
            wait_ms: 60_000,
        })
        .await;
    // The shim's session, the waiter's and the one asking for the status;
    // the sessions of earlier calls close in their own time.
    let deadline = Instant::now() + WAIT;
    while connections(&socket).await != 3 {
        assert!(
            Instant::now() < deadline,
            "not exactly the waiter and the shim"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(waiter);
    // Its question is still open: only noticing the hang-up ends it.
    while connections(&socket).await != 2 {
        assert!(
            Instant::now() < deadline,
            "the session of a waiter that hung up is still open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(run);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_keeps_questions_and_messages_only_the_log_held() {
    use tether_protocol::{Append, QuestionInfo};
    use tetherd::engine::{GateChange, Queue, QueueOptions};
    use tetherd::gates::QuestionRecord;

    const JOB: &str = "job-gated";
    let dir = tempfile::tempdir().unwrap();
    let (live, state) = (dir.path().join("live"), dir.path().join("state"));
    std::fs::create_dir(&live).unwrap();
    std::fs::create_dir(&state).unwrap();
    let path = live.join(tetherd::store::STORE_FILE);
    let queue = Queue::open(&path, QueueOptions::default()).unwrap();
    let append = |seq: u64| Append {
        stream: "s".into(),
        producer: "p".into(),
        producer_seq: seq,
        kind: FrameKind::Data,
        payload: Bytes::from(format!("frame {seq}")),
    };
    queue.append([append(1), append(2)]).await.unwrap();
    // A durable commit: the store file itself holds the frames and JOB.
    queue
        .record_execution(JOB, b"manifest".to_vec(), Vec::new())
        .await
        .unwrap();
    let record = QuestionRecord {
        info: QuestionInfo {
            id: 1,
            execution: JOB.into(),
            key: "Go?#0".into(),
            text: "Go?".into(),
            choices: Vec::new(),
            default: None,
            asked_micros: 1,
            deadline_micros: None,
            attempt: 1,
            seq: 0,
            outcome: None,
        },
        timeout_ms: None,
        asks: vec![(1, 7)],
    };
    queue
        .gate(GateChange::Question {
            record: Box::new(record),
            frame: Some((FrameKind::Ask, Bytes::from_static(b"{}"))),
            next_id: Some(2),
        })
        .await
        .unwrap();
    let message = InboxMessage {
        id: 1,
        sent_micros: 2,
        sender_uid: 1000,
        data: Bytes::from_static(b"hello"),
    };
    queue
        .gate(GateChange::Send {
            execution: JOB.into(),
            message: message.clone(),
            next_id: 2,
        })
        .await
        .unwrap();
    // As kill -9 leaves them: the last two commits are in the log alone.
    for name in ["tether.redb", "tether.wal"] {
        std::fs::copy(live.join(name), state.join(name)).unwrap();
    }
    queue.close().await.unwrap();
    let copy = state.join(tetherd::store::STORE_FILE);
    tetherd::store::remove_chunk_for_tests(&copy, "s", 1).unwrap();

    let report = tetherd::store::repair::run(&state, tetherd::wal::DEFAULT_CAPACITY).unwrap();
    assert!(report.contains("  s: seqs 1..2"), "{report}");
    let queue = Queue::open(&copy, QueueOptions::default()).unwrap();
    let kept = queue.gates().record(1).unwrap();
    assert_eq!((kept.info.text.as_str(), kept.asks), ("Go?", vec![(1, 7)]));
    assert_eq!(queue.gates().inbox_count(JOB), 1);
    assert_eq!(queue.inbox(JOB, 10, usize::MAX).await.unwrap(), [message]);
    queue.close().await.unwrap();
}
