//! Helpers shared by the checkpoint tests: the example programs, a daemon
//! started with extra flags, and `tether checkpoint` calls.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_tests::{bins, daemon, raw, Sandbox};

/// How long a daemon may take from spawn to serving.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The `plan-agent` example, built next to `tether`. The examples package
/// has an integration test, so `cargo test --workspace` builds it.
pub fn plan_agent() -> PathBuf {
    let path = bins::tether().with_file_name("plan-agent");
    assert!(
        path.is_file(),
        "`plan-agent` is not built (looked for {}): run `cargo test --workspace`",
        path.display()
    );
    path
}

/// The shell example that uses only `tether checkpoint save/load`.
pub fn checkpoint_loop_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/checkpoint-loop.sh")
}

/// The store file of a sandbox's daemon.
pub fn store_file(sb: &Sandbox) -> PathBuf {
    sb.state_dir().join("tether.redb")
}

/// Saves `data` as a checkpoint of `id`; asserts exit 0 and returns the
/// stored checkpoint (from `--json`). Forced: most callers save to an
/// execution that has already ended.
pub fn save(sb: &Sandbox, id: &str, data: &str) -> Value {
    let out = sb.run_with_stdin(
        &["checkpoint", "save", "--json", "--force", "--execution", id],
        data.as_bytes(),
    );
    out.assert_success();
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("`checkpoint save --json` printed {:?}: {e}", out.stdout))
}

/// `tether checkpoint load --execution ID`: exit code and stdout.
pub fn load(sb: &Sandbox, id: &str) -> (Option<i32>, String) {
    let out = sb.run(&["checkpoint", "load", "--execution", id]);
    (out.code, out.stdout)
}

/// `tether checkpoint list --json ID`, parsed, newest first.
pub fn list(sb: &Sandbox, id: &str) -> Vec<Value> {
    let out = sb.run(&["checkpoint", "list", "--json", id]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad list line {l:?}: {e}")))
        .collect()
}

/// Microseconds since the epoch, now.
pub fn now_micros() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// A daemon started with extra flags (the shared `Daemon` takes none).
/// Dropping it kills it.
#[derive(Debug)]
pub struct FlaggedDaemon {
    socket: PathBuf,
    state_dir: PathBuf,
    log: PathBuf,
    flags: Vec<String>,
    child: Option<Child>,
}

impl FlaggedDaemon {
    /// Starts `tetherd FLAGS...` on the sandbox's socket and state.
    pub fn start(sb: &Sandbox, flags: &[&str]) -> Self {
        let mut daemon = Self {
            socket: sb.socket(),
            state_dir: sb.state_dir(),
            log: sb.file("tetherd-flagged.log"),
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            child: None,
        };
        daemon.spawn();
        daemon
    }

    /// `kill -9`, then reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 tetherd");
            let _ = child.wait();
        }
    }

    /// Starts it again on the same state.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a running daemon");
        self.spawn();
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the daemon log");
        let mut cmd: Command = daemon::command(&self.socket, &self.state_dir);
        cmd.args(&self.flags).stdout(Stdio::null()).stderr(log);
        let child = cmd.spawn().expect("spawn tetherd");
        let pid = child.id();
        self.child = Some(child);
        let start = Instant::now();
        loop {
            match raw::status(&self.socket) {
                Ok(info) if info.pid == pid => return,
                _ if start.elapsed() > READY_TIMEOUT => panic!(
                    "tetherd {:?} did not serve within {READY_TIMEOUT:?}; log:\n{}",
                    self.flags,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for FlaggedDaemon {
    fn drop(&mut self) {
        self.kill9();
    }
}
