//! `tether-bench`: workload W1 against a `tetherd` it starts.
//!
//! W1: one producer, one stream, N frames of S bytes, up to W appends
//! unacknowledged; one live follower (a durable consumer) acking every A
//! frames; then a fresh reader replays everything from seq 1. A second
//! consumer that never acks holds compaction back so the replay has the
//! whole stream to read. Each payload starts with its send time, so the
//! follower measures end-to-end latency (producer send to follower receive,
//! which includes the durable commit).
//!
//! It speaks the wire protocol directly, so what it measures is the daemon,
//! not a client library.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use clap::Parser;
use futures_util::SinkExt;
use tether_protocol::{
    Append, Capabilities, DurableAck, DurableResume, FrameKind, Request, Response, StartAt,
    Subscribe,
};

use tether_bench::{connect, next, tetherd_path, BoxError, Conn, Daemon};

const STREAM: &str = "w1";

/// Workload W1 against a fresh tetherd.
#[derive(Debug, Parser)]
#[command(name = "tether-bench", version, about)]
struct Args {
    /// Frames to publish.
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Payload size in bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Appends in flight before the producer waits for an ack.
    #[arg(long, default_value_t = 1024)]
    window: u64,
    /// The follower acks every this many frames.
    #[arg(long, default_value_t = 1024)]
    ack_every: u64,
    /// Runs; figures are reported per run and as the median.
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
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    ingest_per_s: f64,
    e2e_p50_ms: f64,
    e2e_p99_ms: f64,
    e2e_p999_ms: f64,
    replay_per_s: f64,
    peak_rss_mib: f64,
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
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    if !args.json {
        println!(
            "W1: {} frames x {} B, window {}, ack every {} ({} cores)",
            args.frames,
            args.size,
            args.window,
            args.ack_every,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!(
            "{:>4} {:>14} {:>10} {:>10} {:>10} {:>14} {:>12}",
            "run", "ingest f/s", "e2e p50", "e2e p99", "e2e p999", "replay f/s", "peak RSS"
        );
    }
    let mut all = Vec::new();
    for run in 1..=args.runs {
        let temp = tempfile::Builder::new()
            .prefix("tb")
            .tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
        let figures = one_run(&args, &tetherd, temp.path()).await?;
        print_row(&args, &run.to_string(), &figures);
        all.push(figures);
    }
    if args.runs > 1 {
        let median = |f: fn(&Figures) -> f64| {
            let mut v: Vec<f64> = all.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let m = Figures {
            ingest_per_s: median(|f| f.ingest_per_s),
            e2e_p50_ms: median(|f| f.e2e_p50_ms),
            e2e_p99_ms: median(|f| f.e2e_p99_ms),
            e2e_p999_ms: median(|f| f.e2e_p999_ms),
            replay_per_s: median(|f| f.replay_per_s),
            peak_rss_mib: median(|f| f.peak_rss_mib),
        };
        print_row(&args, "med", &m);
    }
    Ok(())
}

fn print_row(args: &Args, run: &str, f: &Figures) {
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "workload": "W1", "run": run, "frames": args.frames, "size": args.size,
                "ingest_frames_per_s": f.ingest_per_s.round(),
                "e2e_p50_ms": f.e2e_p50_ms, "e2e_p99_ms": f.e2e_p99_ms, "e2e_p999_ms": f.e2e_p999_ms,
                "replay_frames_per_s": f.replay_per_s.round(), "peak_rss_mib": f.peak_rss_mib,
            })
        );
    } else {
        println!(
            "{:>4} {:>14.0} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>14.0} {:>9.1} MiB",
            run,
            f.ingest_per_s,
            f.e2e_p50_ms,
            f.e2e_p99_ms,
            f.e2e_p999_ms,
            f.replay_per_s,
            f.peak_rss_mib
        );
    }
}

async fn one_run(args: &Args, tetherd: &Path, dir: &Path) -> Result<Figures, BoxError> {
    let socket = dir.join("s.sock");
    let daemon = Daemon::start(tetherd, &socket, &dir.join("state"), &[])?;
    let pid = daemon.pid();

    let mut producer = connect(
        &socket,
        Duration::from_secs(10),
        Capabilities::DURABLE,
        "tether-bench",
    )
    .await?;
    let clock = Instant::now();
    // One warm-up frame creates the stream so that consumers can attach.
    append(&mut producer, 0, &payload(args.size, &clock)).await?;
    wait_appended(&mut producer, 0).await?;
    // A consumer that never acks keeps everything for the replay.
    let mut holder = connect(
        &socket,
        Duration::from_secs(5),
        Capabilities::DURABLE,
        "tether-bench",
    )
    .await?;
    subscribe(&mut holder, StartAt::Oldest, false, Some("replay-holder")).await?;
    drop(holder);

    let mut follower = connect(
        &socket,
        Duration::from_secs(5),
        Capabilities::DURABLE,
        "tether-bench",
    )
    .await?;
    subscribe(&mut follower, StartAt::Now, true, Some("follower")).await?;
    let frames = args.frames;
    let ack_every = args.ack_every.max(1);
    let follow_clock = clock;
    let follower_task =
        tokio::spawn(async move { follow(&mut follower, frames, ack_every, follow_clock).await });

    let start = Instant::now();
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < frames {
        while sent < frames && sent - acked < args.window {
            sent += 1;
            let msg = append_request(sent, payload(args.size, &clock));
            producer.feed(msg).await?;
        }
        producer.flush().await?;
        match next(&mut producer).await? {
            Response::Appended(a) => acked = a.producer_seq,
            other => return Err(format!("producer got {other:?}").into()),
        }
    }
    let ingest = start.elapsed();
    let mut latencies = follower_task.await??;
    latencies.sort_unstable();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(i).copied().unwrap_or(0) as f64 / 1e6
    };

    let mut reader = connect(
        &socket,
        Duration::from_secs(5),
        Capabilities::DURABLE,
        "tether-bench",
    )
    .await?;
    let replay_start = Instant::now();
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
    let replay = replay_start.elapsed();
    if replayed != frames {
        return Err(format!("replay returned {replayed} frames, expected {frames}").into());
    }
    let peak_rss_mib = peak_rss_kib(pid).unwrap_or(0) as f64 / 1024.0;
    drop(daemon);
    Ok(Figures {
        ingest_per_s: frames as f64 / ingest.as_secs_f64(),
        e2e_p50_ms: pct(0.50),
        e2e_p99_ms: pct(0.99),
        e2e_p999_ms: pct(0.999),
        replay_per_s: frames as f64 / replay.as_secs_f64(),
        peak_rss_mib,
    })
}

/// Receives `frames` frames, acking every `ack_every`; returns latencies in ns.
async fn follow(
    conn: &mut Conn,
    frames: u64,
    ack_every: u64,
    clock: Instant,
) -> Result<Vec<u64>, BoxError> {
    let mut latencies = Vec::with_capacity(frames as usize);
    let mut last_seq = 0u64;
    while (latencies.len() as u64) < frames {
        match next(conn).await? {
            Response::Durable(d) => {
                let now = clock.elapsed().as_nanos() as u64;
                let mut sent = [0u8; 8];
                sent.copy_from_slice(&d.frame.payload[..8]);
                latencies.push(now.saturating_sub(u64::from_le_bytes(sent)));
                if last_seq != 0 && d.seq != last_seq + 1 {
                    return Err(format!("follower saw seq {} after {last_seq}", d.seq).into());
                }
                last_seq = d.seq;
                if (latencies.len() as u64).is_multiple_of(ack_every) {
                    conn.send(Request::DurableAck(DurableAck { through_seq: d.seq }))
                        .await?;
                }
            }
            Response::Acked(_) => {}
            other => return Err(format!("follower got {other:?}").into()),
        }
    }
    Ok(latencies)
}

fn payload(size: usize, clock: &Instant) -> Bytes {
    let mut b = BytesMut::with_capacity(size);
    b.put_u64_le(clock.elapsed().as_nanos() as u64);
    b.resize(size, b'x');
    b.freeze()
}

fn append_request(producer_seq: u64, payload: Bytes) -> Request {
    Request::Append(Append {
        stream: STREAM.into(),
        producer: "bench".into(),
        producer_seq,
        kind: FrameKind::Data,
        payload,
    })
}

async fn append(conn: &mut Conn, producer_seq: u64, payload: &Bytes) -> Result<(), BoxError> {
    conn.send(append_request(producer_seq, payload.clone()))
        .await?;
    Ok(())
}

async fn wait_appended(conn: &mut Conn, producer_seq: u64) -> Result<(), BoxError> {
    match next(conn).await? {
        Response::Appended(a) if a.producer_seq >= producer_seq => Ok(()),
        other => Err(format!("expected Appended, got {other:?}").into()),
    }
}

async fn subscribe(
    conn: &mut Conn,
    start: StartAt,
    follow: bool,
    consumer: Option<&str>,
) -> Result<(), BoxError> {
    conn.send(Request::Subscribe(Subscribe {
        stream: STREAM.into(),
        start,
        follow,
        consumer: consumer.map(str::to_owned),
    }))
    .await?;
    match next(conn).await? {
        Response::Subscribed(_) => Ok(()),
        other => Err(format!("expected Subscribed, got {other:?}").into()),
    }
}

/// Peak resident set (VmHWM) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
