//! Pieces every workload uses: payloads that carry their send time,
//! appends, subscribing, and the daemon's peak memory and CPU time.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use tether_protocol::{
    Append, Capabilities, DurableAck, FrameKind, Request, Response, StartAt, Subscribe,
};

use tether_bench::{connect, next, BoxError, Conn};

/// How long a workload waits for the daemon it started to accept.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(10);

/// A durable connection to the daemon at `socket`.
pub async fn open(socket: &Path) -> Result<Conn, BoxError> {
    connect(
        socket,
        STARTUP_PATIENCE,
        Capabilities::DURABLE,
        "tether-bench",
    )
    .await
}

/// A payload of `size` bytes starting with the time since `clock` in ns.
pub fn payload(size: usize, clock: &Instant) -> Bytes {
    let mut b = BytesMut::with_capacity(size);
    b.put_u64_le(clock.elapsed().as_nanos() as u64);
    b.resize(size, b'x');
    b.freeze()
}

/// The send time a [`payload`] carries; 0 for a payload too short.
pub fn sent_at(payload: &[u8]) -> u64 {
    payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// A data append by producer `bench` on `stream`.
pub fn append_request(stream: &str, producer_seq: u64, payload: Bytes) -> Request {
    Request::Append(Append {
        stream: stream.into(),
        producer: "bench".into(),
        producer_seq,
        kind: FrameKind::Data,
        payload,
    })
}

/// Appends one frame and waits for its ack: this creates the stream, so
/// that followers can attach.
pub async fn create_stream(
    conn: &mut Conn,
    stream: &str,
    size: usize,
    clock: &Instant,
) -> Result<(), BoxError> {
    let response =
        tether_bench::call(conn, append_request(stream, 0, payload(size, clock))).await?;
    match response {
        Response::Appended(_) => Ok(()),
        other => Err(format!("expected Appended, got {other:?}").into()),
    }
}

/// Opens the connection's subscription and waits for the daemon to accept
/// it.
pub async fn subscribe(
    conn: &mut Conn,
    stream: &str,
    start: StartAt,
    follow: bool,
    consumer: Option<&str>,
) -> Result<(), BoxError> {
    let request = Request::Subscribe(Subscribe {
        stream: stream.into(),
        start,
        follow,
        consumer: consumer.map(str::to_owned),
    });
    match tether_bench::call(conn, request).await? {
        Response::Subscribed(_) => Ok(()),
        other => Err(format!("expected Subscribed, got {other:?}").into()),
    }
}

/// Receives `frames` live frames in seq order; returns each one's latency
/// from its send time (on `clock`) in ns. With `ack_every`, acks the frames
/// received every that many (a durable consumer).
pub async fn receive(
    conn: &mut Conn,
    frames: u64,
    clock: Instant,
    ack_every: Option<u64>,
) -> Result<Vec<u64>, BoxError> {
    let mut latencies = Vec::with_capacity(frames as usize);
    let mut last_seq = 0u64;
    while (latencies.len() as u64) < frames {
        match next(conn).await? {
            Response::Durable(d) => {
                let now = clock.elapsed().as_nanos() as u64;
                latencies.push(now.saturating_sub(sent_at(&d.frame.payload)));
                check_order(last_seq, d.seq)?;
                last_seq = d.seq;
                if ack_every.is_some_and(|every| (latencies.len() as u64).is_multiple_of(every)) {
                    conn.send(Request::DurableAck(DurableAck { through_seq: d.seq }))
                        .await?;
                }
            }
            Response::Acked(_) if ack_every.is_some() => {}
            other => return Err(format!("follower got {other:?}").into()),
        }
    }
    Ok(latencies)
}

/// Fails when `seq` does not follow `last_seq` (0: nothing seen yet).
pub fn check_order(last_seq: u64, seq: u64) -> Result<(), BoxError> {
    if last_seq != 0 && seq != last_seq + 1 {
        return Err(format!("follower saw seq {seq} after {last_seq}").into());
    }
    Ok(())
}

/// Peak resident set (VmHWM) of a process, in MiB; 0 when unknown.
pub fn peak_rss_mib(pid: u32) -> f64 {
    let kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
    kib.unwrap_or(0) as f64 / 1024.0
}

/// CPU time (user + system, all threads, living or exited) a process has
/// used, in seconds; `None` when `/proc` cannot tell.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14 and stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // In clock ticks of USER_HZ, which is 100 on Linux whatever the kernel's
    // own tick rate.
    Some((utime + stime) as f64 / 100.0)
}

/// CPU time the daemon and this process spend over a timed phase, per
/// frame: a figure that, unlike rates, barely moves when other work shares
/// the machine.
pub struct CpuMeter {
    daemon_pid: u32,
    daemon_start: Option<f64>,
    bench_start: Option<f64>,
}

impl CpuMeter {
    /// Starts measuring the daemon `daemon_pid` and this process.
    pub fn start(daemon_pid: u32) -> Self {
        Self {
            daemon_pid,
            daemon_start: cpu_seconds(daemon_pid),
            bench_start: cpu_seconds(std::process::id()),
        }
    }

    /// Microseconds of CPU per frame since the start: (daemon, bench);
    /// 0 when unknown.
    pub fn per_frame_us(&self, frames: u64) -> (f64, f64) {
        let per_frame = |start: Option<f64>, pid: u32| match (start, cpu_seconds(pid)) {
            (Some(a), Some(b)) if frames > 0 => (b - a) * 1e6 / frames as f64,
            _ => 0.0,
        };
        (
            per_frame(self.daemon_start, self.daemon_pid),
            per_frame(self.bench_start, std::process::id()),
        )
    }
}
