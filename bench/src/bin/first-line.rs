//! `first-line [--pty] --runs N`: how long a worker's line takes to show in
//! `tether tail -f`, against a `tetherd` it starts. Prints p50/p99.
//!
//! Each run starts a worker with `tether run` that writes one line holding
//! its own clock time (`date +%s%N`, nanoseconds since the epoch) and
//! exits, follows its stream with `tether tail -f`, and takes the time when
//! the line is read from tail's stdout. The difference is the whole path:
//! the worker's write, the shim, the daemon's durable commit, the tail.
//! The worker waits a moment before it prints, so that the tail is
//! already following and its start-up is not counted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;

use tether_bench::{percentile, tetherd_path, BoxError, Daemon};

/// Latency from a worker's line to `tail -f` showing it.
#[derive(Debug, Parser)]
#[command(name = "first-line")]
struct Args {
    /// Give the worker a pseudo-terminal (`tether run --pty`).
    #[arg(long)]
    pty: bool,
    /// Workers to run, one after another.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// The tetherd binary [default: next to this one]; `tether` is taken
    /// from beside it.
    #[arg(long, value_name = "PATH")]
    tetherd: Option<PathBuf>,
    /// Directory for the daemon's state [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The worker: a pause for the tail to attach, then its clock time.
const WORKER: &str = "sleep 0.2; date +%s%N";

fn main() -> std::process::ExitCode {
    match bench(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("first-line: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn bench(args: Args) -> Result<(), BoxError> {
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    let tether = tetherd
        .parent()
        .ok_or("cannot locate the directory of tetherd")?
        .join("tether");
    let temp = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let (_daemon, socket) = Daemon::start(&tetherd, temp.path(), &[])?;
    let mut times = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        times.push(one_run(&tether, &socket, args.pty)?);
    }
    times.sort_by(f64::total_cmp);
    println!("mode\truns\tp50_ms\tp99_ms\tmax_ms");
    println!(
        "{}\t{}\t{:.3}\t{:.3}\t{:.3}",
        if args.pty { "pty" } else { "pipes" },
        times.len(),
        percentile(&times, 0.50),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or(0.0)
    );
    Ok(())
}

/// `tether --socket SOCKET ARGS...`, waiting up to 30 s for the daemon.
fn tether_command(tether: &Path, socket: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(tether);
    cmd.arg("--socket")
        .arg(socket)
        .arg("--connect-timeout")
        .arg("30s")
        .args(args);
    cmd
}

/// Milliseconds from the worker's clock reading to the tail's line.
fn one_run(tether: &Path, socket: &Path, pty: bool) -> Result<f64, BoxError> {
    let mut run_args = vec!["run", "--restart", "never"];
    if pty {
        run_args.push("--pty");
    }
    run_args.extend(["--", "sh", "-c", WORKER]);
    let out = tether_command(tether, socket, &run_args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("tether run failed: {}", out.status).into());
    }
    let id = String::from_utf8(out.stdout)?.trim().to_owned();
    let mut tail = tether_command(tether, socket, &["tail", "-f", &id])
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = tail.stdout.take().ok_or("tail has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let result = loop {
        let Some(line) = lines.next() else {
            break Err(format!("tail -f {id} ended before the worker's line").into());
        };
        let line = line?;
        // Lifecycle lines may come first; the worker's is a bare number.
        if let Ok(written_ns) = line.trim().parse::<u128>() {
            let now_ns = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
            break Ok(now_ns.saturating_sub(written_ns) as f64 / 1e6);
        }
    };
    let _ = tail.kill();
    let _ = tail.wait();
    result
}
