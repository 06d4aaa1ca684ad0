//! `checkpoint-latency`: how long a checkpoint save takes, from the request
//! leaving the client to the durable `CheckpointSaved`, against a `tetherd`
//! it starts. Prints p50/p99 per snapshot size.
//!
//! The daemon gets a stand-in shim that only sleeps, so the execution the
//! checkpoints belong to exists but runs nothing. With `--real-shim` the
//! execution runs `sleep` under the real `tether-shim` instead, so every
//! save first has the shim flush its output through.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use tether_protocol::{
    Capabilities, CheckpointSave, ExecState, Request, Response, RestartPolicy, RunSpec,
};

use tether_bench::{call, connect, percentile, run_bench, tetherd_path, BoxError, Conn, Daemon};

/// Checkpoint save latency against a fresh tetherd.
#[derive(Debug, Parser)]
#[command(name = "checkpoint-latency")]
struct Args {
    /// The tetherd binary [default: next to this one].
    #[arg(long, value_name = "PATH")]
    tetherd: Option<PathBuf>,
    /// Saves per size (the first tenth are warm-up and not counted).
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Snapshot sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 1024 * 1024])]
    sizes: Vec<usize>,
    /// Run the execution under the real shim (found next to tetherd), so
    /// that each save includes the shim's flush.
    #[arg(long)]
    real_shim: bool,
    /// Directory for the daemon's state [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Stand-in shim: it neither reads its spec nor starts a worker.
const IDLE_SHIM: &str = "#!/bin/sh\nexec sleep 60\n";

fn main() -> std::process::ExitCode {
    run_bench("checkpoint-latency", bench(Args::parse()))
}

async fn bench(args: Args) -> Result<(), BoxError> {
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    let temp = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let dir = temp.path();
    let shim = dir.join("idle-shim");
    std::fs::write(&shim, IDLE_SHIM)?;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))?;
    let extra: Vec<&std::ffi::OsStr> = match args.real_shim {
        true => Vec::new(),
        false => vec!["--shim".as_ref(), shim.as_os_str()],
    };
    let (_daemon, socket) = Daemon::start(&tetherd, dir, &extra)?;
    let mut conn = connect(
        &socket,
        Duration::from_secs(10),
        Capabilities::NONE,
        "checkpoint-latency",
    )
    .await?;
    let mut run = idle_run(&shim);
    if args.real_shim {
        run.command = vec!["sleep".into(), "600".into()];
    }
    let execution = match call(&mut conn, Request::Run(run)).await? {
        Response::Started { execution } => execution,
        other => return Err(format!("expected Started, got {other:?}").into()),
    };
    if args.real_shim {
        wait_running(&mut conn).await?;
    }
    println!("size_bytes\tsamples\tp50_ms\tp99_ms\tmax_ms");
    for &size in &args.sizes {
        let mut times = measure(&mut conn, &execution, size, args.samples).await?;
        times.sort_by(f64::total_cmp);
        println!(
            "{size}\t{}\t{:.3}\t{:.3}\t{:.3}",
            times.len(),
            percentile(&times, 0.50),
            percentile(&times, 0.99),
            times.last().copied().unwrap_or(0.0)
        );
    }
    Ok(())
}

/// Waits until the execution runs, so that its shim is attached.
async fn wait_running(conn: &mut Conn) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match call(conn, Request::ListExecutions { all: false }).await? {
            Response::Executions(list) if list.iter().any(|e| e.state == ExecState::Running) => {
                return Ok(())
            }
            Response::Executions(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return Err(format!("the worker is not running: {other:?}").into()),
        }
    }
}

fn idle_run(shim: &Path) -> RunSpec {
    RunSpec {
        name: Some("bench".into()),
        command: vec![shim.display().to_string()],
        cwd: None,
        env: Vec::new(),
        restart: RestartPolicy::Never,
        max_restarts: None,
        deadline_ms: None,
    }
}

/// Milliseconds per save, warm-up excluded.
async fn measure(
    conn: &mut Conn,
    execution: &str,
    size: usize,
    samples: usize,
) -> Result<Vec<f64>, BoxError> {
    let warmup = samples / 10;
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples + warmup {
        // Different bytes each time, so nothing can be skipped as unchanged.
        let data = Bytes::from(vec![(i % 251) as u8; size]);
        let request = Request::CheckpointSave(CheckpointSave {
            execution: execution.to_owned(),
            schema_version: 1,
            data,
        });
        let started = Instant::now();
        match call(conn, request).await? {
            Response::CheckpointSaved(_) => {}
            other => return Err(format!("expected CheckpointSaved, got {other:?}").into()),
        }
        if i >= warmup {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(times)
}
