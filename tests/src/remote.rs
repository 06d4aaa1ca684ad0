//! Remote access fixtures: a throwaway `sshd` on 127.0.0.1, the ssh
//! command line that trusts only it, and extra local users for the access
//! checks.
//!
//! The sshd runs as root (it must, to log users in) from a config, host key
//! and `authorized_keys` in the test's own directory, and puts the built
//! `tether` first on the PATH of the sessions it opens (through the key's
//! `environment=` option), so `tether dial-stdio` runs the binary under
//! test. Fixtures that cannot run here (not root, no sshd installed) return
//! `None` after printing why; `.ci/run` installs openssh-server so that CI
//! always runs them.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::bins;
use crate::process::Background;
use crate::procs;

/// Where Debian installs the ssh daemon.
const SSHD: &str = "/usr/sbin/sshd";

/// How long sshd may take to listen.
const SSHD_READY: Duration = Duration::from_secs(20);

/// A running sshd for one test; killed on drop.
#[derive(Debug)]
pub struct Sshd {
    port: u16,
    dir: PathBuf,
    _process: Background,
}

impl Sshd {
    /// Starts an sshd with keys and config under `dir`, or prints why it
    /// cannot and returns `None`.
    pub fn start(dir: &Path) -> Option<Self> {
        if !is_root() {
            eprintln!("note: skipped: running sshd for the remote tests needs root");
            return None;
        }
        if !Path::new(SSHD).is_file() {
            eprintln!("note: skipped: {SSHD} is not installed (apt-get install openssh-server)");
            return None;
        }
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd").expect("create /run/sshd");
        keygen(&dir.join("host_key"));
        keygen(&dir.join("user_key"));
        keygen(&dir.join("stranger_key"));
        let bin_dir = bins::tether()
            .parent()
            .expect("tether's directory")
            .to_owned();
        let user_pub = read(&dir.join("user_key.pub"));
        std::fs::write(
            dir.join("authorized_keys"),
            format!(
                "environment=\"PATH={}:/usr/bin:/bin\" {user_pub}",
                bin_dir.display()
            ),
        )
        .expect("write authorized_keys");
        let port = free_port();
        std::fs::write(dir.join("sshd_config"), sshd_config(dir, port)).expect("write config");
        let host_pub = read(&dir.join("host_key.pub"));
        std::fs::write(
            dir.join("known_hosts"),
            format!("[127.0.0.1]:{port} {host_pub}"),
        )
        .expect("write known_hosts");
        let stranger_pub = read(&dir.join("stranger_key.pub"));
        std::fs::write(
            dir.join("wrong_known_hosts"),
            format!("[127.0.0.1]:{port} {stranger_pub}"),
        )
        .expect("write wrong_known_hosts");
        let mut cmd = Command::new(SSHD);
        cmd.arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(dir.join("sshd_config"))
            .arg("-h")
            .arg(dir.join("host_key"));
        let mut process = Background::spawn("sshd", cmd, dir);
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if !process.is_running() || started.elapsed() > SSHD_READY {
                panic!("sshd did not listen on port {port}:\n{}", process.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self {
            port,
            dir: dir.to_owned(),
            _process: process,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `ssh://root@127.0.0.1:PORT/SOCKET`.
    pub fn url(&self, socket: &Path) -> String {
        format!("ssh://root@127.0.0.1:{}{}", self.port, socket.display())
    }

    /// `$TETHER_SSH` for a client that has the right key and trusts only
    /// this sshd's host key.
    pub fn ssh_command(&self) -> String {
        self.ssh_with("user_key", "known_hosts")
    }

    /// `$TETHER_SSH` with a key that is not authorized.
    pub fn ssh_command_with_wrong_key(&self) -> String {
        self.ssh_with("stranger_key", "known_hosts")
    }

    /// `$TETHER_SSH` that expects another host key than the one sshd has.
    pub fn ssh_command_with_wrong_host_key(&self) -> String {
        self.ssh_with("user_key", "wrong_known_hosts")
    }

    fn ssh_with(&self, key: &str, known_hosts: &str) -> String {
        format!(
            "ssh -F /dev/null -i {} -o IdentitiesOnly=yes -o UserKnownHostsFile={} \
             -o StrictHostKeyChecking=yes -o LogLevel=ERROR",
            self.dir.join(key).display(),
            self.dir.join(known_hosts).display()
        )
    }
}

/// The `ssh` processes that `parent` started.
pub fn ssh_children(parent: u32) -> Vec<u32> {
    procs::all_pids()
        .into_iter()
        .filter(|&pid| procs::stat(pid).is_some_and(|s| s.ppid == parent && s.comm == "ssh"))
        .collect()
}

fn sshd_config(dir: &Path, port: u16) -> String {
    format!(
        "ListenAddress 127.0.0.1\n\
         Port {port}\n\
         HostKey {host_key}\n\
         AuthorizedKeysFile {keys}\n\
         PermitRootLogin prohibit-password\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         StrictModes no\n\
         PermitUserEnvironment PATH\n\
         PidFile none\n\
         LogLevel ERROR\n",
        host_key = dir.join("host_key").display(),
        keys = dir.join("authorized_keys").display(),
    )
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "tether-test", "-f"])
        .arg(path)
        .status()
        .expect("run ssh-keygen");
    assert!(status.success(), "ssh-keygen failed for {}", path.display());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// True when the tests run as root.
pub fn is_root() -> bool {
    tether_protocol::paths::current_uid() == 0
}

/// A local user made for the tests.
#[derive(Debug, Clone, Copy)]
pub struct TestUser {
    pub uid: u32,
    pub gid: u32,
}

/// The group whose members the access tests configure as readers.
pub const READERS_GROUP: &str = "tether-it-readers";
/// A user in [`READERS_GROUP`] (listed as a member, not by primary gid).
pub const READER: &str = "tether-it-reader";
/// A user in no group the daemon knows.
pub const STRANGER: &str = "tether-it-stranger";

/// Creates (once) [`READERS_GROUP`], [`READER`] and [`STRANGER`], and
/// returns `(reader, stranger)`; `None`, after printing why, when not root.
pub fn test_users() -> Option<(TestUser, TestUser)> {
    static SETUP: Mutex<()> = Mutex::new(());
    if !is_root() {
        eprintln!("note: skipped: creating test users with useradd needs root");
        return None;
    }
    let _once = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if group_id(READERS_GROUP).is_none() {
        run_admin("groupadd", &[READERS_GROUP]);
    }
    if user_id(READER, "-u").is_none() {
        run_admin("useradd", &["-M", "-N", "-G", READERS_GROUP, READER]);
    }
    if user_id(STRANGER, "-u").is_none() {
        run_admin("useradd", &["-M", "-N", STRANGER]);
    }
    let user = |name| TestUser {
        uid: user_id(name, "-u").expect("uid of a user just made"),
        gid: user_id(name, "-g").expect("gid of a user just made"),
    };
    Some((user(READER), user(STRANGER)))
}

/// The group whose members the question tests configure as answerers.
pub const ANSWERERS_GROUP: &str = "tether-it-answerers";
/// A user in [`ANSWERERS_GROUP`] (listed as a member, not by primary gid).
pub const ANSWERER: &str = "tether-it-answerer";

/// Creates (once) [`ANSWERERS_GROUP`] and [`ANSWERER`] and returns the
/// user; `None`, after printing why, when not root.
pub fn answerer_user() -> Option<TestUser> {
    static SETUP: Mutex<()> = Mutex::new(());
    if !is_root() {
        eprintln!("note: skipped: creating test users with useradd needs root");
        return None;
    }
    let _once = SETUP.lock().unwrap_or_else(|e| e.into_inner());
    if group_id(ANSWERERS_GROUP).is_none() {
        run_admin("groupadd", &[ANSWERERS_GROUP]);
    }
    if user_id(ANSWERER, "-u").is_none() {
        run_admin("useradd", &["-M", "-N", "-G", ANSWERERS_GROUP, ANSWERER]);
    }
    Some(TestUser {
        uid: user_id(ANSWERER, "-u").expect("uid of a user just made"),
        gid: user_id(ANSWERER, "-g").expect("gid of a user just made"),
    })
}

/// `id FLAG NAME` as a number: `-u` the uid, `-g` the primary gid.
fn user_id(name: &str, flag: &str) -> Option<u32> {
    let output = Command::new("id").args([flag, name]).output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// The gid of group `name`, from `getent group`.
fn group_id(name: &str) -> Option<u32> {
    let output = Command::new("getent").args(["group", name]).output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout)
        .split(':')
        .nth(2)?
        .trim()
        .parse()
        .ok()
}

fn run_admin(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    // Another test binary may have made it in the meantime.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() || stderr.contains("already exists"),
        "{program} {args:?} failed: {stderr}"
    );
}
