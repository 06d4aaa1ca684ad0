//! W1: one producer with a window of appends in flight, one live durable
//! follower acking as it goes, then a full replay by a fresh reader.

use std::path::Path;
use std::time::Instant;

use futures_util::SinkExt;
use tether_protocol::{DurableResume, Request, Response, StartAt};

use tether_bench::{next, BoxError, Daemon};

use crate::common::{create_stream, open, peak_rss_mib, Appends, CpuMeter};
use crate::common::{receive, subscribe};
use crate::progress::Progress;
use crate::report::{percentiles_ms, Row};
use crate::Args;

const STREAM: &str = "w1";

/// One run of W1 with `frames` frames.
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
    // A consumer that never acks keeps everything for the replay.
    let mut holder = open(&socket).await?;
    subscribe(
        &mut holder,
        STREAM,
        StartAt::Oldest,
        false,
        Some("replay-holder"),
    )
    .await?;
    drop(holder);

    let mut follower = open(&socket).await?;
    subscribe(&mut follower, STREAM, StartAt::Now, true, Some("follower")).await?;
    let ack_every = args.ack_every.max(1);
    let follower_task =
        tokio::spawn(async move { receive(follower, frames, clock, Some(ack_every)).await });

    let progress = Progress::start(label, frames);
    let cpu = CpuMeter::start(daemon.pid());
    let start = Instant::now();
    let mut appends = Appends::new(STREAM, args.size);
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < frames {
        let upto = frames.min(acked + args.window);
        if upto > sent {
            appends.feed(&mut producer, sent + 1..=upto, &clock)?;
            sent = upto;
        }
        producer.flush().await?;
        match next(&mut producer).await? {
            Response::Appended(a) => acked = a.producer_seq,
            other => return Err(format!("producer got {other:?}").into()),
        }
        progress.set(acked);
    }
    let ingest = start.elapsed();
    drop(progress);
    let mut latencies = follower_task.await??;
    if let Some(path) = &args.latencies {
        write_latencies(path, &latencies)?;
    }
    let (daemon_cpu_us, bench_cpu_us) = cpu.per_frame_us(frames);
    let (p50_ms, p99_ms, p999_ms) = percentiles_ms(&mut latencies);

    let replay_cpu = CpuMeter::start(daemon.pid());
    let replay_per_s = replay(&socket, frames).await?;
    let (replay_cpu_us, _) = replay_cpu.per_frame_us(frames);
    let peak_rss_mib = peak_rss_mib(daemon.pid());
    drop(daemon);
    Ok(Row {
        workload: "W1",
        frames,
        ingest_per_s: frames as f64 / ingest.as_secs_f64(),
        p50_ms,
        p99_ms,
        p999_ms,
        replay_per_s: Some(replay_per_s),
        replay_cpu_us: Some(replay_cpu_us),
        peak_rss_mib,
        daemon_cpu_us,
        bench_cpu_us,
        ..Row::default()
    })
}

/// Writes `latencies` (ns) to `path` in µs, one line each.
fn write_latencies(path: &Path, latencies: &[u64]) -> Result<(), BoxError> {
    let mut text = String::with_capacity(latencies.len() * 8);
    for ns in latencies {
        text.push_str(&format!("{:.1}\n", *ns as f64 / 1000.0));
    }
    std::fs::write(path, text).map_err(|e| latencies_error(path, &e))
}

/// The error of a latencies file that cannot be written.
pub fn latencies_error(path: &Path, e: &std::io::Error) -> BoxError {
    format!("cannot write the latencies to {}: {e}", path.display()).into()
}

/// Reads the whole stream from seq 2 on (after the frame that created it)
/// with a fresh connection; returns frames per second.
async fn replay(socket: &Path, frames: u64) -> Result<f64, BoxError> {
    let mut reader = open(socket).await?;
    let start = Instant::now();
    reader
        .send(Request::DurableResume(DurableResume {
            stream: STREAM.into(),
            acked_through: 1,
            follow: false,
            consumer: None,
        }))
        .await?;
    let mut replayed = 0u64;
    loop {
        match next(&mut reader).await? {
            Response::Durable(_) => replayed += 1,
            Response::End { .. } => break,
            Response::Subscribed(_) => {}
            other => return Err(format!("replay got {other:?}").into()),
        }
    }
    let elapsed = start.elapsed();
    if replayed != frames {
        return Err(format!("replay returned {replayed} frames, expected {frames}").into());
    }
    Ok(frames as f64 / elapsed.as_secs_f64())
}
