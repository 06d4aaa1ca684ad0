//! What the bench binaries share: starting a throwaway `tetherd`, and a bare
//! protocol connection to it (no client library, so the figures are the
//! daemon's).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tether_protocol::{
    Capabilities, ClientCodec, ErrorFrame, Hello, Request, Response, PROTOCOL_VERSION,
};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

/// A framed protocol connection.
pub type Conn = Framed<UnixStream, ClientCodec>;
/// Errors are reported, not handled, in a bench.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A daemon started for one run; killed when dropped, however the run ends.
#[derive(Debug)]
pub struct Daemon(Child);

impl Daemon {
    /// Starts `tetherd` with its socket (`s.sock`, returned) and its state
    /// (`state/`) in `dir`, plus `extra` arguments, logging only warnings.
    pub fn start(
        tetherd: &Path,
        dir: &Path,
        extra: &[&std::ffi::OsStr],
    ) -> Result<(Daemon, PathBuf), BoxError> {
        let socket = dir.join("s.sock");
        let child = Command::new(tetherd)
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(extra)
            .env("TETHER_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", tetherd.display()))?;
        Ok((Daemon(child), socket))
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a bench binary's `bench` on a current-thread runtime: exit 0 when
/// it succeeds, else its error on stderr after `name` and exit 1.
pub fn run_bench(
    name: &str,
    bench: impl std::future::Future<Output = Result<(), BoxError>>,
) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `tetherd` from `--tetherd`, else next to this executable.
pub fn tetherd_path(flag: Option<&Path>) -> Result<PathBuf, BoxError> {
    match flag {
        Some(path) => Ok(path.to_owned()),
        None => Ok(std::env::current_exe()?
            .parent()
            .ok_or("cannot locate this executable's directory")?
            .join("tetherd")),
    }
}

/// How much a connection reads at most at once: replays and deep windows
/// arrive in bulk.
pub const READ_BYTES: usize = 64 * 1024;

/// A daemon's error frame, as the error a workload fails with.
pub fn daemon_error(e: &ErrorFrame) -> BoxError {
    format!("daemon error {}: {}", e.code, e.message).into()
}

/// The next response; a daemon error or a closed connection is an error.
pub async fn next(conn: &mut Conn) -> Result<Response, BoxError> {
    match conn.next().await {
        Some(Ok(Response::Error(e))) => Err(daemon_error(&e)),
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(e.into()),
        None => Err("daemon closed the connection".into()),
    }
}

/// Sends `request` and returns the next response.
pub async fn call(conn: &mut Conn, request: Request) -> Result<Response, BoxError> {
    conn.send(request).await?;
    next(conn).await
}

/// Connects and says Hello, retrying until the daemon is up or `patience`
/// ends.
pub async fn connect(
    socket: &Path,
    patience: Duration,
    capabilities: Capabilities,
    client: &str,
) -> Result<Conn, BoxError> {
    let deadline = Instant::now() + patience;
    let stream = loop {
        match UnixStream::connect(socket).await {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot connect to {}: {e}", socket.display()).into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut conn = Framed::with_capacity(stream, ClientCodec::new(), READ_BYTES);
    let hello = Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities,
        client: client.into(),
    });
    match call(&mut conn, hello).await? {
        Response::HelloOk(_) => Ok(conn),
        other => Err(format!("expected HelloOk, got {other:?}").into()),
    }
}

/// The value at percentile `p` (0..=1) of sorted samples; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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
