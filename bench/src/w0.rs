//! W0: latency. One producer sends one frame at a time and the next only
//! after the ack; a live follower receives each.

use std::path::Path;
use std::time::Instant;

use tether_protocol::{Response, StartAt};

use tether_bench::{BoxError, Daemon};

use crate::common::{create_stream, open, peak_rss_mib, Appends, CpuMeter};
use crate::common::{receive, subscribe};
use crate::progress::Progress;
use crate::report::{percentiles_ms, Row};
use crate::Args;

const STREAM: &str = "w0";

/// One run of W0 with `frames` frames.
pub async fn run(
    args: &Args,
    frames: u64,
    tetherd: &Path,
    dir: &Path,
    label: String,
) -> Result<Row, BoxError> {
    let (daemon, socket) = Daemon::start(tetherd, dir, &[])?;
    let mut producer = open(&socket).await?;
    let clock = Instant::now();
    create_stream(&mut producer, STREAM, args.size, &clock).await?;
    let mut follower = open(&socket).await?;
    subscribe(&mut follower, STREAM, StartAt::Now, true, None).await?;
    let follower_task = tokio::spawn(async move { receive(follower, frames, clock, None).await });

    let progress = Progress::start(label, frames);
    let mut acks = Vec::with_capacity(frames as usize);
    let cpu = CpuMeter::start(daemon.pid());
    let start = Instant::now();
    let mut appends = Appends::new(STREAM, args.size);
    for producer_seq in 1..=frames {
        let sent = Instant::now();
        match appends.call(&mut producer, producer_seq, &clock).await? {
            Response::Appended(a) if a.producer_seq == producer_seq => {}
            other => return Err(format!("producer got {other:?}").into()),
        }
        acks.push(sent.elapsed().as_nanos() as u64);
        progress.set(producer_seq);
    }
    let ingest = start.elapsed();
    drop(progress);
    let mut received = follower_task.await??;
    let (daemon_cpu_us, bench_cpu_us) = cpu.per_frame_us(frames);
    let (p50_ms, p99_ms, p999_ms) = percentiles_ms(&mut acks);
    let (_, follow_p99_ms, _) = percentiles_ms(&mut received);
    let peak_rss_mib = peak_rss_mib(daemon.pid());
    drop(daemon);
    Ok(Row {
        workload: "W0",
        frames,
        ingest_per_s: frames as f64 / ingest.as_secs_f64(),
        p50_ms,
        p99_ms,
        p999_ms,
        follow_p99_ms: Some(follow_p99_ms),
        peak_rss_mib,
        daemon_cpu_us,
        bench_cpu_us,
        ..Row::default()
    })
}
