//! `tether attach ID [-n N]` and `run --attach`: follow an execution's
//! stream until it ends.
//!
//! Frames are printed as they come: `stdout` (and `data`) lines to stdout,
//! `stderr` lines to stderr, lifecycle `event` frames to stderr prefixed
//! `tether: `. With `--json` every frame goes to stdout as a `tether tail
//! --json` line instead.
//!
//! The stream may not exist yet right after `Run` (the daemon creates it
//! with the first lifecycle frame), so subscribing is retried until it
//! does. Meanwhile the execution's state is polled every [`POLL`]. Once it
//! is final, everything through the stream's last seq at that moment is
//! printed (the final lifecycle frame is stored with the final state), and
//! the exit code is the worker's last one ([`exit_code`]).
//!
//! `failed` and `lost` are final only when no restart follows, which one
//! look cannot tell: the daemon may be about to move on to `backoff`. They
//! count as final once two polls in a row see the same attempt in them.

use std::time::Duration;

use clap::Args;
use tether::error::{EXIT_NOT_FOUND, EXIT_NOT_STARTED, EXIT_OK, EXIT_TETHER_FAILED};
use tether::{Connector, Error, Event, Link, Result, Start, SubscribeOptions, Subscriber};
use tether_protocol::{
    find_execution, ErrorCode, ExecState, ExecutionInfo, ExitStatus, Frame, Request, Response,
};

use tether::subscriber::gap_message;

use super::output::{self, Target};
use super::Context;

/// How often the execution's state is polled.
pub const POLL: Duration = Duration::from_millis(250);
/// Output gathered before it is written even if more frames are ready.
const FLUSH_AT: usize = 64 * 1024;

/// Arguments of `tether attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The execution: its id, or its name (`run --name`).
    #[arg(value_name = "ID")]
    execution: String,

    /// Start at the last N frames instead of the first.
    #[arg(short = 'n', value_name = "N")]
    last: Option<u64>,
}

/// Runs `tether attach`; returns the exit code.
pub async fn run(ctx: &Context, args: AttachArgs) -> u8 {
    let followed = async {
        let connector = ctx.connector("attach");
        let info = resolve(&connector, &args.execution).await?;
        follow(ctx, &info.id, args.last).await
    };
    exit_of(followed.await)
}

/// The exit code of a command that reports a worker's: `result`'s, or,
/// when tether itself failed, 125 (3 for an execution that does not
/// exist), after saying why.
pub fn exit_of(result: Result<u8>) -> u8 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tether: {e}");
            match e.exit_code() {
                EXIT_NOT_FOUND => EXIT_NOT_FOUND,
                _ => EXIT_TETHER_FAILED,
            }
        }
    }
}

/// The execution `key` names (an id, else a name; see
/// [`find_execution`]), or `Error` NOT_FOUND.
pub async fn resolve(connector: &Connector, key: &str) -> Result<ExecutionInfo> {
    let list = tether::sdk::executions(connector, true).await?;
    find_execution(list, key, |e| e.into()).ok_or_else(|| Error::Daemon {
        code: ErrorCode::NOT_FOUND,
        message: format!("no such execution: {key:?}"),
    })
}

/// Follows execution `id` (from its last `last` frames, or its first)
/// until it ends; returns the exit code.
pub async fn follow(ctx: &Context, id: &str, last: Option<u64>) -> Result<u8> {
    let connector = ctx.connector("attach");
    let mut watch = Watch::new(connector.clone(), id);
    let mut printer = Printer::new(ctx.json, id);
    let mut sub: Option<Subscriber> = None;
    let mut ended: Option<ExecutionInfo> = None;
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if let Some(info) = &ended {
            if printer.printed >= info.stream_last_seq {
                return Ok(conclude(info));
            }
        }
        tokio::select! {
            _ = ticker.tick() => {
                if ended.is_none() {
                    ended = watch.poll().await?;
                }
                if sub.is_none() {
                    let start = match (printer.printed, last) {
                        (0, Some(n)) => Start::Last(n),
                        (printed, _) => Start::After(printed),
                    };
                    sub = open(&connector, id, start).await?;
                }
            }
            event = next(&mut sub) => {
                let mut event = event?;
                loop {
                    match event {
                        Some(Event::Frame { seq, frame }) => {
                            if !printer.frame(seq, &frame)? {
                                // Nobody reads stdout any more: detach.
                                return Ok(EXIT_OK);
                            }
                        }
                        Some(Event::Gap(gap)) => {
                            printer.flush()?;
                            eprintln!("tether: {}", gap_message(id, &gap));
                        }
                        Some(Event::End { .. }) | None => {
                            sub = None;
                            break;
                        }
                    }
                    event = match sub.as_mut() {
                        Some(s) => match s.try_next()? {
                            Some(next) => Some(next),
                            None => break,
                        },
                        None => break,
                    };
                }
                if !printer.flush()? {
                    return Ok(EXIT_OK);
                }
            }
        }
    }
}

/// The next event of the subscription; never ready without one.
async fn next(sub: &mut Option<Subscriber>) -> Result<Option<Event>> {
    match sub {
        Some(sub) => sub.next().await,
        None => std::future::pending().await,
    }
}

/// Subscribes at `start`, following; `None` while the stream does not
/// exist yet.
async fn open(connector: &Connector, id: &str, start: Start) -> Result<Option<Subscriber>> {
    let options = SubscribeOptions {
        stream: id.to_owned(),
        start,
        follow: true,
        consumer: None,
    };
    match Subscriber::open(connector.clone(), options).await {
        Ok(sub) => Ok(Some(sub)),
        Err(e) if e.daemon_code() == Some(ErrorCode::NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Exit code for how the execution ended, with a line on stderr when it
/// did not complete.
pub fn conclude(info: &ExecutionInfo) -> u8 {
    if info.state != ExecState::Completed {
        match &info.reason {
            Some(reason) => eprintln!("tether: {} {}: {reason}", info.id, info.state.as_str()),
            None => eprintln!("tether: {} {}", info.id, info.state.as_str()),
        }
    }
    exit_code(info)
}

/// The exit code that reports how an ended execution's worker last ended,
/// as a shell reports a command's: its code, 128+N for signal N, 127 when
/// it never started, and 125 when tether lost track of it (`lost`).
pub fn exit_code(info: &ExecutionInfo) -> u8 {
    if info.state == ExecState::Lost {
        return EXIT_TETHER_FAILED;
    }
    match &info.last_exit {
        Some(ExitStatus::Code(code)) => u8::try_from(*code).unwrap_or(EXIT_TETHER_FAILED),
        Some(ExitStatus::Signal(n)) => u8::try_from(128 + *n).unwrap_or(EXIT_TETHER_FAILED),
        Some(ExitStatus::SpawnFailed(_)) => EXIT_NOT_STARTED,
        None if info.state == ExecState::Completed => EXIT_OK,
        None => EXIT_NOT_STARTED,
    }
}

/// Polls the execution's state on one session, kept open between polls.
pub struct Watch {
    link: Link,
    id: String,
    /// The state and attempt of the previous poll.
    previous: Option<(ExecState, u32)>,
}

impl Watch {
    pub fn new(connector: Connector, id: &str) -> Self {
        Self {
            link: Link::new(connector),
            id: id.to_owned(),
            previous: None,
        }
    }

    /// The execution, once it has ended.
    pub async fn poll(&mut self) -> Result<Option<ExecutionInfo>> {
        let info = self.fetch().await?;
        let now = (info.state, info.attempt);
        let ended = settled(info.state, self.previous == Some(now));
        self.previous = Some(now);
        Ok(ended.then_some(info))
    }

    async fn fetch(&mut self) -> Result<ExecutionInfo> {
        let request = Request::ListExecutions { all: true };
        loop {
            self.link.establish().await?;
            let Some(conn) = self.link.connection() else {
                continue;
            };
            match conn.request(&request).await {
                Ok(Response::Executions(list)) => {
                    self.link.recovered();
                    return list.into_iter().find(|e| e.id == self.id).ok_or_else(|| {
                        Error::Daemon {
                            code: ErrorCode::NOT_FOUND,
                            message: format!("no such execution: {:?}", self.id),
                        }
                    });
                }
                Ok(other) => {
                    return Err(Error::Protocol(format!(
                        "the daemon answered ListExecutions with {}",
                        other.name()
                    )))
                }
                Err(e) => self.link.lose(e)?,
            }
        }
    }
}

/// Whether `state` is final; `repeated` says the previous poll saw the
/// same state in the same attempt.
fn settled(state: ExecState, repeated: bool) -> bool {
    match state {
        ExecState::Completed | ExecState::Cancelled => true,
        ExecState::Failed | ExecState::Lost => repeated,
        ExecState::Pending
        | ExecState::Starting
        | ExecState::Running
        | ExecState::Waiting
        | ExecState::Backoff => false,
    }
}

/// Gathers output per target and writes it in order: switching targets
/// writes what was gathered for the other one first, so that someone
/// watching both sees lines in stream order.
struct Printer {
    json: bool,
    stream: String,
    out: Vec<u8>,
    target: Target,
    /// The seq of the last frame gathered.
    printed: u64,
}

impl Printer {
    fn new(json: bool, stream: &str) -> Self {
        Self {
            json,
            stream: stream.to_owned(),
            out: Vec::new(),
            target: Target::Stdout,
            printed: 0,
        }
    }

    /// Gathers one frame. `false` when stdout is closed.
    fn frame(&mut self, seq: u64, frame: &Frame) -> Result<bool> {
        let (target, prefix) = output::placement(self.json, frame.kind);
        if target != self.target || self.out.len() >= FLUSH_AT {
            if !self.flush()? {
                return Ok(false);
            }
            self.target = target;
        }
        self.out.extend_from_slice(prefix);
        output::push_frame(&mut self.out, self.json, &self.stream, seq, frame);
        self.printed = seq;
        Ok(true)
    }

    /// Writes what was gathered. `false` when stdout is closed.
    fn flush(&mut self) -> Result<bool> {
        if self.out.is_empty() {
            return Ok(true);
        }
        let open = output::write_to(self.target, &self.out)?;
        self.out.clear();
        Ok(open)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::FrameKind;

    #[test]
    fn exit_codes_report_the_workers_last_end_as_a_shell_would() {
        let info = |state, last_exit| ExecutionInfo {
            id: "e".into(),
            name: None,
            state,
            pid: None,
            attempt: 1,
            restarts: 0,
            command: vec![],
            restart: tether_protocol::RestartPolicy::Never,
            last_exit,
            reason: None,
            created_micros: 0,
            stream_last_seq: 0,
            last_checkpoint: None,
        };
        let code = |state, last_exit| exit_code(&info(state, last_exit));
        assert_eq!(code(ExecState::Completed, Some(ExitStatus::Code(0))), 0);
        assert_eq!(code(ExecState::Failed, Some(ExitStatus::Code(3))), 3);
        assert_eq!(code(ExecState::Failed, Some(ExitStatus::Signal(9))), 137);
        assert_eq!(
            code(ExecState::Cancelled, Some(ExitStatus::Signal(15))),
            143
        );
        let spawn = ExitStatus::SpawnFailed("no such file".into());
        assert_eq!(code(ExecState::Failed, Some(spawn)), 127);
        assert_eq!(code(ExecState::Cancelled, None), 127);
        assert_eq!(code(ExecState::Lost, Some(ExitStatus::Code(0))), 125);
        assert_eq!(code(ExecState::Failed, Some(ExitStatus::Code(-1))), 125);
    }

    #[test]
    fn only_repeated_failures_are_final() {
        assert!(settled(ExecState::Completed, false));
        assert!(settled(ExecState::Cancelled, false));
        assert!(!settled(ExecState::Failed, false));
        assert!(settled(ExecState::Failed, true));
        assert!(settled(ExecState::Lost, true));
        for state in [
            ExecState::Pending,
            ExecState::Starting,
            ExecState::Running,
            ExecState::Backoff,
        ] {
            assert!(!settled(state, true), "{state:?}");
        }
    }

    #[test]
    fn frames_go_to_their_targets_in_order() {
        let mut printer = Printer::new(false, "s");
        let frame = |kind, text: &str| Frame {
            ts_micros: 0,
            kind,
            payload: bytes::Bytes::copy_from_slice(text.as_bytes()),
        };
        printer
            .frame(1, &frame(FrameKind::Event, "started pid 1"))
            .unwrap();
        assert_eq!(printer.target, Target::Stderr);
        assert_eq!(printer.out, b"tether: started pid 1\n");
        printer.frame(2, &frame(FrameKind::Stderr, "warn")).unwrap();
        assert_eq!(printer.out, b"tether: started pid 1\nwarn\n");
        assert_eq!(printer.printed, 2);
        let mut json = Printer::new(true, "s");
        json.frame(7, &frame(FrameKind::Event, "x")).unwrap();
        assert_eq!(json.target, Target::Stdout);
        let text = String::from_utf8(json.out.clone()).unwrap();
        assert!(text.contains("\"kind\":\"event\""), "{text}");
    }
}
