//! `tether tail STREAM`: print a stream's frames, one per line.
//!
//! Where it starts, first match wins: the position in `--cursor-file` (if
//! the file exists and is not empty), `--from-seq N`, `-n N` (the last N
//! frames), the stored ack of `--consumer NAME`, and otherwise the oldest
//! retained frame. So a first run can be pointed somewhere with
//! `--from-seq` and later runs carry on from the cursor file.
//!
//! Output is gathered in a large buffer and written when no more frames are
//! immediately available (or the buffer is full), never a syscall per line.
//! After each such write, and only then, the cursor file is replaced and
//! the consumer acks, so both are in step with what was printed. (Without
//! `-f` the daemon ends the subscription after the last frame, so the ack
//! is confirmed once, at exit, on a short session of its own.)
//!
//! SIGTERM and SIGINT stop it between frames: what was gathered is
//! printed, the cursor file and the consumer's ack are brought up to date,
//! and it exits 0.
//!
//! Plain `stderr` frames go to stderr, lifecycle events too (marked
//! `tether: `), the rest to stdout; `-t` puts each
//! frame's time in front of it. `--since` and `--until` take a time or an
//! age and leave out frames dated outside them; with `-f` the first frame
//! past `--until` ends the command.
//!
//! A STREAM that does not exist may name an execution (`run --name`): its
//! stream is then read. With `-f` a stream that does not exist yet is
//! waited for, and the stream of an execution ends the command (exit 0)
//! once the execution has ended and every frame of it is printed.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures_util::FutureExt;
use tether::subscriber::gap_message;
use tether::{Connector, Event, Result, Start, SubscribeOptions, Subscriber};
use tether_protocol::{ErrorCode, ExecutionInfo};
use tokio::signal::unix::{signal, Signal, SignalKind};

use tether::cursor;

use super::attach::{Watch, POLL};
use super::output::{self, Target};
use super::{consumer_name, stream_name, Context};

/// Output gathered before it is written even if more frames are ready.
const FLUSH_AT: usize = 256 * 1024;

/// Arguments of `tether tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// The stream to print.
    #[arg(value_parser = stream_name)]
    stream: String,

    /// Keep following new frames; survives daemon restarts.
    #[arg(short = 'f', long)]
    follow: bool,

    /// Start at the last N frames.
    #[arg(short = 'n', value_name = "N", conflicts_with = "from_seq")]
    last: Option<u64>,

    /// Start at seq N.
    #[arg(long, value_name = "N")]
    from_seq: Option<u64>,

    /// Resume after the seq stored in F, and keep F (replaced atomically)
    /// at the seq of the last printed frame.
    #[arg(long, value_name = "F")]
    cursor_file: Option<PathBuf>,

    /// Read as the durable consumer NAME: start after its stored ack and ack
    /// what has been printed (acks let the daemon compact).
    #[arg(long, value_name = "NAME", value_parser = consumer_name)]
    consumer: Option<String>,

    /// Exit 0 after printing N frames.
    #[arg(long, value_name = "N")]
    count: Option<u64>,

    /// Start each line with the frame's time (RFC 3339, UTC).
    #[arg(short = 't', long)]
    timestamps: bool,

    /// Leave out frames older than this: a time (2026-11-25T10:00:00Z) or
    /// an age (10m, 2h).
    #[arg(long, value_name = "WHEN", value_parser = when)]
    since: Option<When>,

    /// Leave out frames newer than this: a time or an age; with -f, stop
    /// at the first frame past it.
    #[arg(long, value_name = "WHEN", value_parser = when)]
    until: Option<When>,
}

/// A time given to `--since` or `--until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Microseconds since the Unix epoch.
    At(u64),
    /// This long before the command started.
    Ago(Duration),
}

impl When {
    /// In microseconds since the Unix epoch, `now` being the command's
    /// start.
    fn micros(self, now: SystemTime) -> u64 {
        let at = match self {
            When::At(micros) => return micros,
            When::Ago(age) => now.checked_sub(age).unwrap_or(UNIX_EPOCH),
        };
        at.duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// Clap value parser for `--since` and `--until`.
fn when(text: &str) -> std::result::Result<When, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        let micros = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        return Ok(When::At(micros));
    }
    humantime::parse_duration(text).map(When::Ago).map_err(|_| {
        format!(
            "invalid time {text:?}: expected a UTC time like 2026-11-25T10:00:00Z or an age \
             like 10m or 2h"
        )
    })
}

/// Runs `tether tail`.
pub async fn run(ctx: &Context, args: TailArgs) -> Result<()> {
    if args.count == Some(0) {
        return Ok(());
    }
    let mut signals = Signals::install()?;
    let stored = match &args.cursor_file {
        Some(path) => cursor::read(path)?,
        None => None,
    };
    let now = SystemTime::now();
    let connector = ctx.connector("tail");
    let (stream, execution) = resolve(&connector, &args.stream, args.follow).await?;
    let mut watch = execution
        .filter(|_| args.follow)
        .map(|info| Watch::new(connector.clone(), &info.id));
    let options = SubscribeOptions {
        stream: stream.clone(),
        start: start_of(&args, stored),
        follow: args.follow,
        consumer: args.consumer.clone(),
    };
    let opened = tokio::select! {
        biased;
        () = signals.recv() => return Ok(()),
        opened = open(&connector, options) => opened,
    };
    let mut sub = opened?;
    let mut printer = Printer {
        json: ctx.json,
        timestamps: args.timestamps,
        since: args.since.map(|w| w.micros(now)),
        until: args.until.map(|w| w.micros(now)),
        follow: args.follow,
        stream,
        out: Vec::with_capacity(FLUSH_AT + 64 * 1024),
        target: Target::Stdout,
        unsaved: None,
        seen: 0,
        printed: 0,
        limit: args.count,
        cursor_file: args.cursor_file,
        acks: args.consumer.is_some(),
    };
    let outcome = printer.pump(&mut sub, &mut signals, watch.as_mut()).await;
    // Whatever ended the loop, what was gathered is printed and recorded.
    let saved = printer.save(&mut sub);
    outcome?;
    saved?;
    if printer.acks {
        sub.wait_acked().await?;
    }
    Ok(())
}

/// The stream to read and, when it is an execution's, that execution.
/// A name that is no stream but names an execution reads the execution's
/// stream (stream names win: they are not execution names).
/// Without `follow` the execution matters only when there is no stream.
async fn resolve(
    connector: &Connector,
    name: &str,
    follow: bool,
) -> Result<(String, Option<ExecutionInfo>)> {
    let streams = tether::sdk::streams(connector).await?;
    let exists = streams.iter().any(|s| s.name == name);
    if exists && !follow {
        return Ok((name.to_owned(), None));
    }
    let executions = tether::sdk::executions(connector, true).await?;
    let execution = match exists {
        true => executions.into_iter().find(|e| e.id == name),
        false => tether_protocol::find_execution(executions, name, |e| e.into()),
    };
    let stream = execution
        .as_ref()
        .map_or_else(|| name.to_owned(), |e| e.id.clone());
    Ok((stream, execution))
}

/// Opens the subscription; with `follow`, waits for a stream that does
/// not exist yet.
async fn open(connector: &Connector, options: SubscribeOptions) -> Result<Subscriber> {
    loop {
        match Subscriber::open(connector.clone(), options.clone()).await {
            Err(e) if options.follow && e.daemon_code() == Some(ErrorCode::NOT_FOUND) => {
                tokio::time::sleep(POLL).await;
            }
            opened => return opened,
        }
    }
}

fn start_of(args: &TailArgs, stored: Option<u64>) -> Start {
    Start::choose(stored, args.from_seq, args.last, args.consumer.is_some())
}

/// Whether to keep going.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    More,
    Done,
}

/// Gathers output and keeps the cursor file and acks in step with it.
struct Printer {
    json: bool,
    timestamps: bool,
    /// Frames dated before this are left out.
    since: Option<u64>,
    /// Frames dated after this are left out (with `follow`, end it).
    until: Option<u64>,
    follow: bool,
    stream: String,
    /// Gathered for `target`.
    out: Vec<u8>,
    target: Target,
    /// The seq of the last frame gathered but not yet written.
    unsaved: Option<u64>,
    /// The seq of the last frame received, printed or left out.
    seen: u64,
    printed: u64,
    limit: Option<u64>,
    cursor_file: Option<PathBuf>,
    acks: bool,
}

impl Printer {
    /// Prints frames until the stream ends, or, with `watch`, until its
    /// execution has ended and its every frame has been received.
    async fn pump(
        &mut self,
        sub: &mut Subscriber,
        signals: &mut Signals,
        mut watch: Option<&mut Watch>,
    ) -> Result<()> {
        let mut ticker = tokio::time::interval(POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ended: Option<ExecutionInfo> = None;
        loop {
            if ended
                .as_ref()
                .is_some_and(|e| self.seen >= e.stream_last_seq)
            {
                return Ok(());
            }
            let next = tokio::select! {
                biased;
                () = signals.recv() => return Ok(()),
                _ = ticker.tick(), if watch.is_some() && ended.is_none() => {
                    if let Some(watch) = watch.as_deref_mut() {
                        ended = watch.poll().await?;
                    }
                    continue;
                }
                next = sub.next() => next?,
            };
            let Some(event) = next else {
                return Ok(());
            };
            if self.take(event, sub)? == Flow::Done {
                return Ok(());
            }
            // Take everything that is already here before writing once.
            while let Some(event) = sub.try_next()? {
                if self.take(event, sub)? == Flow::Done {
                    return Ok(());
                }
                if self.out.len() >= FLUSH_AT
                    && (self.save(sub)? == Flow::Done || signals.received())
                {
                    return Ok(());
                }
            }
            if self.save(sub)? == Flow::Done {
                return Ok(());
            }
        }
    }

    fn take(&mut self, event: Event, sub: &mut Subscriber) -> Result<Flow> {
        match event {
            Event::Frame { seq, frame } => {
                self.seen = seq;
                if self.since.is_some_and(|since| frame.ts_micros < since) {
                    return Ok(Flow::More);
                }
                if self.until.is_some_and(|until| frame.ts_micros > until) {
                    return Ok(match self.follow {
                        true => Flow::Done,
                        false => Flow::More,
                    });
                }
                let (target, prefix) = output::placement(self.json, frame.kind);
                if target != self.target {
                    // Written in stream order for someone watching both.
                    if self.save(sub)? == Flow::Done {
                        return Ok(Flow::Done);
                    }
                    self.target = target;
                }
                if self.timestamps && !self.json {
                    output::push_timestamp(&mut self.out, &frame);
                }
                self.out.extend_from_slice(prefix);
                output::push_frame(&mut self.out, self.json, &self.stream, seq, &frame);
                self.unsaved = Some(seq);
                self.printed += 1;
                if Some(self.printed) == self.limit {
                    return Ok(Flow::Done);
                }
                Ok(Flow::More)
            }
            Event::Gap(gap) => {
                // Keep stdout and stderr in order for someone watching both.
                let flow = self.save(sub)?;
                eprintln!("tether: {}", gap_message(&self.stream, &gap));
                Ok(flow)
            }
            Event::End { .. } => Ok(Flow::Done),
        }
    }

    /// Writes what was gathered, then records its last seq in the cursor
    /// file and acks it. `Done` when stdout is closed.
    fn save(&mut self, sub: &mut Subscriber) -> Result<Flow> {
        if self.out.is_empty() {
            return Ok(Flow::More);
        }
        let open = output::write_to(self.target, &self.out)?;
        self.out.clear();
        if !open {
            // Nobody reads any more; what was not written is not recorded.
            self.unsaved = None;
            return Ok(Flow::Done);
        }
        if let Some(seq) = self.unsaved.take() {
            if let Some(path) = &self.cursor_file {
                cursor::write(path, seq)?;
            }
            if self.acks {
                sub.ack(seq)?;
            }
        }
        Ok(Flow::More)
    }
}

/// SIGTERM and SIGINT, as one source.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        let install = |kind| {
            signal(kind).map_err(|source| tether::Error::Local {
                context: "cannot install signal handlers".into(),
                source,
            })
        };
        Ok(Self {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
        })
    }

    /// Waits for either signal. Cancel-safe.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// True if either signal has arrived, without waiting.
    fn received(&mut self) -> bool {
        self.recv().now_or_never().is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn args(extra: &[&str]) -> TailArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            tail: TailArgs,
        }
        let mut argv = vec!["tail", "s"];
        argv.extend_from_slice(extra);
        Wrapper::try_parse_from(argv).unwrap().tail
    }

    #[test]
    fn since_and_until_take_a_time_or_an_age() {
        assert_eq!(when("1970-01-01T00:00:01Z"), Ok(When::At(1_000_000)));
        assert_eq!(when("1970-01-01T00:00:01.5Z"), Ok(When::At(1_500_000)));
        assert_eq!(when("10m"), Ok(When::Ago(Duration::from_secs(600))));
        assert_eq!(when("2h"), Ok(When::Ago(Duration::from_secs(7200))));
        assert!(when("soon").is_err());
        let now = UNIX_EPOCH + Duration::from_secs(3600);
        assert_eq!(
            When::Ago(Duration::from_secs(600)).micros(now),
            3_000_000_000
        );
        assert_eq!(When::Ago(Duration::from_secs(7200)).micros(now), 0);
    }

    #[test]
    fn the_start_follows_the_documented_precedence() {
        assert_eq!(start_of(&args(&[]), None), Start::Oldest);
        assert_eq!(
            start_of(&args(&["--consumer", "c"]), None),
            Start::ConsumerAck
        );
        assert_eq!(start_of(&args(&["-n", "3"]), None), Start::Last(3));
        assert_eq!(
            start_of(&args(&["--from-seq", "10"]), None),
            Start::After(9)
        );
        assert_eq!(start_of(&args(&["--from-seq", "0"]), None), Start::After(0));
        assert_eq!(
            start_of(&args(&["--from-seq", "10", "--cursor-file", "f"]), Some(42)),
            Start::After(42)
        );
    }
}
