//! `tether ask`, `answer`, `questions`, `send` and `recv` as real processes:
//! their usage errors without a daemon, and what they send, print and exit
//! with against a stand-in daemon that scripts the answers (including a
//! session lost while `ask` waits).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tether_protocol::{
    Answerer, AskSpec, ErrorCode, ErrorFrame, ExecState, ExecutionDetail, ExecutionInfo,
    InboxMessage, QuestionInfo, QuestionOutcome, Request, Response, RestartPolicy,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

mod fake_daemon;

const ID: &str = "job-abcdef";
const HOUR: u64 = 3_600_000_000;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tether_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tether")
}

#[test]
fn without_an_execution_ask_and_recv_exit_2_naming_both_ways_to_give_one() {
    for args in [vec!["ask", "Deploy?"], vec!["recv"]] {
        let output = std::process::Command::new(tether_bin())
            .args(["--socket", "/nonexistent/s.sock"])
            .args(&args)
            .env_remove("TETHER_EXECUTION_ID")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let err = text(&output.stderr);
        assert!(
            err.contains("--execution") && err.contains("TETHER_EXECUTION_ID"),
            "{err}"
        );
    }
}

#[test]
fn bad_command_lines_of_the_gate_commands_exit_2() {
    for args in [
        vec![
            "ask",
            "--execution",
            "x",
            "--choices",
            "yes,no",
            "--default",
            "maybe",
            "Go?",
        ],
        vec!["ask", "--execution", "x"],
        vec!["ask", "--execution", "x", "--timeout", "soon", "Go?"],
        vec!["answer", "x"],
        vec!["answer", "x", "--question", "three", "yes"],
        vec!["send"],
        vec!["recv", "--execution", "x", "--timeout", "soon"],
    ] {
        let output = std::process::Command::new(tether_bin())
            .args(["--socket", "/nonexistent/s.sock"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    let output = std::process::Command::new(tether_bin())
        .args(["--socket", "/nonexistent/s.sock", "ask", "--execution", "x"])
        .args(["--choices", "yes,no", "--default", "maybe", "Go?"])
        .output()
        .unwrap();
    assert_eq!(
        text(&output.stderr),
        "tether: the default \"maybe\" is not one of the choices (yes, no)\n"
    );
}

/// What the stand-in daemon saw, and how it answers.
#[derive(Default)]
struct State {
    asks: Vec<AskSpec>,
    awaits: usize,
    /// Close the session at the first `AwaitAnswer`, as a restarting
    /// daemon would.
    drop_first_await: bool,
    /// The outcome of the question once awaited.
    outcome: Option<QuestionOutcome>,
    /// The refusal for `Answer`, if any.
    refuse_answer: Option<(ErrorCode, &'static str)>,
    answered: Vec<(String, Option<u64>, String)>,
    listed: Vec<QuestionInfo>,
    inbox: Vec<InboxMessage>,
    sent: Vec<Bytes>,
    dequeued: Vec<u64>,
}

type Shared = Arc<Mutex<State>>;

struct Fake {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state: Shared,
}

impl Fake {
    fn start(state: State) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("d.sock");
        let state = Arc::new(Mutex::new(state));
        let listener = UnixListener::bind(&socket).unwrap();
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Self {
            _dir: dir,
            socket,
            state,
        }
    }

    async fn tether(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = tokio::process::Command::new(tether_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env_remove("TETHER_EXECUTION_ID")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(stdin.unwrap_or_default()).await.unwrap();
        drop(pipe);
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("tether finished")
            .unwrap()
    }
}

fn question(id: u64, text: &str, outcome: Option<QuestionOutcome>) -> QuestionInfo {
    QuestionInfo {
        id,
        execution: ID.into(),
        key: format!("{text}#0"),
        text: text.into(),
        choices: vec!["yes".into(), "no".into()],
        default: None,
        asked_micros: tether::time::now_micros() - 3 * HOUR,
        deadline_micros: None,
        attempt: 1,
        seq: 2,
        outcome,
    }
}

fn by_alice(answer: Option<&str>) -> QuestionOutcome {
    QuestionOutcome {
        answer: answer.map(String::from),
        by: Answerer::User {
            uid: 1000,
            name: Some("alice".into()),
        },
        answered_micros: tether::time::now_micros(),
        seq: 3,
    }
}

fn refusal(code: ErrorCode, message: &str) -> Response {
    Response::Error(ErrorFrame {
        code,
        message: message.into(),
    })
}

async fn serve(stream: UnixStream, state: Shared) {
    let Some(mut session) = fake_daemon::greet(stream).await else {
        return;
    };
    while let Some(Ok(request)) = session.next().await {
        let Some(response) = answer(&state, request) else {
            // The session is lost without an answer.
            return;
        };
        if session.send(response).await.is_err() {
            return;
        }
    }
}

fn answer(state: &Shared, request: Request) -> Option<Response> {
    let mut s = state.lock().unwrap();
    let response = match request {
        Request::Ask(spec) => {
            let text = spec.text.clone();
            s.asks.push(spec);
            let outcome = if s.awaits > 0 {
                s.outcome.clone()
            } else {
                None
            };
            Response::Question(question(5, &text, outcome))
        }
        Request::AwaitAnswer { question: id, .. } => {
            s.awaits += 1;
            if s.drop_first_await && s.awaits == 1 {
                return None;
            }
            let text = s.asks.last().map(|a| a.text.clone()).unwrap_or_default();
            Response::Question(question(id, &text, s.outcome.clone()))
        }
        Request::Answer(spec) => {
            s.answered
                .push((spec.execution, spec.question, spec.answer.clone()));
            if let Some((code, message)) = s.refuse_answer {
                return Some(refusal(code, message));
            }
            Response::Question(question(
                spec.question.unwrap_or(5),
                "Deploy?",
                Some(by_alice(Some(&spec.answer))),
            ))
        }
        Request::ListQuestions { all, after, .. } => {
            let listed = s
                .listed
                .iter()
                .filter(|q| (all || q.outcome.is_none()) && q.id > after)
                .cloned()
                .collect();
            Response::Questions(listed)
        }
        Request::ListExecutionsFull { .. } => {
            let info = ExecutionInfo {
                id: ID.into(),
                name: Some("deploy".into()),
                state: ExecState::Waiting,
                pid: Some(777),
                attempt: 1,
                restarts: 0,
                command: vec!["sh".into()],
                restart: RestartPolicy::OnFailure,
                last_exit: None,
                reason: Some("Deploy?".into()),
                created_micros: 1_700_000_000_000_000,
                stream_last_seq: 2,
                last_checkpoint: None,
            };
            Response::ExecutionsFull(vec![ExecutionDetail::from(info)])
        }
        Request::Send { message, .. } => {
            s.sent.push(message);
            Response::Queued { id: 40 }
        }
        Request::Recv { max, .. } => {
            let max = usize::try_from(max).unwrap();
            Response::Messages(s.inbox.iter().take(max).cloned().collect())
        }
        Request::Dequeue { through, .. } => {
            s.dequeued.push(through);
            let before = s.inbox.len();
            s.inbox.retain(|m| m.id > through);
            Response::Dequeued((before - s.inbox.len()) as u64)
        }
        _ => refusal(ErrorCode::INVALID_REQUEST, "the fake does not do that"),
    };
    Some(response)
}

#[tokio::test]
async fn ask_asks_again_with_the_same_nonce_after_a_lost_session_and_prints_the_answer() {
    let fake = Fake::start(State {
        drop_first_await: true,
        outcome: Some(by_alice(Some("yes"))),
        ..State::default()
    });
    let output = fake
        .tether(
            &[
                "ask",
                "--execution",
                ID,
                "--choices",
                "yes,no",
                "--timeout",
                "1h",
            ],
            None,
        )
        .await;
    // No words: a usage error, nothing sent.
    assert_eq!(output.status.code(), Some(2));
    assert!(fake.state.lock().unwrap().asks.is_empty());

    let output = fake
        .tether(
            &[
                "ask",
                "--execution",
                ID,
                "--choices",
                "yes,no",
                "--timeout",
                "1h",
                "Deploy",
                "to",
                "prod?",
            ],
            None,
        )
        .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "yes\n");
    let s = fake.state.lock().unwrap();
    assert_eq!(s.asks.len(), 2, "asked again on the new session");
    assert_eq!(s.asks[0], s.asks[1], "the same Ask, nonce included");
    let ask = &s.asks[0];
    assert_eq!(ask.text, "Deploy to prod?");
    assert_eq!(ask.choices, ["yes", "no"]);
    assert_eq!(ask.timeout_ms, Some(3_600_000));
    assert_eq!((ask.key.as_deref(), ask.default.as_deref()), (None, None));
    assert_eq!(s.awaits, 1, "the answer came with the second Ask");
}

#[tokio::test]
async fn ask_exits_1_naming_a_question_that_timed_out_with_no_answer() {
    let fake = Fake::start(State {
        outcome: Some(QuestionOutcome {
            answer: None,
            by: Answerer::Timeout,
            answered_micros: 1,
            seq: 3,
        }),
        ..State::default()
    });
    let output = fake
        .tether(&["ask", "--execution", ID, "--key", "k1", "Deploy?"], None)
        .await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        "tether: question 5 timed out with no answer\n"
    );
    assert_eq!(
        fake.state.lock().unwrap().asks[0].key.as_deref(),
        Some("k1")
    );
}

#[tokio::test]
async fn answer_prints_what_it_recorded_and_refusals_exit_as_designed() {
    let fake = Fake::start(State::default());
    let output = fake.tether(&["answer", ID, "ship", "it"], None).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        format!("answered question 5 of {ID}: ship it\n")
    );
    let output = fake
        .tether(&["answer", ID, "--question", "9", "no"], None)
        .await;
    assert_eq!(
        text(&output.stdout),
        format!("answered question 9 of {ID}: no\n")
    );
    assert_eq!(
        fake.state.lock().unwrap().answered,
        [
            (ID.to_owned(), None, "ship it".to_owned()),
            (ID.to_owned(), Some(9), "no".to_owned()),
        ]
    );
    for (code, exit) in [
        (ErrorCode::ALREADY_ANSWERED, 1),
        (ErrorCode::INVALID_ANSWER, 2),
        (ErrorCode::NOT_FOUND, 3),
    ] {
        fake.state.lock().unwrap().refuse_answer = Some((code, "refused here"));
        let output = fake.tether(&["answer", ID, "yes"], None).await;
        assert_eq!(output.status.code(), Some(exit), "{code}");
        assert_eq!(
            text(&output.stderr),
            format!("tether: refused here ({code})\n")
        );
    }
}

#[tokio::test]
async fn questions_lists_open_ones_and_with_all_their_answers() {
    let mut open = question(6, "Which region?", None);
    open.choices.clear();
    let fake = Fake::start(State {
        listed: vec![question(5, "Deploy?", Some(by_alice(Some("yes")))), open],
        ..State::default()
    });
    let output = fake.tether(&["questions"], None).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        format!(
            "EXECUTION   QUESTION  ASKED  CHOICES  TEXT\n\
             {ID}  6         3h     -        Which region?\n"
        )
    );
    let output = fake.tether(&["questions", "--all"], None).await;
    assert_eq!(
        text(&output.stdout),
        format!(
            "EXECUTION   QUESTION  ASKED  CHOICES  TEXT           ANSWER\n\
             {ID}  5         3h     yes,no   Deploy?        yes\n\
             {ID}  6         3h     -        Which region?\n"
        )
    );
    let output = fake.tether(&["questions", "--all", "--json"], None).await;
    let lines: Vec<serde_json::Value> = text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["state"], "answered");
    assert_eq!(lines[0]["answered_by"]["user"], "alice");
    assert_eq!(lines[1]["state"], "open");
}

fn message(id: u64, data: &str) -> InboxMessage {
    InboxMessage {
        id,
        sent_micros: 1,
        sender_uid: 1000,
        data: Bytes::from(data.to_owned()),
    }
}

#[tokio::test]
async fn send_queues_words_or_stdin_and_recv_prints_then_dequeues() {
    let fake = Fake::start(State {
        inbox: vec![
            message(7, "first"),
            message(8, "second\n"),
            message(9, "third"),
        ],
        ..State::default()
    });
    let output = fake.tether(&["send", ID, "stop", "soon"], None).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "");
    let output = fake.tether(&["send", ID], Some(b"from\nstdin")).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        fake.state.lock().unwrap().sent,
        ["stop soon", "from\nstdin"]
    );

    let output = fake.tether(&["recv", "--execution", ID], None).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "first\n");
    assert_eq!(fake.state.lock().unwrap().dequeued, [7]);

    let output = fake
        .tether(&["recv", "--execution", ID, "--all", "--print-id"], None)
        .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "8\tsecond\n9\tthird\n");
    assert_eq!(fake.state.lock().unwrap().dequeued, [7, 9]);

    let output = fake
        .tether(&["recv", "--execution", ID, "--timeout", "200ms"], None)
        .await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        format!("tether: no message for {ID} within 200ms\n")
    );
}

#[tokio::test]
async fn ps_shows_what_a_waiting_execution_asked_and_how_long_ago() {
    let fake = Fake::start(State {
        listed: vec![question(5, "Deploy?", None)],
        ..State::default()
    });
    let output = fake.tether(&["ps"], None).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    let row = table.lines().nth(1).unwrap();
    assert!(
        row.starts_with(&format!("{ID}  deploy  waiting  777")),
        "{table}"
    );
    assert!(row.ends_with("  asked 3h ago: Deploy?"), "{table}");
    let output = fake.tether(&["ps", "--json"], None).await;
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["state"], "waiting");
    assert_eq!(value["question"]["id"], 5);
    assert_eq!(value["question"]["text"], "Deploy?");
    assert_eq!(
        value["question"]["choices"],
        serde_json::json!(["yes", "no"])
    );
}

#[tokio::test]
async fn questions_follow_prints_each_new_question_once_until_killed() {
    let fake = Fake::start(State {
        listed: vec![question(5, "Deploy?", None)],
        ..State::default()
    });
    let mut child = tokio::process::Command::new(tether_bin())
        .arg("--socket")
        .arg(&fake.socket)
        .args(["questions", "--follow"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("a line within the minute")
            .unwrap()
            .expect("tether still running")
    };
    assert_eq!(next().await, "EXECUTION   QUESTION  ASKED  CHOICES  TEXT");
    assert_eq!(
        next().await,
        format!("{ID}  5         3h     yes,no   Deploy?")
    );
    fake.state
        .lock()
        .unwrap()
        .listed
        .push(question(6, "Really?", None));
    assert_eq!(next().await, format!("{ID}  6  3h  yes,no  Really?"));
    child.kill().await.unwrap();
}
