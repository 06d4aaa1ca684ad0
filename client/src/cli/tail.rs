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

use std::path::PathBuf;

use clap::Args;
use futures_util::FutureExt;
use tether::subscriber::gap_message;
use tether::{Event, Result, Start, SubscribeOptions, Subscriber};
use tokio::signal::unix::{signal, Signal, SignalKind};

use tether::cursor;

use super::{consumer_name, output, stream_name, write_stdout, Context};

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
    let options = SubscribeOptions {
        stream: args.stream.clone(),
        start: start_of(&args, stored),
        follow: args.follow,
        consumer: args.consumer.clone(),
    };
    let opened = tokio::select! {
        biased;
        () = signals.recv() => return Ok(()),
        opened = Subscriber::open(ctx.connector("tail"), options) => opened,
    };
    let mut sub = opened?;
    let mut printer = Printer {
        json: ctx.json,
        stream: args.stream,
        out: Vec::with_capacity(FLUSH_AT + 64 * 1024),
        unsaved: None,
        printed: 0,
        limit: args.count,
        cursor_file: args.cursor_file,
        acks: args.consumer.is_some(),
    };
    let outcome = printer.pump(&mut sub, &mut signals).await;
    // Whatever ended the loop, what was gathered is printed and recorded.
    let saved = printer.save(&mut sub);
    outcome?;
    saved?;
    if printer.acks {
        sub.wait_acked().await?;
    }
    Ok(())
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
    stream: String,
    out: Vec<u8>,
    /// The seq of the last frame gathered but not yet written.
    unsaved: Option<u64>,
    printed: u64,
    limit: Option<u64>,
    cursor_file: Option<PathBuf>,
    acks: bool,
}

impl Printer {
    async fn pump(&mut self, sub: &mut Subscriber, signals: &mut Signals) -> Result<()> {
        loop {
            let next = tokio::select! {
                biased;
                () = signals.recv() => return Ok(()),
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
        let open = write_stdout(&self.out)?;
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
