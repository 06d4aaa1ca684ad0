//! Pieces every workload uses: payloads that carry their send time,
//! appends, subscribing, and the daemon's peak memory and CPU time.

use std::ops::RangeInclusive;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use futures_util::SinkExt;
use tether_protocol::codec::{
    decode_durable_view, decode_wire_message, encode_append, encode_into, poll_frame, PREFIX_LEN,
};
use tether_protocol::{
    AppendView, Capabilities, DurableAck, FrameKind, Request, Response, StartAt, Subscribe,
    DEFAULT_MAX_FRAME_LEN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::FramedParts;

use tether_bench::{connect, cpu_seconds, daemon_error, next, BoxError, Conn, READ_BYTES};

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

/// The send time a payload carries; 0 for a payload too short.
pub fn sent_at(payload: &[u8]) -> u64 {
    payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Appends of producer `bench` on one stream, written into a connection's
/// buffer from borrowed parts: a batch costs the load generator no
/// allocation per frame, so that its CPU goes to the daemon's side of
/// the machine instead.
pub struct Appends {
    stream: String,
    /// The payload every append carries, its first 8 bytes the send time
    /// in ns since the workload's clock.
    payload: Vec<u8>,
}

impl Appends {
    /// Appends of `size`-byte payloads on `stream`.
    pub fn new(stream: &str, size: usize) -> Appends {
        Appends {
            stream: stream.to_owned(),
            payload: vec![b'x'; size],
        }
    }

    /// Writes the appends with producer seqs `seqs` into `conn`'s buffer
    /// (for its next flush). They carry one send time, taken before the
    /// first is written: a later one's latency counts from before it was
    /// sent, never from after.
    pub fn feed(
        &mut self,
        conn: &mut Conn,
        seqs: RangeInclusive<u64>,
        clock: &Instant,
    ) -> Result<(), BoxError> {
        let now = clock.elapsed().as_nanos() as u64;
        let stamp = self.payload.len().min(8);
        self.payload[..stamp].copy_from_slice(&now.to_le_bytes()[..stamp]);
        let dst = conn.write_buffer_mut();
        for producer_seq in seqs {
            let append = AppendView {
                stream: &self.stream,
                producer: "bench",
                producer_seq,
                kind: FrameKind::Data,
                payload: &self.payload,
            };
            encode_append(append, dst, DEFAULT_MAX_FRAME_LEN)?;
        }
        Ok(())
    }

    /// Sends the append with producer seq `producer_seq` and returns the
    /// next response.
    pub async fn call(
        &mut self,
        conn: &mut Conn,
        producer_seq: u64,
        clock: &Instant,
    ) -> Result<Response, BoxError> {
        self.feed(conn, producer_seq..=producer_seq, clock)?;
        conn.flush().await?;
        next(conn).await
    }
}

/// Appends one frame and waits for its ack: this creates the stream, so
/// that followers can attach.
pub async fn create_stream(
    conn: &mut Conn,
    stream: &str,
    size: usize,
    clock: &Instant,
) -> Result<(), BoxError> {
    match Appends::new(stream, size).call(conn, 0, clock).await? {
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
///
/// Frames are read in place from the connection's buffer, and a frame's
/// arrival is the moment the read that completed it returned (one clock
/// reading per read, not per frame, so that frames later in a read do not
/// count the time spent looking at those before them).
pub async fn receive(
    conn: Conn,
    frames: u64,
    clock: Instant,
    ack_every: Option<u64>,
) -> Result<Vec<u64>, BoxError> {
    let FramedParts {
        mut io,
        read_buf: mut buf,
        ..
    } = conn.into_parts();
    let mut latencies = Vec::with_capacity(frames as usize);
    let mut last_seq = 0u64;
    let mut acks = BytesMut::new();
    while (latencies.len() as u64) < frames {
        buf.reserve(READ_BYTES);
        if io.read_buf(&mut buf).await? == 0 {
            return Err("daemon closed the connection".into());
        }
        let arrived = clock.elapsed().as_nanos() as u64;
        while let Some(len) = poll_frame(&mut buf, DEFAULT_MAX_FRAME_LEN)? {
            let body = &buf[PREFIX_LEN..len];
            match decode_durable_view(body)? {
                Some((seq, frame)) => {
                    latencies.push(arrived.saturating_sub(sent_at(frame.payload)));
                    check_order(last_seq, seq)?;
                    last_seq = seq;
                    let every = ack_every.unwrap_or(0);
                    if every > 0 && (latencies.len() as u64).is_multiple_of(every) {
                        let ack = Request::DurableAck(DurableAck { through_seq: seq });
                        encode_into(&ack, &mut acks, DEFAULT_MAX_FRAME_LEN)?;
                    }
                }
                None => match decode_wire_message::<Response>(body)? {
                    Response::Acked(_) if ack_every.is_some() => {}
                    Response::Error(e) => return Err(daemon_error(&e)),
                    other => return Err(format!("follower got {other:?}").into()),
                },
            }
            buf.advance(len);
        }
        if !acks.is_empty() {
            io.write_all(&acks).await?;
            acks.clear();
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
