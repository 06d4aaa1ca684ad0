//! W2: many streams. One producer and one live follower per stream, all at
//! once; aggregate ingest, end-to-end percentiles over every frame, and
//! when each stream finished.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tether_protocol::{Response, StartAt};

use tether_bench::{next, BoxError, Conn, Daemon};

use crate::common::{create_stream, open, peak_rss_mib, Appends, CpuMeter};
use crate::common::{receive, subscribe};
use crate::progress::Progress;
use crate::report::{percentiles_ms, Row};
use crate::Args;

/// One run of W2: `args.streams` streams of `frames` frames each.
pub async fn run(
    args: &Args,
    frames: u64,
    tetherd: &Path,
    dir: &Path,
    label: String,
) -> Result<Row, BoxError> {
    let (daemon, socket) = Daemon::start(tetherd, dir, &[])?;
    let clock = Instant::now();
    let streams = args.streams.max(1);
    // Every connection is open and every follower attached before the
    // first timed append, so that setup does not count.
    let mut producers = Vec::with_capacity(streams as usize);
    let mut followers = Vec::with_capacity(streams as usize);
    for i in 0..streams {
        let name = format!("w2-{i}");
        let mut producer = open(&socket).await?;
        create_stream(&mut producer, &name, args.size, &clock).await?;
        let mut follower = open(&socket).await?;
        subscribe(&mut follower, &name, StartAt::Now, true, None).await?;
        producers.push((name, producer));
        followers.push(follower);
    }

    let progress = Progress::start(label, frames * streams);
    let cpu = CpuMeter::start(daemon.pid());
    let start = Instant::now();
    let follower_tasks: Vec<_> = followers
        .into_iter()
        .map(|f| tokio::spawn(async move { receive(f, frames, clock, None).await }))
        .collect();
    let producer_tasks: Vec<_> = producers
        .into_iter()
        .map(|(name, mut conn)| {
            let job = Produce {
                stream: name,
                frames,
                size: args.size,
                window: args.window.max(1),
                clock,
                start,
                done: progress.counter(),
            };
            tokio::spawn(async move { job.run(&mut conn).await })
        })
        .collect();
    let mut completions = Vec::with_capacity(producer_tasks.len());
    for task in producer_tasks {
        completions.push(task.await??);
    }
    let ingest = start.elapsed();
    drop(progress);
    let mut latencies = Vec::with_capacity((frames * streams) as usize);
    for task in follower_tasks {
        latencies.extend(task.await??);
    }
    let (daemon_cpu_us, bench_cpu_us) = cpu.per_frame_us(frames * streams);
    let (p50_ms, p99_ms, p999_ms) = percentiles_ms(&mut latencies);
    let first = completions.iter().min().copied().unwrap_or_default();
    let last = completions.iter().max().copied().unwrap_or_default();
    let peak_rss_mib = peak_rss_mib(daemon.pid());
    drop(daemon);
    Ok(Row {
        workload: "W2",
        frames: frames * streams,
        ingest_per_s: (frames * streams) as f64 / ingest.as_secs_f64(),
        p50_ms,
        p99_ms,
        p999_ms,
        completion_s: Some((first.as_secs_f64(), last.as_secs_f64())),
        peak_rss_mib,
        daemon_cpu_us,
        bench_cpu_us,
        ..Row::default()
    })
}

/// One stream's producer.
struct Produce {
    stream: String,
    frames: u64,
    size: usize,
    window: u64,
    clock: Instant,
    start: Instant,
    /// Frames acknowledged on every stream, for the progress line.
    done: Arc<AtomicU64>,
}

impl Produce {
    /// Publishes every frame with up to `window` in flight; returns when
    /// the last was acknowledged, since `start`.
    async fn run(self, conn: &mut Conn) -> Result<Duration, BoxError> {
        let mut appends = Appends::new(&self.stream, self.size);
        let mut sent = 0u64;
        let mut acked = 0u64;
        while acked < self.frames {
            let upto = self.frames.min(acked + self.window);
            if upto > sent {
                appends.feed(conn, sent + 1..=upto, &self.clock)?;
                sent = upto;
            }
            conn.flush().await?;
            match next(conn).await? {
                Response::Appended(a) => {
                    self.done
                        .fetch_add(a.producer_seq.saturating_sub(acked), Ordering::Relaxed);
                    acked = acked.max(a.producer_seq);
                }
                other => return Err(format!("producer got {other:?}").into()),
            }
        }
        Ok(self.start.elapsed())
    }
}
