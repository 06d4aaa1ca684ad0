//! The harness the supervisor and checkpoint tests share: a daemon run
//! in-process with a stand-in shim (a shell script that keeps its spec and
//! pid for the test, then sleeps), and a bare protocol client, so that the
//! test speaks the shim's side of the protocol itself.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tether_protocol::{
    Capabilities, ClientCodec, ExitStatus, Hello, Request, Response, ShimHello, ShimSpec,
    ShimSpecFull, WorkerExited, PROTOCOL_VERSION,
};
use tetherd::supervisor::procfs::{self, Pidfd, ProcessId};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

pub const FAKE_SHIM: &str = r#"#!/bin/sh
dir=$(dirname "$0")
cat > "$dir/spec-$1-$2"
echo $$ > "$dir/pid-$1-$2.tmp"
mv "$dir/pid-$1-$2.tmp" "$dir/pid-$1-$2"
exec sleep 120
"#;

pub const WAIT: Duration = Duration::from_secs(10);

/// A state directory, a socket and a stand-in shim; daemons come and go.
pub struct Env {
    dir: tempfile::TempDir,
    shim: PathBuf,
    /// Stand-in shims seen, killed when the test ends.
    shims: Mutex<Vec<ProcessId>>,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join("fake-shim");
        std::fs::write(&shim, FAKE_SHIM).unwrap();
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        Env {
            dir,
            shim,
            shims: Mutex::new(Vec::new()),
        }
    }

    /// The directory everything of the test lives in.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("tether.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn config(&self) -> tetherd::Config {
        let mut config = tetherd::Config::new(self.socket(), self.state_dir());
        config.shim = Some(self.shim.clone());
        config
    }

    pub async fn start(&self) -> Daemon {
        self.start_with(self.config()).await
    }

    pub async fn start_with(&self, config: tetherd::Config) -> Daemon {
        let token = CancellationToken::new();
        let task = tokio::spawn(tetherd::run(config, token.clone()));
        let deadline = Instant::now() + WAIT;
        while UnixStream::connect(self.socket()).await.is_err() {
            assert!(Instant::now() < deadline, "daemon did not start");
            assert!(!task.is_finished(), "daemon exited at start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Daemon {
            socket: self.socket(),
            token,
            task,
        }
    }

    /// The stand-in shim of `attempt`, once it has started.
    pub async fn shim_of(&self, id: &str, attempt: u32) -> ProcessId {
        let path = self.dir.path().join(format!("pid-{id}-{attempt}"));
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let pid: u32 = text.trim().parse().unwrap();
                let shim = procfs::identify(pid).unwrap();
                self.shims.lock().unwrap().push(shim);
                return shim;
            }
            assert!(
                Instant::now() < deadline,
                "no shim for attempt {attempt} of {id}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn has_shim(&self, id: &str, attempt: u32) -> bool {
        self.dir.path().join(format!("pid-{id}-{attempt}")).exists()
    }

    pub fn spec_of(&self, id: &str, attempt: u32) -> ShimSpec {
        self.full_spec_of(id, attempt).spec
    }

    pub fn full_spec_of(&self, id: &str, attempt: u32) -> ShimSpecFull {
        let bytes = std::fs::read(self.dir.path().join(format!("spec-{id}-{attempt}"))).unwrap();
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(bytes.len(), 4 + len, "exactly one frame");
        tether_protocol::codec::decode_message(&bytes[4..]).unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for shim in self.shims.lock().unwrap().drain(..) {
            kill(shim);
        }
    }
}

pub fn kill(id: ProcessId) {
    if let Ok(Some(pidfd)) = Pidfd::open_verified(id) {
        let _ = pidfd.signal(libc::SIGKILL);
    }
}

pub struct Daemon {
    pub socket: PathBuf,
    pub token: CancellationToken,
    pub task: tokio::task::JoinHandle<tetherd::Result<()>>,
}

impl Daemon {
    pub async fn stop(self) {
        self.token.cancel();
        self.task.await.unwrap().unwrap();
    }
}

pub struct Client(pub Framed<UnixStream, ClientCodec>);

impl Client {
    pub async fn connect(socket: &Path) -> Client {
        let stream = UnixStream::connect(socket).await.unwrap();
        let mut client = Client(Framed::new(stream, ClientCodec::new()));
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::DURABLE,
            client: "daemon test".into(),
        });
        match client.call(hello).await {
            Response::HelloOk(_) => client,
            other => panic!("expected HelloOk, got {other:?}"),
        }
    }

    pub async fn send(&mut self, request: Request) {
        self.0.send(request).await.unwrap();
    }

    pub async fn recv(&mut self) -> Response {
        tokio::time::timeout(WAIT, self.0.next())
            .await
            .expect("answer within the wait")
            .expect("connection open")
            .unwrap()
    }

    pub async fn call(&mut self, request: Request) -> Response {
        self.send(request).await;
        self.recv().await
    }

    /// Says hello as the shim of `attempt` and expects to be accepted.
    pub async fn shim(
        socket: &Path,
        id: &str,
        attempt: u32,
        shim: ProcessId,
        worker: Option<ProcessId>,
    ) -> Client {
        let mut client = Client::connect(socket).await;
        match client.call(shim_hello(id, attempt, shim, worker)).await {
            Response::ShimAccepted => client,
            other => panic!("expected ShimAccepted, got {other:?}"),
        }
    }

    pub async fn exited(&mut self, id: &str, attempt: u32, status: ExitStatus) {
        let request = Request::WorkerExited(WorkerExited {
            execution: id.into(),
            attempt,
            status,
        });
        match self.call(request).await {
            Response::ExitRecorded => {}
            other => panic!("expected ExitRecorded, got {other:?}"),
        }
    }
}

pub fn shim_hello(id: &str, attempt: u32, shim: ProcessId, worker: Option<ProcessId>) -> Request {
    Request::ShimHello(ShimHello {
        execution: id.into(),
        attempt,
        shim_pid: shim.pid,
        shim_start_ticks: shim.start_ticks,
        worker_pid: worker.map(|w| w.pid),
        worker_start_ticks: worker.map_or(0, |w| w.start_ticks),
        boot_id: procfs::boot_id().unwrap(),
    })
}

pub async fn call(socket: &Path, request: Request) -> Response {
    Client::connect(socket).await.call(request).await
}
