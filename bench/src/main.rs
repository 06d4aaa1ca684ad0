//! `tether-bench`: workloads W0, W1, W2 and the human gates ones against a
//! `tetherd` it starts.
//!
//! * W0, latency: one producer sends one frame at a time, the next after
//!   the ack of the last; a live follower receives them. Producer-ack
//!   p50/p99/p999 and follower-receive p99.
//! * W1, throughput: one producer, one stream, N frames of S bytes, up to
//!   W appends unacknowledged; one live follower (a durable consumer)
//!   acking every A frames; then a fresh reader replays everything from
//!   seq 1. A second consumer that never acks holds compaction back so the
//!   replay has the whole stream to read.
//! * W2, many streams: P producers on P streams, each with its own live
//!   follower, N frames each with up to W in flight: aggregate ingest,
//!   end-to-end percentiles over every frame, and fairness (the first
//!   stream's completion time over the last's).
//!
//! * `answer` and `questions`, human gates: see [`gates`].
//!
//! Each payload starts with its send time, so followers measure end-to-end
//! latency (producer send to follower receive, which includes the durable
//! commit). It speaks the wire protocol directly, so what it measures is
//! the daemon, not a client library.

mod common;
mod gates;
mod progress;
mod report;
mod w0;
mod w1;
mod w2;

use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};

use tether_bench::{tetherd_path, BoxError};

use crate::report::Row;

/// Workloads W0, W1, W2, answer and questions against a fresh tetherd per run.
#[derive(Debug, Parser)]
#[command(name = "tether-bench", version, about)]
pub struct Args {
    /// Which workload to run.
    #[arg(long, value_enum, default_value_t = Workload::W1)]
    workload: Workload,
    /// Frames to publish (per stream for W2) [default: W0 10000, W1
    /// 1000000, W2 10000].
    #[arg(long)]
    frames: Option<u64>,
    /// Payload size in bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Appends in flight per producer before it waits for an ack (W1, W2).
    #[arg(long, default_value_t = 1024)]
    window: u64,
    /// The W1 follower acks every this many frames.
    #[arg(long, default_value_t = 1024)]
    ack_every: u64,
    /// Streams, each with one producer and one follower (W2).
    #[arg(long, default_value_t = 100)]
    streams: u64,
    /// Runs per workload; figures are reported per run and as the median.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The tetherd binary [default: next to this one].
    #[arg(long)]
    tetherd: Option<PathBuf>,
    /// Directory for the store [default: a fresh temp dir per run].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object per run instead of a table row.
    #[arg(long)]
    json: bool,
    /// Questions asked [default: answer 100, questions 10000].
    #[arg(long)]
    questions: Option<usize>,
    /// Executions the questions are spread over (questions).
    #[arg(long, default_value_t = 10)]
    executions: usize,
    /// Write each W1 frame's end-to-end latency to this file, in µs, one
    /// line per frame in seq order (the last run's, with several): where
    /// in a run the slow frames are.
    #[arg(long, value_name = "FILE")]
    latencies: Option<PathBuf>,
}

/// A workload, or W0, W1 and W2 in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    W0,
    W1,
    W2,
    All,
    /// Time from an answer to the asking worker's `ask` returning.
    Answer,
    /// `ps` and `questions` with many questions open, against none.
    Questions,
}

impl Args {
    /// Frames for `workload` (per stream for W2).
    fn frames_for(&self, workload: Workload) -> u64 {
        self.frames.unwrap_or(match workload {
            Workload::W1 => 1_000_000,
            _ => 10_000,
        })
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tether-bench: cannot start runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tether-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn bench(args: Args) -> Result<(), BoxError> {
    if args.size < 8 {
        return Err("--size must be at least 8 (the payload carries its send time)".into());
    }
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if let Some(path) = &args.latencies {
        if matches!(args.workload, Workload::W0 | Workload::W2) {
            return Err("--latencies is for W1 (or all)".into());
        }
        // Before any run, rather than after the first.
        std::fs::File::create(path).map_err(|e| w1::latencies_error(path, &e))?;
    }
    let gates = matches!(args.workload, Workload::Answer | Workload::Questions);
    if args.questions.is_some() && !gates {
        return Err("--questions is for the answer and questions workloads".into());
    }
    if gates && args.runs != 1 {
        return Err("--runs is for W0, W1 and W2; answer and questions run once".into());
    }
    if args.questions == Some(0) || args.executions == 0 {
        return Err("--questions and --executions must be at least 1".into());
    }
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    if gates {
        return gates::run(&args, args.workload == Workload::Questions, &tetherd).await;
    }
    let workloads: &[Workload] = match args.workload {
        Workload::All => &[Workload::W0, Workload::W1, Workload::W2],
        Workload::W0 => &[Workload::W0],
        Workload::W1 => &[Workload::W1],
        Workload::W2 => &[Workload::W2],
        Workload::Answer | Workload::Questions => &[],
    };
    if !args.json {
        println!(
            "{} B frames, window {}, {} cores; latencies in ms",
            args.size,
            args.window,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("{}", report::header());
    }
    for &workload in workloads {
        let mut rows = Vec::with_capacity(args.runs);
        for run in 1..=args.runs {
            let temp = tempfile::Builder::new()
                .prefix("tb")
                .tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
            let label = format!("{workload:?} run {run}/{}", args.runs);
            let mut row = one_run(&args, workload, &tetherd, temp.path(), label).await?;
            row.run = run.to_string();
            print_row(&args, &row);
            rows.push(row);
        }
        if rows.len() > 1 {
            print_row(&args, &report::median(&rows));
        }
    }
    Ok(())
}

async fn one_run(
    args: &Args,
    workload: Workload,
    tetherd: &Path,
    dir: &Path,
    label: String,
) -> Result<Row, BoxError> {
    let frames = args.frames_for(workload);
    match workload {
        Workload::W0 => w0::run(args, frames, tetherd, dir, label).await,
        Workload::W2 => w2::run(args, frames, tetherd, dir, label).await,
        _ => w1::run(args, frames, tetherd, dir, label).await,
    }
}

fn print_row(args: &Args, row: &Row) {
    if args.json {
        println!("{}", report::json_row(row, args.size));
    } else {
        println!("{}", report::table_row(row));
    }
}
