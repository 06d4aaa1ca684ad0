//! The `tether` binary's command-line surface: help, usage errors and the
//! "cannot reach the daemon" exit code, none of which need a daemon; and
//! `run`, `run --attach`, `ps` and `stop` against a fake daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod fake_daemon;

fn tether(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .env_remove("TETHER_SOCKET")
        .output()
        .expect("run tether")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_exits_zero_and_lists_the_commands() {
    let output = tether(&["--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    for command in ["publish", "tail", "streams", "status", "run", "ps", "stop"] {
        assert!(text.contains(command), "help lacks {command}:\n{text}");
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let output = tether(&["status", "--no-such-flag"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("--no-such-flag"));
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let output = tether(&["--connect-timeout", "soon", "status"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("500ms"), "{}", stderr(&output));
}

#[test]
fn no_daemon_exits_4_after_the_timeout_naming_the_socket() {
    let started = Instant::now();
    let output = tether(&[
        "--socket",
        "/nonexistent/s.sock",
        "--connect-timeout",
        "200ms",
        "status",
    ]);
    let elapsed = started.elapsed();
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("/nonexistent/s.sock"), "{message}");
    assert!(message.contains("No such file or directory"), "{message}");
    assert!(
        elapsed >= Duration::from_millis(200),
        "gave up after {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn tail_and_publish_also_exit_4_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let socket = socket.to_str().unwrap();
    for args in [
        vec!["tail", "s"],
        vec!["tail", "-f", "s"],
        vec!["publish", "s"],
        vec!["streams"],
        vec!["run", "--", "true"],
        vec!["ps"],
        vec!["stop", "x"],
    ] {
        let mut argv = vec!["--socket", socket, "--connect-timeout", "100ms"];
        argv.extend(args.iter().copied());
        let output = tether(&argv);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn run_without_a_command_or_with_a_bad_env_is_a_usage_error() {
    for args in [
        vec!["run"],
        vec!["run", "--"],
        vec!["run", "--name", "x"],
        vec!["run", "--env", "NOEQUALS", "--", "true"],
        vec!["run", "--restart", "sometimes", "--", "true"],
        vec!["stop"],
        vec!["stop", "x", "--timeout", "soon"],
    ] {
        let output = tether(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

mod with_a_fake_daemon {
    //! A fake daemon that knows one execution, `job-abcdef`: it starts it,
    //! lists it in the state the test scripts, serves its stream (missing
    //! at first, as right after `Run`), and stops it.

    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use tether_protocol::{
        Durable, ErrorCode, ErrorFrame, ExecState, ExecutionInfo, ExitStatus, Frame, FrameKind,
        Request, Response, RestartPolicy, RunSpec, Subscribed,
    };
    use tokio::net::{UnixListener, UnixStream};

    const ID: &str = "job-abcdef";

    /// What the fake knows and saw.
    struct State {
        /// The state reported by each `ListExecutions`, the last one
        /// repeated forever.
        states: Vec<ExecState>,
        polls: usize,
        runs: Vec<RunSpec>,
        /// Refuse `RunFull` as a daemon older than it would.
        old: bool,
        /// Subscribes refused (stream missing) before the stream exists.
        missing_for: usize,
        subscribes: usize,
        frames: Vec<Frame>,
    }

    type Shared = Arc<Mutex<State>>;

    fn frame(kind: FrameKind, text: &str) -> Frame {
        Frame {
            ts_micros: 1,
            kind,
            payload: Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    fn info(state: ExecState, last_seq: u64) -> ExecutionInfo {
        ExecutionInfo {
            id: ID.into(),
            name: Some("job".into()),
            state,
            pid: (state == ExecState::Running).then_some(777),
            attempt: 1,
            restarts: 0,
            command: vec!["sh".into()],
            restart: RestartPolicy::OnFailure,
            last_exit: (state == ExecState::Failed).then_some(ExitStatus::Code(78)),
            reason: (state == ExecState::Failed).then(|| "exit code 78 is not retried".into()),
            created_micros: 1_700_000_000_000_000,
            stream_last_seq: last_seq,
            last_checkpoint: None,
        }
    }

    struct Fake {
        _dir: tempfile::TempDir,
        socket: PathBuf,
        state: Shared,
    }

    impl Fake {
        fn start(states: Vec<ExecState>, frames: Vec<Frame>) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("d.sock");
            let state = Arc::new(Mutex::new(State {
                states,
                polls: 0,
                runs: vec![],
                old: false,
                missing_for: 2,
                subscribes: 0,
                frames,
            }));
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

        async fn tether(&self, args: &[&str]) -> std::process::Output {
            let mut argv = vec!["--socket", self.socket.to_str().unwrap()];
            argv.extend_from_slice(args);
            let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether"))
                .args(&argv)
                .output();
            tokio::time::timeout(Duration::from_secs(30), child)
                .await
                .expect("tether finished")
                .unwrap()
        }
    }

    async fn serve(stream: UnixStream, state: Shared) {
        let Some(mut session) = crate::fake_daemon::greet(stream).await else {
            return;
        };
        while let Some(Ok(request)) = session.next().await {
            let answers = answer(&state, request);
            for response in answers {
                if session.send(response).await.is_err() {
                    return;
                }
            }
        }
    }

    /// How a daemon that predates request type `kind` refuses it.
    fn unknown(kind: u32) -> Response {
        Response::Error(ErrorFrame {
            code: ErrorCode::MALFORMED,
            message: format!(
                "unknown request type {kind}: this build knows types 0 to 24; \
                 the peer is newer than this build"
            ),
        })
    }

    fn not_found(what: &str) -> Vec<Response> {
        vec![Response::Error(ErrorFrame {
            code: ErrorCode::NOT_FOUND,
            message: format!("no such {what}"),
        })]
    }

    fn answer(state: &Shared, request: Request) -> Vec<Response> {
        let mut s = state.lock().unwrap();
        let last_seq = s.frames.len() as u64;
        match request {
            Request::Run(spec) => {
                s.runs.push(spec);
                vec![Response::Started {
                    execution: ID.into(),
                }]
            }
            Request::RunFull(_) if s.old => vec![unknown(25)],
            // The caller's environment goes with a local run.
            Request::RunFull(run) if run.whole_env => {
                s.runs.push(run.spec);
                vec![Response::Started {
                    execution: ID.into(),
                }]
            }
            // Refused as a daemon older than it would: `ps` then asks for
            // the executions alone.
            Request::ListExecutionsFull { .. } => vec![unknown(26)],
            Request::ListExecutions { .. } => {
                let i = s.polls.min(s.states.len() - 1);
                s.polls += 1;
                vec![Response::Executions(vec![info(s.states[i], last_seq)])]
            }
            Request::DurableResume(resume) if resume.stream == ID => {
                s.subscribes += 1;
                if s.subscribes <= s.missing_for {
                    return not_found("stream");
                }
                let mut out = vec![Response::Subscribed(Subscribed {
                    first_seq: 1,
                    last_seq,
                })];
                for (i, frame) in s.frames.iter().enumerate() {
                    let seq = i as u64 + 1;
                    if seq > resume.acked_through {
                        out.push(Response::Durable(Durable {
                            seq,
                            frame: frame.clone(),
                        }));
                    }
                }
                out
            }
            Request::Stop { execution, .. } if execution == ID => {
                vec![Response::Stopped(info(ExecState::Cancelled, last_seq))]
            }
            Request::Stop { .. } => not_found("execution"),
            _ => vec![Response::Error(ErrorFrame {
                code: ErrorCode::INVALID_REQUEST,
                message: "the fake does not do that".into(),
            })],
        }
    }

    fn story() -> Vec<Frame> {
        vec![
            frame(FrameKind::Event, "starting attempt 1: sh"),
            frame(FrameKind::Stdout, "hello"),
            frame(FrameKind::Stderr, "oops"),
            frame(FrameKind::Stdout, "world"),
            frame(FrameKind::Event, "exited 0"),
        ]
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    #[tokio::test]
    async fn run_prints_the_id_and_sends_the_spec_with_an_absolute_cwd() {
        let fake = Fake::start(vec![ExecState::Running], story());
        let output = fake
            .tether(&[
                "run", "--name", "job", "--cwd", "rel", "--env", "A=1", "--", "sh", "-c", "x",
            ])
            .await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(text(&output.stdout), format!("{ID}\n"));
        let s = fake.state.lock().unwrap();
        let spec = &s.runs[0];
        assert_eq!(spec.command, vec!["sh", "-c", "x"]);
        let cwd = std::env::current_dir().unwrap().join("rel");
        assert_eq!(spec.cwd.as_deref(), cwd.to_str());
        // After the caller's own environment.
        assert_eq!(spec.env.last(), Some(&("A".to_owned(), "1".to_owned())));
        assert!(spec.env.iter().all(|(k, _)| !k.starts_with("TETHER_")));
        assert_eq!(spec.restart, RestartPolicy::OnFailure);
    }

    #[tokio::test]
    async fn an_older_daemon_is_asked_with_run_unless_the_run_needs_more() {
        let fake = Fake::start(vec![ExecState::Running], story());
        fake.state.lock().unwrap().old = true;
        let output = fake.tether(&["run", "--env", "A=1", "--", "sh"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(text(&output.stdout), format!("{ID}\n"));
        let sent = fake.state.lock().unwrap().runs[0].clone();
        assert_eq!(sent.env.last(), Some(&("A".to_owned(), "1".to_owned())));
        let output = fake.tether(&["run", "--pty", "--", "sh"]).await;
        assert_eq!(output.status.code(), Some(2));
        assert!(
            text(&output.stderr).contains("--pty"),
            "{}",
            text(&output.stderr)
        );
        assert_eq!(fake.state.lock().unwrap().runs.len(), 1);
    }

    #[tokio::test]
    async fn attach_prints_every_frame_where_it_belongs_and_exits_0_when_completed() {
        let states = vec![
            ExecState::Starting,
            ExecState::Running,
            ExecState::Running,
            ExecState::Completed,
        ];
        let fake = Fake::start(states, story());
        let output = fake.tether(&["run", "--attach", "--", "sh"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(text(&output.stdout), format!("{ID}\nhello\nworld\n"));
        assert_eq!(
            text(&output.stderr),
            "tether: starting attempt 1: sh\noops\ntether: exited 0\n"
        );
    }

    #[tokio::test]
    async fn attach_exits_with_the_workers_code_once_a_failure_is_final() {
        let frames = vec![
            frame(FrameKind::Stderr, "bad config"),
            frame(FrameKind::Event, "failed: exit code 78 is not retried"),
        ];
        let fake = Fake::start(vec![ExecState::Running, ExecState::Failed], frames);
        let output = fake.tether(&["run", "--attach", "--", "sh"]).await;
        assert_eq!(output.status.code(), Some(78), "{}", text(&output.stderr));
        let err = text(&output.stderr);
        assert!(
            err.starts_with("bad config\ntether: failed: exit code 78"),
            "{err}"
        );
        assert!(
            err.ends_with(&format!(
                "tether: {ID} failed: exit code 78 is not retried\n"
            )),
            "{err}"
        );
        // A failure counts as final only when a second poll still sees it.
        assert!(fake.state.lock().unwrap().polls >= 3);
    }

    #[tokio::test]
    async fn ps_lists_and_filters_and_an_unknown_id_exits_3() {
        let fake = Fake::start(vec![ExecState::Running], story());
        let output = fake.tether(&["ps"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let table = text(&output.stdout);
        assert!(table.starts_with("ID "), "{table}");
        assert!(table.contains("job-abcdef  job   running  777"), "{table}");
        let output = fake.tether(&["ps", "--json", ID]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(value["state"], "running");
        assert_eq!(value["stream_last_seq"], 5);
        // An older daemon tells nothing of the environment or of use.
        assert_eq!(value["env_keys"], serde_json::json!([]));
        assert!(value["cpu_percent"].is_null(), "{value}");
        let output = fake.tether(&["ps", "nope-zzzzzz"]).await;
        assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
        assert!(text(&output.stderr).contains("nope-zzzzzz"));
    }

    #[tokio::test]
    async fn stop_prints_the_final_state_and_an_unknown_id_exits_3() {
        let fake = Fake::start(vec![ExecState::Running], story());
        let output = fake.tether(&["stop", ID, "--timeout", "2s"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(text(&output.stdout), "cancelled\n");
        let output = fake.tether(&["stop", "nope-zzzzzz"]).await;
        assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    }
}
