//! `mirror`: what mirroring into NATS JetStream costs and how fast it
//! goes, against a `tetherd` and a `nats-server -js` it starts.
//!
//! 1. W1's ingest (one producer, `--window` appends in flight) of
//!    `--frames` frames with the mirror off, then on (a fresh daemon and
//!    store each): frames/s and their ratio.
//! 2. With the mirror on: how long until JetStream has acknowledged every
//!    frame (mirror throughput, counted from the first append), and the
//!    mirror lag when the producer finished.
//! 3. Catch-up: NATS stopped, `--catch-up` frames appended, NATS started
//!    again; the time until JetStream has them all.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use futures_util::SinkExt;
use tether_protocol::{Append, Capabilities, FrameKind, Request, Response};

use tether_bench::{call, connect, next, run_bench, tetherd_path, BoxError, Conn, Daemon};

/// Mirror cost, throughput and catch-up against a fresh tetherd.
#[derive(Debug, Parser)]
#[command(name = "mirror")]
struct Args {
    /// The tetherd binary [default: next to this one].
    #[arg(long, value_name = "PATH")]
    tetherd: Option<PathBuf>,
    /// The nats-server binary.
    #[arg(long, value_name = "PATH", default_value = "nats-server")]
    nats_server: PathBuf,
    /// Frames of the ingest runs.
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Frames appended while NATS is down, for the catch-up.
    #[arg(long, default_value_t = 1_000_000)]
    catch_up: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Appends in flight before the producer waits for an ack.
    #[arg(long, default_value_t = 1024)]
    window: u64,
    /// Directory for the stores [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    run_bench("mirror", bench(Args::parse()))
}

/// A `nats-server -js`, stopped when dropped.
struct Nats {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Nats {
    fn start(&mut self) -> Result<(), BoxError> {
        let child = Command::new(&self.bin)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err("nats-server did not listen within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn bench(args: Args) -> Result<(), BoxError> {
    let tetherd = tetherd_path(args.tetherd.as_deref())?;
    let temp = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut nats = Nats {
        bin: args.nats_server.clone(),
        port,
        dir: temp.path().join("nats"),
        child: None,
    };
    nats.start()?;
    let config = temp.path().join("mirror.toml");
    std::fs::write(
        &config,
        format!("[mirror]\nnats_url = \"nats://127.0.0.1:{port}\"\nsource = \"bench\"\n"),
    )?;

    // 1. Ingest with the mirror off.
    let off_dir = temp.path().join("off");
    std::fs::create_dir_all(&off_dir)?;
    let (daemon, socket) = Daemon::start(&tetherd, &off_dir, &[])?;
    let mut conn = open(&socket).await?;
    let off = ingest(&mut conn, &args, "w1", 0).await?;
    drop(conn);
    drop(daemon);
    let off_rate = args.frames as f64 / off.as_secs_f64();

    // 2. Ingest with the mirror on, then until JetStream has it all.
    let on_dir = temp.path().join("on");
    std::fs::create_dir_all(&on_dir)?;
    let (_daemon, socket) = Daemon::start(
        &tetherd,
        &on_dir,
        &["--config".as_ref(), config.as_os_str()],
    )?;
    let mut conn = open(&socket).await?;
    let started = Instant::now();
    let on = ingest(&mut conn, &args, "w1", 0).await?;
    let lag_at_end = lag(&mut conn, "w1").await?;
    wait_mirrored(&mut conn, "w1", args.frames).await?;
    let mirrored_in = started.elapsed();
    let on_rate = args.frames as f64 / on.as_secs_f64();

    // 3. Catch-up after NATS comes back.
    nats.stop();
    ingest(&mut conn, &args, "w1", args.frames).await?;
    let total = args.frames + args.catch_up;
    let back = Instant::now();
    nats.start()?;
    wait_mirrored(&mut conn, "w1", total).await?;
    let catch_up = back.elapsed();

    println!("frames\tsize\tw1_off_per_s\tw1_on_per_s\ton_over_off\tmirror_per_s\tlag_at_ingest_end\tcatch_up_frames\tcatch_up_s");
    println!(
        "{}\t{}\t{off_rate:.0}\t{on_rate:.0}\t{:.3}\t{:.0}\t{lag_at_end}\t{}\t{:.2}",
        args.frames,
        args.size,
        on_rate / off_rate,
        args.frames as f64 / mirrored_in.as_secs_f64(),
        args.catch_up,
        catch_up.as_secs_f64(),
    );
    Ok(())
}

async fn open(socket: &Path) -> Result<Conn, BoxError> {
    connect(
        socket,
        Duration::from_secs(30),
        Capabilities::NONE,
        "mirror-bench",
    )
    .await
}

/// Appends frames `from + 1 ..= from + frames` (producer seqs) to `stream`
/// with up to `--window` unacknowledged; returns how long it took.
async fn ingest(
    conn: &mut Conn,
    args: &Args,
    stream: &str,
    from: u64,
) -> Result<Duration, BoxError> {
    let frames = if from == 0 {
        args.frames
    } else {
        args.catch_up
    };
    let payload = Bytes::from(vec![b'x'; args.size]);
    let start = Instant::now();
    let (mut sent, mut acked) = (from, from);
    let end = from + frames;
    while acked < end {
        let upto = end.min(acked + args.window);
        while sent < upto {
            sent += 1;
            conn.feed(Request::Append(Append {
                stream: stream.into(),
                producer: "mirror-bench".into(),
                producer_seq: sent,
                kind: FrameKind::Data,
                payload: payload.clone(),
            }))
            .await?;
        }
        conn.flush().await?;
        match next(conn).await? {
            Response::Appended(a) => acked = a.producer_seq,
            other => return Err(format!("expected Appended, got {}", other.name()).into()),
        }
    }
    Ok(start.elapsed())
}

/// `(mirrored_seq, last_seq)` of `stream`.
async fn position(conn: &mut Conn, stream: &str) -> Result<(u64, u64), BoxError> {
    match call(conn, Request::MirrorStatus).await? {
        Response::MirrorStatus(Some(info)) => Ok(info
            .streams
            .iter()
            .find(|s| s.stream == stream)
            .map_or((0, 0), |s| (s.mirrored_seq, s.last_seq))),
        Response::MirrorStatus(None) => Err("the daemon does not mirror".into()),
        other => Err(format!("expected MirrorStatus, got {}", other.name()).into()),
    }
}

async fn lag(conn: &mut Conn, stream: &str) -> Result<u64, BoxError> {
    let (mirrored, last) = position(conn, stream).await?;
    Ok(last.saturating_sub(mirrored))
}

/// Waits until JetStream has acknowledged `stream` through `seq`.
async fn wait_mirrored(conn: &mut Conn, stream: &str, seq: u64) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    while position(conn, stream).await?.0 < seq {
        if Instant::now() > deadline {
            return Err(format!("{stream} not mirrored through {seq} in 30 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
