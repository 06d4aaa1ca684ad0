//! The real `tether-shim` binary against a fake daemon that plays tetherd's
//! side of the shim protocol over a real unix socket: ShimHello first on
//! every session, appends stored with the daemon's dedupe rule, then
//! WorkerExited. Each test shapes the fake's sessions (refuse, drop, hold
//! acks back) and checks what the shim sent and how it exited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tether_protocol::codec::encode_frame;
use tether_protocol::{
    Appended, ErrorCode, ErrorFrame, ExitStatus, FrameKind, HelloOk, Request, Response,
    ServerCodec, ShimHello, ShimSpec, WorkerExited, PROTOCOL_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio_util::codec::Framed;

type Session = Framed<UnixStream, ServerCodec>;

const EXECUTION: &str = "job-abcdef";

/// How the fake daemon treats session number `n` (0, 1, ...).
#[derive(Clone, Copy)]
struct Behavior {
    /// Answer ShimHello with this error instead of accepting it.
    refuse_hello: Option<ErrorCode>,
    /// Close the session after reading this many appends on it.
    drop_after_appends: fn(usize) -> Option<usize>,
    /// Never acknowledge producer seqs above this on the session.
    ack_at_most: fn(usize) -> Option<u64>,
    /// Hold acknowledgements back and release one every this often.
    ack_every: Option<Duration>,
    /// Close the session on WorkerExited instead of answering it.
    drop_on_exit: fn(usize) -> bool,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            refuse_hello: None,
            drop_after_appends: |_| None,
            ack_at_most: |_| None,
            ack_every: None,
            drop_on_exit: |_| false,
        }
    }
}

/// What the fake daemon saw.
#[derive(Debug, Default)]
struct Model {
    /// Stored frames: (producer seq, kind, payload), each seq once.
    frames: Vec<(u64, FrameKind, Bytes)>,
    /// Highest producer seq stored.
    high: u64,
    /// Highest producer seq acknowledged to the shim.
    acked: u64,
    /// (stream, producer) of every append.
    names: Vec<(String, String)>,
    /// The first request of each session, by name.
    first_requests: Vec<&'static str>,
    /// The producer seq of the first append of each session that had one.
    first_appends: Vec<u64>,
    hellos: Vec<ShimHello>,
    /// Each WorkerExited with the acked and stored high marks when it came.
    exits: Vec<(WorkerExited, u64, u64)>,
    /// Anything the shim must never do.
    violations: Vec<String>,
}

impl Model {
    fn store(&mut self, seq: u64, kind: FrameKind, payload: Bytes) {
        if seq <= self.high {
            return;
        }
        if seq != self.high + 1 {
            self.violations
                .push(format!("producer seq {seq} after {}: a gap", self.high));
        }
        self.high = seq;
        self.frames.push((seq, kind, payload));
    }

    fn payloads(&self, kind: FrameKind) -> Vec<String> {
        self.frames
            .iter()
            .filter(|(_, k, _)| *k == kind)
            .map(|(_, _, p)| String::from_utf8_lossy(p).into_owned())
            .collect()
    }
}

type Shared = Arc<Mutex<Model>>;

/// A fake daemon on a socket in a temporary directory.
struct Fake {
    dir: tempfile::TempDir,
    socket: PathBuf,
    model: Shared,
}

impl Fake {
    /// A fake that is not listening yet.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tether.sock");
        Self {
            dir,
            socket,
            model: Shared::default(),
        }
    }

    /// Starts listening and serving sessions with `behavior`.
    fn listen(&self, behavior: Behavior) {
        let listener = UnixListener::bind(&self.socket).unwrap();
        let model = self.model.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let mut session = Framed::new(stream, ServerCodec::new());
                let Some(Ok(Request::Hello(_))) = session.next().await else {
                    continue;
                };
                let ok = Response::HelloOk(HelloOk {
                    version: PROTOCOL_VERSION,
                    capabilities: tether_protocol::Capabilities::NONE,
                    daemon: "fake".into(),
                });
                if session.send(ok).await.is_err() {
                    continue;
                }
                tokio::spawn(serve(n, session, model.clone(), behavior));
                n += 1;
            }
        });
    }

    fn spec(&self, command: &[&str]) -> ShimSpec {
        ShimSpec {
            execution: EXECUTION.into(),
            attempt: 2,
            socket: self.socket.to_str().unwrap().into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: vec![],
            resumed: false,
            max_line: 64 * 1024,
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("shim.log")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().unwrap()
    }
}

async fn send(session: &mut Session, response: Response) -> bool {
    session.send(response).await.is_ok()
}

fn appended(seq: u64) -> Response {
    Response::Appended(Appended {
        stream: EXECUTION.into(),
        producer: "shim-job-abcdef-2".into(),
        producer_seq: seq,
        seq,
    })
}

/// Serves one shim session as tetherd would, shaped by `behavior`.
async fn serve(n: usize, mut session: Session, model: Shared, behavior: Behavior) {
    let Some(Ok(first)) = session.next().await else {
        return;
    };
    model.lock().unwrap().first_requests.push(first.name());
    let Request::ShimHello(hello) = first else {
        return;
    };
    model.lock().unwrap().hellos.push(hello);
    if let Some(code) = behavior.refuse_hello {
        let refusal = Response::Error(ErrorFrame {
            code,
            message: format!("no execution {EXECUTION}"),
        });
        send(&mut session, refusal).await;
        return;
    }
    if !send(&mut session, Response::ShimAccepted).await {
        return;
    }
    let limit = (behavior.ack_at_most)(n).unwrap_or(u64::MAX);
    let mut appends = 0;
    // The newest stored seq not yet acknowledged on this session.
    let mut unacked: Option<u64> = None;
    let mut ticker = tokio::time::interval(behavior.ack_every.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            request = session.next() => match request {
                Some(Ok(Request::Append(append))) => {
                    appends += 1;
                    let seq = append.producer_seq;
                    {
                        let mut m = model.lock().unwrap();
                        if appends == 1 {
                            m.first_appends.push(seq);
                        }
                        if m.names.last() != Some(&(append.stream.clone(), append.producer.clone())) {
                            m.names.push((append.stream.clone(), append.producer.clone()));
                        }
                        m.store(seq, append.kind, append.payload);
                    }
                    if seq <= limit {
                        unacked = Some(seq);
                    }
                    if behavior.ack_every.is_none() {
                        if let Some(seq) = unacked.take() {
                            record_ack(&model, seq);
                            if !send(&mut session, appended(seq)).await {
                                return;
                            }
                        }
                    }
                    if Some(appends) == (behavior.drop_after_appends)(n) {
                        return;
                    }
                }
                Some(Ok(Request::WorkerExited(exited))) => {
                    {
                        let mut m = model.lock().unwrap();
                        let marks = (m.acked, m.high);
                        m.exits.push((exited, marks.0, marks.1));
                    }
                    if (behavior.drop_on_exit)(n) {
                        return;
                    }
                    if !send(&mut session, Response::ExitRecorded).await {
                        return;
                    }
                }
                Some(Ok(other)) => {
                    model
                        .lock()
                        .unwrap()
                        .violations
                        .push(format!("unexpected {} on session {n}", other.name()));
                    return;
                }
                _ => return,
            },
            _ = ticker.tick(), if unacked.is_some() => {
                if let Some(seq) = unacked.take() {
                    record_ack(&model, seq);
                    if !send(&mut session, appended(seq)).await {
                        return;
                    }
                }
            }
        }
    }
}

fn record_ack(model: &Shared, seq: u64) {
    let mut m = model.lock().unwrap();
    m.acked = m.acked.max(seq);
}

/// Starts the real shim with `spec` on its stdin and its stderr in `log`.
async fn start_shim(spec: &ShimSpec, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether-shim"))
        .arg(&spec.execution)
        .arg(spec.attempt.to_string())
        .stdin(Stdio::piped())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&encode_frame(spec).unwrap()).await.unwrap();
    drop(stdin);
    child
}

/// Waits for the shim to exit and returns its exit code.
async fn exit_code(fake: &Fake, child: &mut Child) -> i32 {
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap_or_else(|_| panic!("the shim did not exit; its log:\n{}", fake.log_text()))
        .unwrap();
    status
        .code()
        .unwrap_or_else(|| panic!("shim killed: {status:?}; log:\n{}", fake.log_text()))
}

/// Runs the shim to its end against a fake with `behavior`.
async fn run_to_end(fake: &Fake, spec: &ShimSpec, behavior: Behavior) -> i32 {
    fake.listen(behavior);
    let mut child = start_shim(spec, &fake.log()).await;
    exit_code(fake, &mut child).await
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn output_lines_become_frames_in_order_with_their_kinds() {
    let fake = Fake::new();
    let script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; printf tail";
    let spec = fake.spec(&["sh", "-c", script]);
    let code = run_to_end(&fake, &spec, Behavior::default()).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert!(m.violations.is_empty(), "{:?}", m.violations);
    assert_eq!(
        m.payloads(FrameKind::Stdout),
        strings(&["out1", "out2", "out3", "tail"])
    );
    assert_eq!(
        m.payloads(FrameKind::Stderr),
        strings(&["err1", "err2", "err3"])
    );
    // stdout and stderr share one producer and its seqs: 1..=7, no gaps.
    assert_eq!(m.high, 7);
    assert_eq!(
        m.names,
        vec![(EXECUTION.to_owned(), "shim-job-abcdef-2".to_owned())]
    );
    let (exited, _, _) = &m.exits[0];
    assert_eq!(exited.execution, EXECUTION);
    assert_eq!(exited.attempt, 2);
    assert_eq!(exited.status, ExitStatus::Code(0));
}

#[tokio::test]
async fn shim_hello_names_the_shim_and_the_worker_by_pid_start_time_and_boot() {
    let fake = Fake::new();
    // The worker prints its own pid, to compare with the one in ShimHello.
    let spec = fake.spec(&["sh", "-c", "echo $$"]);
    fake.listen(Behavior::default());
    let mut child = start_shim(&spec, &fake.log()).await;
    let shim_pid = child.id().unwrap();
    let shim_ticks = tether::shim::procfs::start_ticks(shim_pid).unwrap();
    assert_eq!(exit_code(&fake, &mut child).await, 0, "{}", fake.log_text());
    let m = fake.model();
    let hello = &m.hellos[0];
    assert_eq!(hello.execution, EXECUTION);
    assert_eq!(hello.attempt, 2);
    assert_eq!(hello.shim_pid, shim_pid);
    assert_eq!(hello.shim_start_ticks, shim_ticks);
    assert_eq!(hello.boot_id, tether::shim::procfs::boot_id().unwrap());
    let worker_pid: u32 = m.payloads(FrameKind::Stdout)[0].parse().unwrap();
    assert_eq!(hello.worker_pid, Some(worker_pid));
    // The worker started after the shim, in the same boot.
    assert!(hello.worker_start_ticks >= shim_ticks);
}

#[tokio::test]
async fn long_lines_are_split_into_frames_never_dropped() {
    let fake = Fake::new();
    let mut spec = fake.spec(&[
        "sh",
        "-c",
        "printf '%s\\n' abcdefghijklmnopqrstuvwxy 0123456789 ''; printf 01234567890123",
    ]);
    spec.max_line = 10;
    let code = run_to_end(&fake, &spec, Behavior::default()).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    assert_eq!(
        fake.model().payloads(FrameKind::Stdout),
        strings(&[
            "abcdefghij",
            "klmnopqrst",
            "uvwxy",
            "0123456789",
            "",
            "0123456789",
            "0123"
        ])
    );
}

#[tokio::test]
async fn the_worker_gets_its_environment_cwd_and_no_stdin() {
    let fake = Fake::new();
    let workdir = tempfile::tempdir().unwrap();
    let mut spec = fake.spec(&[
        "sh",
        "-c",
        "echo $TETHER_EXECUTION_ID; echo $TETHER_SOCKET; echo ${TETHER_RESUMED:-unset}; \
         echo $GREETING; pwd; cat; echo end",
    ]);
    spec.cwd = Some(workdir.path().to_str().unwrap().into());
    spec.env = vec![
        ("GREETING".into(), "hello there".into()),
        // The spec's variables cannot fake the ones the shim sets.
        ("TETHER_EXECUTION_ID".into(), "forged".into()),
    ];
    spec.resumed = true;
    let code = run_to_end(&fake, &spec, Behavior::default()).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let cwd = std::fs::canonicalize(workdir.path()).unwrap();
    assert_eq!(
        fake.model().payloads(FrameKind::Stdout),
        vec![
            EXECUTION.to_owned(),
            spec.socket.clone(),
            "1".to_owned(),
            "hello there".to_owned(),
            cwd.to_str().unwrap().to_owned(),
            "end".to_owned(),
        ]
    );
}

#[tokio::test]
async fn the_exit_is_reported_only_after_every_frame_is_acknowledged() {
    let fake = Fake::new();
    let spec = fake.spec(&["sh", "-c", "seq 1 300; exit 3"]);
    let behavior = Behavior {
        ack_every: Some(Duration::from_millis(20)),
        ..Behavior::default()
    };
    let code = run_to_end(&fake, &spec, behavior).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert_eq!(m.high, 300);
    let (exited, acked, stored) = &m.exits[0];
    assert_eq!(exited.status, ExitStatus::Code(3));
    assert_eq!(
        (*acked, *stored),
        (300, 300),
        "reported before the last ack"
    );
    assert_eq!(m.exits.len(), 1);
}

#[tokio::test]
async fn a_worker_killed_by_a_signal_is_reported_as_the_signal() {
    let fake = Fake::new();
    let spec = fake.spec(&["sh", "-c", "echo bye; kill -9 $$"]);
    let code = run_to_end(&fake, &spec, Behavior::default()).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert_eq!(m.exits[0].0.status, ExitStatus::Signal(9));
    assert_eq!(m.payloads(FrameKind::Stdout), strings(&["bye"]));
}

#[tokio::test]
async fn a_worker_that_cannot_start_is_reported_as_spawn_failed() {
    let fake = Fake::new();
    let spec = fake.spec(&["/nonexistent/agent", "--flag"]);
    let code = run_to_end(&fake, &spec, Behavior::default()).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert_eq!(m.hellos[0].worker_pid, None);
    let ExitStatus::SpawnFailed(reason) = &m.exits[0].0.status else {
        panic!("not a spawn failure: {:?}", m.exits);
    };
    assert!(reason.contains("/nonexistent/agent"), "{reason}");
    assert!(reason.contains("No such file or directory"), "{reason}");
    assert!(m.frames.is_empty());
}

#[tokio::test]
async fn a_refused_hello_kills_the_worker_and_exits_1() {
    let fake = Fake::new();
    let spec = fake.spec(&["sleep", "1000"]);
    let behavior = Behavior {
        refuse_hello: Some(ErrorCode::NOT_FOUND),
        ..Behavior::default()
    };
    let started = Instant::now();
    let code = run_to_end(&fake, &spec, behavior).await;
    assert_eq!(code, 1, "{}", fake.log_text());
    assert!(started.elapsed() < Duration::from_secs(10));
    let worker = fake.model().hellos[0].worker_pid.unwrap();
    assert!(
        !Path::new(&format!("/proc/{worker}")).exists(),
        "worker {worker} is still there"
    );
    assert!(
        fake.log_text().contains("no execution"),
        "{}",
        fake.log_text()
    );
}

#[tokio::test]
async fn after_a_reconnect_hello_comes_first_then_unacknowledged_frames_are_resent() {
    let fake = Fake::new();
    // Session 0 acknowledges through seq 10, reads on to 30 and drops.
    let behavior = Behavior {
        ack_at_most: |n| (n == 0).then_some(10),
        drop_after_appends: |n| (n == 0).then_some(30),
        ..Behavior::default()
    };
    let spec = fake.spec(&["sh", "-c", "seq 1 100"]);
    let code = run_to_end(&fake, &spec, behavior).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert!(m.violations.is_empty(), "{:?}", m.violations);
    let expected: Vec<String> = (1..=100).map(|i| i.to_string()).collect();
    assert_eq!(m.payloads(FrameKind::Stdout), expected);
    assert!(m.first_requests.len() >= 2, "{:?}", m.first_requests);
    assert!(m.first_requests.iter().all(|r| *r == "ShimHello"));
    // The second session resends from the first unacknowledged frame.
    assert_eq!(m.first_appends[1], 11, "{:?}", m.first_appends);
    assert!(
        fake.log_text().contains("reattached"),
        "{}",
        fake.log_text()
    );
}

#[tokio::test]
async fn a_lost_exit_report_is_sent_again_after_reconnecting() {
    let fake = Fake::new();
    let behavior = Behavior {
        drop_on_exit: |n| n == 0,
        ..Behavior::default()
    };
    let spec = fake.spec(&["sh", "-c", "echo one; exit 4"]);
    let code = run_to_end(&fake, &spec, behavior).await;
    assert_eq!(code, 0, "{}", fake.log_text());
    let m = fake.model();
    assert_eq!(m.exits.len(), 2);
    assert!(m
        .exits
        .iter()
        .all(|(e, _, _)| e.status == ExitStatus::Code(4)));
    assert_eq!(m.first_requests, vec!["ShimHello", "ShimHello"]);
    assert_eq!(m.payloads(FrameKind::Stdout), strings(&["one"]));
}

/// The resident set size of a process, in KiB (and its anonymous and
/// file-backed parts, for the test output).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    eprintln!(
        "shim {pid}: RssAnon {} KiB, RssFile {} KiB",
        field("RssAnon:"),
        field("RssFile:")
    );
    field("VmRSS:")
}

#[tokio::test]
async fn while_the_daemon_is_down_the_worker_blocks_and_nothing_is_lost() {
    let fake = Fake::new();
    let done = fake.dir.path().join("done");
    let script = format!("seq 1 200000; touch {}", done.display());
    let spec = fake.spec(&["sh", "-c", &script]);
    // No daemon yet: the shim buffers what its window holds, then stops
    // reading, so the worker must block long before writing everything.
    let mut child = start_shim(&spec, &fake.log()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!done.exists(), "the worker was never blocked");
    let rss = rss_kib(child.id().unwrap());
    eprintln!("shim RSS with a full window and no daemon: {rss} KiB");
    assert!(rss < 16 * 1024, "shim RSS {rss} KiB");
    fake.listen(Behavior::default());
    assert_eq!(exit_code(&fake, &mut child).await, 0, "{}", fake.log_text());
    assert!(done.exists());
    let m = fake.model();
    assert!(m.violations.is_empty(), "{:?}", m.violations);
    let lines = m.payloads(FrameKind::Stdout);
    assert_eq!(lines.len(), 200_000);
    assert!(lines
        .iter()
        .enumerate()
        .all(|(i, line)| *line == (i + 1).to_string()));
    assert_eq!(m.exits[0].0.status, ExitStatus::Code(0));
}

#[tokio::test]
async fn an_attached_shim_stays_small() {
    let fake = Fake::new();
    let spec = fake.spec(&["sh", "-c", "seq 1 20000; sleep 1; echo last"]);
    fake.listen(Behavior::default());
    let mut child = start_shim(&spec, &fake.log()).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rss = rss_kib(child.id().unwrap());
    eprintln!("shim RSS attached, after relaying 20000 lines: {rss} KiB");
    assert!(rss < 16 * 1024, "shim RSS {rss} KiB");
    assert_eq!(exit_code(&fake, &mut child).await, 0, "{}", fake.log_text());
    assert_eq!(fake.model().high, 20_001);
}
