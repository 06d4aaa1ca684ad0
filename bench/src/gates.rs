//! Human gates: how quickly an answer reaches the worker that asked, and
//! what open questions cost the listings.
//!
//! * `answer`: one supervised execution (`sleep` under the real shim) and
//!   one question after another asked for it over the wire, as `tether
//!   ask` does (`Ask`, then `AwaitAnswer`). While the ask waits, the bench
//!   answers over a second connection (`Answer`, as `tether answer` sends
//!   it; no CLI process is started, so process start-up is not counted).
//!   Measured from sending the answer to the asker receiving the closed
//!   question (the moment `tether ask` would return), and to the answer's
//!   own acknowledgement.
//! * `questions`: E executions (`sleep` under the real shim), `ps`
//!   (`ListExecutionsFull`) and `questions` (`ListQuestions`) timed with
//!   none open, then again after N questions spread over the E executions
//!   (N asks, not N waiting executions: ten thousand workers would measure
//!   the machine's process table, not the daemon).

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tether_protocol::{
    AnswerSpec, AskSpec, Capabilities, ExecState, ExecutionDetail, QuestionInfo, Request, Response,
    RestartPolicy, RunSpec,
};

use tether_bench::{call, connect, next, percentile, BoxError, Conn, Daemon};

use crate::common::STARTUP_PATIENCE;
use crate::progress::Progress;
use crate::Args;

/// How long the worker sleeps: longer than any run.
const WORKER: [&str; 2] = ["sleep", "86400"];

/// The pause between an ask and its answer, so that the asker's
/// `AwaitAnswer` is waiting in the daemon when the answer comes, as it is
/// when a person answers.
const THINKING: Duration = Duration::from_millis(20);

/// How long `AwaitAnswer` waits, as `tether ask` asks.
const AWAIT_MS: u64 = 30_000;

/// Times each listing is taken, with and without open questions.
const LISTINGS: usize = 21;

/// A connection for control requests.
async fn open(socket: &Path) -> Result<Conn, BoxError> {
    connect(socket, STARTUP_PATIENCE, Capabilities::NONE, "tether-bench").await
}

/// Starts `count` sleeping executions and waits until each runs; returns
/// their ids.
async fn start_workers(conn: &mut Conn, count: usize) -> Result<Vec<String>, BoxError> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let spec = RunSpec {
            name: Some(format!("gate{n}")),
            command: WORKER.iter().map(|s| (*s).to_owned()).collect(),
            cwd: None,
            env: Vec::new(),
            restart: RestartPolicy::Never,
            max_restarts: None,
            deadline_ms: None,
        };
        match call(conn, Request::Run(spec)).await? {
            Response::Started { execution } => ids.push(execution),
            other => return Err(format!("expected Started, got {other:?}").into()),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live = executions(conn).await?;
        let running = live
            .iter()
            .filter(|e| e.info.state == ExecState::Running)
            .count();
        if running == count {
            return Ok(ids);
        }
        if Instant::now() > deadline {
            return Err(format!("only {running} of {count} workers run after 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `ListExecutionsFull` for the live executions, its parts joined.
async fn executions(conn: &mut Conn) -> Result<Vec<ExecutionDetail>, BoxError> {
    conn.send(Request::ListExecutionsFull { all: false })
        .await?;
    let mut all = Vec::new();
    loop {
        match next(conn).await? {
            Response::ExecutionsFullPart(part) => all.extend(part),
            Response::ExecutionsFull(last) => {
                all.extend(last);
                return Ok(all);
            }
            other => return Err(format!("expected ExecutionsFull, got {other:?}").into()),
        }
    }
}

/// `ListQuestions` for the open ones, its parts joined.
async fn open_questions(conn: &mut Conn) -> Result<Vec<QuestionInfo>, BoxError> {
    conn.send(Request::ListQuestions {
        all: false,
        execution: None,
        after: 0,
        wait_ms: 0,
    })
    .await?;
    let mut all = Vec::new();
    loop {
        match next(conn).await? {
            Response::QuestionsPart(part) => all.extend(part),
            Response::Questions(last) => {
                all.extend(last);
                return Ok(all);
            }
            other => return Err(format!("expected Questions, got {other:?}").into()),
        }
    }
}

/// Asks question `n` (text `Question n?`, yes or no) for `execution`.
async fn ask(conn: &mut Conn, execution: &str, n: u64) -> Result<QuestionInfo, BoxError> {
    let spec = AskSpec {
        execution: execution.to_owned(),
        text: format!("Question {n}?"),
        choices: vec!["yes".into(), "no".into()],
        timeout_ms: None,
        default: None,
        key: None,
        // One ask per nonce; the bench never asks again after a reconnect.
        nonce: n,
    };
    match call(conn, Request::Ask(spec)).await? {
        Response::Question(q) if q.outcome.is_none() => Ok(q),
        other => Err(format!("expected an open Question, got {other:?}").into()),
    }
}

/// What the `answer` workload measured, in ms.
pub struct AnswerFigures {
    pub questions: usize,
    /// Answer sent → the asker has the closed question.
    pub ask_returns: Vec<f64>,
    /// Answer sent → the answer acknowledged (durable).
    pub answer_acked: Vec<f64>,
}

/// The `answer` workload: `questions` asked and answered one at a time.
pub async fn answer(
    tetherd: &Path,
    dir: &Path,
    questions: usize,
) -> Result<AnswerFigures, BoxError> {
    let (_daemon, socket) = Daemon::start(tetherd, dir, &[])?;
    let mut asker = open(&socket).await?;
    let ids = start_workers(&mut asker, 1).await?;
    let result = ask_and_answer(&socket, &mut asker, &ids[0], questions).await;
    finish(&socket, ids, result).await
}

async fn ask_and_answer(
    socket: &Path,
    asker: &mut Conn,
    execution: &str,
    questions: usize,
) -> Result<AnswerFigures, BoxError> {
    let mut answerer = open(socket).await?;
    let warmup = questions / 10;
    let progress = Progress::start("answer".into(), (questions + warmup) as u64);
    let mut ask_returns = Vec::with_capacity(questions);
    let mut answer_acked = Vec::with_capacity(questions);
    for n in 0..questions + warmup {
        let q = ask(asker, execution, n as u64).await?;
        asker
            .send(Request::AwaitAnswer {
                question: q.id,
                wait_ms: AWAIT_MS,
            })
            .await?;
        tokio::time::sleep(THINKING).await;
        let sent = Instant::now();
        let request = Request::Answer(AnswerSpec {
            execution: execution.to_owned(),
            question: Some(q.id),
            answer: "yes".into(),
        });
        let asked = async {
            let r = next(asker).await;
            (r, sent.elapsed())
        };
        let acked = async {
            let r = call(&mut answerer, request).await;
            (r, sent.elapsed())
        };
        let ((got, got_after), (ack, ack_after)) = tokio::join!(asked, acked);
        match got? {
            Response::Question(closed) if closed.outcome.is_some() => {}
            other => return Err(format!("the asker got {other:?}, not its answer").into()),
        }
        match ack? {
            Response::Question(_) => {}
            other => return Err(format!("the answer got {other:?}").into()),
        }
        if n >= warmup {
            ask_returns.push(got_after.as_secs_f64() * 1e3);
            answer_acked.push(ack_after.as_secs_f64() * 1e3);
        }
        progress.set(n as u64 + 1);
    }
    Ok(AnswerFigures {
        questions,
        ask_returns,
        answer_acked,
    })
}

/// Removes the executions (stopping their workers, which would otherwise
/// outlive the daemon under their shims), then returns `result`.
async fn finish<T>(
    socket: &Path,
    ids: Vec<String>,
    result: Result<T, BoxError>,
) -> Result<T, BoxError> {
    let removed = async {
        let mut conn = open(socket).await?;
        let request = Request::Remove {
            executions: ids,
            force: true,
        };
        match call(&mut conn, request).await? {
            Response::Removed(_) => Ok(()),
            other => Err::<(), BoxError>(format!("expected Removed, got {other:?}").into()),
        }
    }
    .await;
    let value = result?;
    removed.map_err(|e| format!("cannot stop the workers: {e}"))?;
    Ok(value)
}

/// What the `questions` workload measured: median ms of each listing.
pub struct ListingFigures {
    pub executions: usize,
    pub questions: usize,
    pub ps_none: f64,
    pub ps_open: f64,
    pub questions_none: f64,
    pub questions_open: f64,
}

/// The `questions` workload.
pub async fn listings(
    tetherd: &Path,
    dir: &Path,
    executions_wanted: usize,
    questions: usize,
) -> Result<ListingFigures, BoxError> {
    let (_daemon, socket) = Daemon::start(tetherd, dir, &[])?;
    let mut conn = open(&socket).await?;
    let ids = start_workers(&mut conn, executions_wanted).await?;
    let result = ask_and_list(&mut conn, &ids, questions).await;
    finish(&socket, ids, result).await
}

async fn ask_and_list(
    conn: &mut Conn,
    ids: &[String],
    questions: usize,
) -> Result<ListingFigures, BoxError> {
    let (ps_none, questions_none) = time_listings(conn, 0).await?;
    let progress = Progress::start("questions".into(), questions as u64);
    for n in 0..questions {
        ask(conn, &ids[n % ids.len()], n as u64).await?;
        progress.set(n as u64 + 1);
    }
    drop(progress);
    let waiting = executions(conn)
        .await?
        .iter()
        .filter(|e| e.info.state == ExecState::Waiting)
        .count();
    if waiting != ids.len().min(questions) {
        return Err(format!("{waiting} of {} executions are waiting", ids.len()).into());
    }
    let (ps_open, questions_open) = time_listings(conn, questions).await?;
    Ok(ListingFigures {
        executions: ids.len(),
        questions,
        ps_none,
        ps_open,
        questions_none,
        questions_open,
    })
}

/// The median ms of `ListExecutionsFull` and of `ListQuestions`, each
/// checked to list `open` questions.
async fn time_listings(conn: &mut Conn, open: usize) -> Result<(f64, f64), BoxError> {
    let mut ps = Vec::with_capacity(LISTINGS);
    let mut qs = Vec::with_capacity(LISTINGS);
    // All the `ps` runs first: one right after a listing of thousands of
    // questions would be timing that listing's memory being given back.
    for _ in 0..LISTINGS {
        let started = Instant::now();
        executions(conn).await?;
        ps.push(started.elapsed().as_secs_f64() * 1e3);
    }
    for _ in 0..LISTINGS {
        let started = Instant::now();
        let listed = open_questions(conn).await?.len();
        qs.push(started.elapsed().as_secs_f64() * 1e3);
        if listed != open {
            return Err(format!("ListQuestions listed {listed} open questions, not {open}").into());
        }
    }
    Ok((median(ps), median(qs)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// `(p50, p99, max)` of samples in ms.
pub fn spread(samples: &[f64]) -> (f64, f64, f64) {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    (
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(0.0),
    )
}

/// Runs `--workload answer` or `--workload questions` and prints its
/// figures (a table, or one JSON object with `--json`).
pub async fn run(args: &Args, questions_workload: bool, tetherd: &Path) -> Result<(), BoxError> {
    let temp = tempfile::Builder::new()
        .prefix("tb")
        .tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
    if questions_workload {
        let questions = args.questions.unwrap_or(10_000);
        let f = listings(tetherd, temp.path(), args.executions, questions).await?;
        print_listings(args.json, &f);
    } else {
        let questions = args.questions.unwrap_or(100);
        let f = answer(tetherd, temp.path(), questions).await?;
        print_answer(args.json, &f);
    }
    Ok(())
}

fn print_answer(json: bool, f: &AnswerFigures) {
    let (ask50, ask99, ask_max) = spread(&f.ask_returns);
    let (ack50, ack99, ack_max) = spread(&f.answer_acked);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "workload": "answer",
                "questions": f.questions,
                "ask_returns_p50_ms": ask50,
                "ask_returns_p99_ms": ask99,
                "ask_returns_max_ms": ask_max,
                "answer_acked_p50_ms": ack50,
                "answer_acked_p99_ms": ack99,
                "answer_acked_max_ms": ack_max,
            })
        );
        return;
    }
    println!(
        "answer: {} questions asked and answered one at a time over the wire \
         (a tenth more first, not counted); ms from sending the answer",
        f.questions
    );
    println!("{:<22} {:>9} {:>9} {:>9}", "", "p50", "p99", "max");
    println!(
        "{:<22} {ask50:>9.3} {ask99:>9.3} {ask_max:>9.3}",
        "the ask returns"
    );
    println!(
        "{:<22} {ack50:>9.3} {ack99:>9.3} {ack_max:>9.3}",
        "the answer is acked"
    );
}

fn print_listings(json: bool, f: &ListingFigures) {
    let ratio = |open: f64, none: f64| if none > 0.0 { open / none } else { 0.0 };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "workload": "questions",
                "executions": f.executions,
                "questions": f.questions,
                "ps_none_open_ms": f.ps_none,
                "ps_open_ms": f.ps_open,
                "ps_ratio": ratio(f.ps_open, f.ps_none),
                "questions_none_open_ms": f.questions_none,
                "questions_open_ms": f.questions_open,
                "questions_ratio": ratio(f.questions_open, f.questions_none),
            })
        );
        return;
    }
    println!(
        "questions: {} executions, {} open questions spread over them; median ms of {LISTINGS}",
        f.executions, f.questions
    );
    println!(
        "{:<34} {:>10} {:>10} {:>8}",
        "", "none open", "open", "ratio"
    );
    println!(
        "{:<34} {:>10.3} {:>10.3} {:>8.2}",
        "ps (ListExecutionsFull)",
        f.ps_none,
        f.ps_open,
        ratio(f.ps_open, f.ps_none)
    );
    println!(
        "{:<34} {:>10.3} {:>10.3} {:>8.2}",
        "questions (ListQuestions, open)",
        f.questions_none,
        f.questions_open,
        ratio(f.questions_open, f.questions_none)
    );
}
