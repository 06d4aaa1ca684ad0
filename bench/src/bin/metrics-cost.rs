//! `metrics-cost`: what a `tether metrics` scrape costs a daemon holding
//! `--streams` streams, against a `tetherd` it starts. Each stream gets
//! one frame, then `--scrapes` `Metrics` requests are sent one after
//! another on one session (the client's process start is left out). Prints
//! the wall time per scrape (p50, p99) and the daemon's CPU time per scrape.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use futures_util::SinkExt;
use tether_protocol::parts::Joiner;
use tether_protocol::{Append, Capabilities, FrameKind, Request, Response};

use tether_bench::{
    call, connect, cpu_seconds, next, percentile, run_bench, tetherd_path, BoxError, Conn, Daemon,
};

/// The cost of a metrics scrape against a fresh tetherd.
#[derive(Debug, Parser)]
#[command(name = "metrics-cost")]
struct Args {
    /// The tetherd binary [default: next to this one].
    #[arg(long, value_name = "PATH")]
    tetherd: Option<PathBuf>,
    /// Streams to create before scraping (one frame each).
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Scrapes to time (a tenth more first, as warm-up, not counted).
    #[arg(long, default_value_t = 200)]
    scrapes: usize,
    /// Directory for the daemon's state [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    run_bench("metrics-cost", bench(Args::parse()))
}

async fn bench(args: Args) -> Result<(), BoxError> {
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    let temp = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let (daemon, socket) = Daemon::start(&tetherd, temp.path(), &[])?;
    let mut conn = connect(
        &socket,
        Duration::from_secs(10),
        Capabilities::NONE,
        "metrics-cost",
    )
    .await?;
    fill(&mut conn, args.streams).await?;
    let warmup = args.scrapes / 10;
    for _ in 0..warmup {
        scrape(&mut conn).await?;
    }
    let cpu_before = cpu_seconds(daemon.pid());
    let mut times = Vec::with_capacity(args.scrapes);
    let mut bytes = 0;
    for _ in 0..args.scrapes {
        let started = Instant::now();
        bytes = scrape(&mut conn).await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = match (cpu_before, cpu_seconds(daemon.pid())) {
        (Some(before), Some(after)) => {
            format!("{:.3}", (after - before) * 1e3 / args.scrapes.max(1) as f64)
        }
        _ => "n/a".into(),
    };
    times.sort_by(f64::total_cmp);
    println!("streams\tscrapes\ttext_bytes\tp50_ms\tp99_ms\tdaemon_cpu_ms_per_scrape");
    println!(
        "{}\t{}\t{bytes}\t{:.3}\t{:.3}\t{cpu}",
        args.streams,
        times.len(),
        percentile(&times, 0.50),
        percentile(&times, 0.99),
    );
    Ok(())
}

/// One frame on each of `streams` streams, pipelined, then every answer.
async fn fill(conn: &mut Conn, streams: usize) -> Result<(), BoxError> {
    for i in 0..streams {
        conn.feed(Request::Append(Append {
            stream: format!("bench-{i:06}"),
            producer: "metrics-cost".into(),
            producer_seq: 1,
            kind: FrameKind::Stdout,
            payload: Bytes::from_static(b"x"),
        }))
        .await?;
    }
    conn.flush().await?;
    let mut acked = 0;
    while acked < streams {
        match next(conn).await? {
            Response::Appended(_) => acked += 1,
            other => return Err(format!("expected Appended, got {}", other.name()).into()),
        }
    }
    Ok(())
}

/// One `Metrics` request; the text's length.
async fn scrape(conn: &mut Conn) -> Result<usize, BoxError> {
    let mut joiner = Joiner::new();
    let mut response = call(conn, Request::Metrics).await?;
    loop {
        if let Some(whole) = joiner.push(response)? {
            return match whole {
                Response::Metrics(text) => Ok(text.len()),
                other => Err(format!("expected Metrics, got {}", other.name()).into()),
            };
        }
        response = next(conn).await?;
    }
}
