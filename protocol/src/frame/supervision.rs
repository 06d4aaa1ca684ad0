//! Supervision: what `tether run` asks for, and what a shim and the daemon
//! tell each other about a worker.

// One module in several files: the message types name each other freely,
// in code and in doc links.
use super::*;

/// When a worker that ended is started again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    /// Never: the first exit ends the execution.
    Never,
    /// After a failure (non-zero exit, signal, lost shim), not after exit 0.
    OnFailure,
    /// After every exit, until `max_restarts` or the deadline.
    Always,
}

impl RestartPolicy {
    /// The spelling used on the command line and in output.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Never => "never",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Always => "always",
        }
    }

    /// The policy [`RestartPolicy::as_str`] spells `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Never, Self::OnFailure, Self::Always]
            .into_iter()
            .find(|policy| policy.as_str() == name)
    }
}

/// What `tether run` asks the daemon to start.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// A label for `tether ps`; not unique.
    pub name: Option<String>,
    /// Program and arguments; never empty.
    pub command: Vec<String>,
    /// Working directory of the worker; the daemon's own when `None`.
    pub cwd: Option<String>,
    /// Variables added to the worker's environment.
    pub env: Vec<(String, String)>,
    pub restart: RestartPolicy,
    /// Restarts allowed after the first attempt; `None` is unlimited.
    pub max_restarts: Option<u32>,
    /// No attempt starts more than this long after the run was submitted.
    pub deadline_ms: Option<u64>,
}

impl RunSpec {
    /// How many arguments and variables, and how many bytes of them and
    /// of the directory, the spec carries: what [`crate::MAX_RUN_ITEMS`]
    /// and [`crate::MAX_RUN_BYTES`] bound.
    pub fn size(&self) -> (usize, usize) {
        let items = self.command.len() + self.env.len();
        let bytes = self.command.iter().map(String::len).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self.cwd.as_ref().map_or(0, String::len);
        (items, bytes)
    }
}

/// [`RunSpec`] with how the worker's environment and output are set up:
/// the body of [`Request::RunFull`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunSpecFull {
    pub spec: RunSpec,
    /// `spec.env` is the worker's whole environment (the caller's, or only
    /// the variables asked for); otherwise it is added to the daemon's own.
    pub whole_env: bool,
    /// The worker's stdout and stderr are one pseudo-terminal, so that
    /// C-stdio programs flush each line; its output is all kind `stdout`.
    pub pty: bool,
    /// The execution's id, chosen by the caller (see [`validate_run_id`]):
    /// when an execution with this id exists, nothing is started and its
    /// id is the answer. `None`: the daemon makes a new id.
    pub id: Option<String>,
    /// `run --label K=V` pairs, for `ps --label` to filter on.
    pub labels: Vec<(String, String)>,
    /// The execution that started this one; it must exist.
    pub parent: Option<String>,
    /// Consecutive failed attempts without progress (no checkpoint, no
    /// step) after which the execution ends `failed` ("crash loop");
    /// `None`: the daemon's default.
    pub max_failures_without_progress: Option<u32>,
    /// The signal `tether stop` sends first, by name without `SIG`
    /// (one of [`STOP_SIGNALS`]); `None`: `TERM`.
    pub stop_signal: Option<String>,
}

impl From<RunSpec> for RunSpecFull {
    /// A plain [`Request::Run`]: the spec's variables added to the
    /// daemon's environment, output through pipes.
    fn from(spec: RunSpec) -> Self {
        Self {
            spec,
            whole_env: false,
            pty: false,
            id: None,
            labels: Vec::new(),
            parent: None,
            max_failures_without_progress: None,
            stop_signal: None,
        }
    }
}

/// Longest id a caller may choose with `run --id`, in bytes.
pub const MAX_RUN_ID_LEN: usize = 128;

/// The signals `run --stop-signal` accepts, by name without `SIG`.
pub const STOP_SIGNALS: [&str; 7] = ["TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "KILL"];

/// Checks an id chosen with `run --id`: 1 to [`MAX_RUN_ID_LEN`] bytes of
/// `A-Z a-z 0-9 . _ -`. Returns the rule broken, to be shown as it is.
pub fn validate_run_id(id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > MAX_RUN_ID_LEN || !id.chars().all(allowed) {
        return Err(format!(
            "invalid execution id {id:?}: an id is 1 to {MAX_RUN_ID_LEN} characters of \
             A-Z, a-z, 0-9, '.', '_' and '-'"
        ));
    }
    if id.chars().all(|c| c == '.') {
        return Err(format!(
            "invalid execution id {id:?}: an id cannot be only dots"
        ));
    }
    Ok(())
}

/// The [`STOP_SIGNALS`] name `name` means (`TERM`, `SIGTERM`, `term`).
pub fn stop_signal_name(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    STOP_SIGNALS.into_iter().find(|s| *s == bare)
}

/// Linux's signal names, by number from 1.
const SIGNAL_NAMES: [&str; 31] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

/// A signal's name (`SIGKILL`), or its number for one without a common
/// name.
pub fn signal_name(signal: i32) -> String {
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| SIGNAL_NAMES.get(i))
        .map_or_else(|| signal.to_string(), |name| (*name).to_owned())
}

/// The number of a signal named without `SIG` (`TERM` is 15), on Linux.
pub fn signal_number(bare_name: &str) -> Option<i32> {
    let position = SIGNAL_NAMES
        .iter()
        .position(|name| name.strip_prefix("SIG") == Some(bare_name))?;
    i32::try_from(position + 1).ok()
}

/// The lifecycle of an execution. See the supervisor's transition table.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecState {
    /// Recorded, no shim started yet.
    Pending,
    /// A shim has been started for the current attempt.
    Starting,
    /// The shim reported the worker running.
    Running,
    /// Waiting to start the next attempt.
    Backoff,
    /// The worker exited 0 and no restart follows. Final.
    Completed,
    /// The attempt failed; final unless a restart follows.
    Failed,
    /// Stopped by `tether stop`. Final.
    Cancelled,
    /// The shim vanished without reporting the worker's exit.
    Lost,
    /// Running, with a question of the current attempt open (`tether
    /// ask`); back to running once it is answered or times out.
    Waiting,
}

impl ExecState {
    /// The lowercase name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecState::Pending => "pending",
            ExecState::Starting => "starting",
            ExecState::Running => "running",
            ExecState::Backoff => "backoff",
            ExecState::Completed => "completed",
            ExecState::Failed => "failed",
            ExecState::Cancelled => "cancelled",
            ExecState::Lost => "lost",
            ExecState::Waiting => "waiting",
        }
    }

    /// True once the execution is over: no attempt runs or will run.
    pub fn has_ended(self) -> bool {
        matches!(
            self,
            ExecState::Completed | ExecState::Failed | ExecState::Cancelled | ExecState::Lost
        )
    }
}

/// What [`find_execution`] needs to know of an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named<'a> {
    pub id: &'a str,
    pub name: Option<&'a str>,
    pub ended: bool,
    pub created_micros: u64,
}

impl<'a> From<&'a ExecutionInfo> for Named<'a> {
    fn from(e: &'a ExecutionInfo) -> Self {
        Self {
            id: &e.id,
            name: e.name.as_deref(),
            ended: e.state.has_ended(),
            created_micros: e.created_micros,
        }
    }
}

/// The execution `key` names among `items`: the one whose id is `key`;
/// else the live one named `key`; else, of the ended ones named `key`, the
/// newest. Clients and the daemon resolve names by this one rule.
pub fn find_execution<T>(
    items: impl IntoIterator<Item = T>,
    key: &str,
    named: impl Fn(&T) -> Named<'_>,
) -> Option<T> {
    let mut live = None;
    let mut ended: Option<(u64, T)> = None;
    for item in items {
        let n = named(&item);
        if n.id == key {
            return Some(item);
        }
        if n.name != Some(key) {
            continue;
        }
        if !n.ended {
            live = Some(item);
        } else if ended.as_ref().is_none_or(|(at, _)| n.created_micros >= *at) {
            ended = Some((n.created_micros, item));
        }
    }
    live.or(ended.map(|(_, item)| item))
}

/// How a worker ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// It could not be started at all (no such program, bad cwd, ...).
    SpawnFailed(String),
}

/// Why an execution ended, in one of the words `ps` shows in its REASON
/// column: `exit N`, `signal NAME`, `deadline`, `crash loop`,
/// `max restarts`, `stopped`, `lost` or `spawn failed`. `None` while it
/// has not ended.
pub fn ended_because(info: &ExecutionInfo) -> Option<String> {
    let reason = info.reason.as_deref().unwrap_or("");
    let word = match info.state {
        s if !s.has_ended() => return None,
        ExecState::Cancelled => "stopped".to_owned(),
        _ if reason.starts_with("crash loop") => "crash loop".to_owned(),
        _ if reason.starts_with("max restarts") => "max restarts".to_owned(),
        _ if reason == "deadline" => "deadline".to_owned(),
        ExecState::Lost => "lost".to_owned(),
        _ => match &info.last_exit {
            Some(ExitStatus::Code(code)) => format!("exit {code}"),
            Some(ExitStatus::Signal(signal)) => format!("signal {}", signal_name(*signal)),
            Some(ExitStatus::SpawnFailed(_)) => "spawn failed".to_owned(),
            // A lost attempt that a limit ended, or a shim that could not
            // be started at all.
            None if reason.starts_with("shim pid") => "lost".to_owned(),
            None => "spawn failed".to_owned(),
        },
    };
    Some(word)
}

/// One row of `tether ps`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ExecutionInfo {
    /// Also the name of the execution's output stream.
    pub id: String,
    pub name: Option<String>,
    pub state: ExecState,
    /// The current attempt's worker pid, while one runs.
    pub pid: Option<u32>,
    /// Attempts so far, the first included.
    pub attempt: u32,
    /// Attempts after the first.
    pub restarts: u32,
    pub command: Vec<String>,
    pub restart: RestartPolicy,
    /// How the last attempt ended, once one has.
    pub last_exit: Option<ExitStatus>,
    /// Why the execution is in its state, when there is more to say
    /// ("deadline", "max restarts", "exit code 78 is not retried").
    pub reason: Option<String>,
    pub created_micros: u64,
    /// The output stream's last seq.
    pub stream_last_seq: u64,
    /// The newest checkpoint: its stream seq and creation time.
    pub last_checkpoint: Option<CheckpointRef>,
}

/// One row of `tether ps` with the worker's surroundings and its use of
/// the machine: the answer to [`Request::ListExecutionsFull`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ExecutionDetail {
    pub info: ExecutionInfo,
    /// The names of the variables the execution asked for (its whole
    /// environment when `whole_env`); never their values.
    pub env_keys: Vec<String>,
    /// The worker's directory; the daemon's own when `None`.
    pub cwd: Option<String>,
    /// CPU time over the running worker's life so far, in tenths of a
    /// percent of one core (as ps(1) counts it); `None` when no worker runs.
    pub cpu_per_mille: Option<u32>,
    /// The running worker's resident memory, in bytes.
    pub rss_bytes: Option<u64>,
    /// `run --label` pairs, in the order given.
    pub labels: Vec<(String, String)>,
    /// The execution that started this one (`run --parent`).
    pub parent: Option<String>,
    /// The executions started with this one as their parent, oldest first.
    pub children: Vec<String>,
    /// `run --max-restarts`; `None` is unlimited.
    pub max_restarts: Option<u32>,
    /// `run --deadline`, in milliseconds.
    pub deadline_ms: Option<u64>,
    /// `run --stop-signal` as given; `None` is TERM.
    pub stop_signal: Option<String>,
    /// `run --max-failures-without-progress`; `None` is the daemon's.
    pub max_failures_without_progress: Option<u32>,
}

impl From<ExecutionInfo> for ExecutionDetail {
    /// What an older daemon, which answers only [`ExecutionInfo`], tells
    /// of an execution: nothing beyond it.
    fn from(info: ExecutionInfo) -> Self {
        Self {
            info,
            env_keys: Vec::new(),
            cwd: None,
            cpu_per_mille: None,
            rss_bytes: None,
            labels: Vec::new(),
            parent: None,
            children: Vec::new(),
            max_restarts: None,
            deadline_ms: None,
            stop_signal: None,
            max_failures_without_progress: None,
        }
    }
}

/// Where and when a checkpoint was taken.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointRef {
    pub seq: u64,
    pub created_micros: u64,
}

/// See [`Request::ShimHello`]. Identifies the processes by pid *and* start
/// time (field 22 of /proc/PID/stat) within one boot, so that a recycled
/// pid is never mistaken for them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShimHello {
    pub execution: String,
    pub attempt: u32,
    pub shim_pid: u32,
    pub shim_start_ticks: u64,
    /// `None` when the worker could not be started (a `WorkerExited` with
    /// `SpawnFailed` follows).
    pub worker_pid: Option<u32>,
    pub worker_start_ticks: u64,
    /// /proc/sys/kernel/random/boot_id
    pub boot_id: String,
}

/// See [`Request::WorkerExited`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WorkerExited {
    pub execution: String,
    pub attempt: u32,
    pub status: ExitStatus,
}

/// What the daemon hands a shim on its stdin (one codec frame) when it
/// starts it: everything needed to start the worker and report back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShimSpec {
    pub execution: String,
    pub attempt: u32,
    /// The daemon's socket, also given to the worker as `TETHER_SOCKET`.
    pub socket: String,
    pub command: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    /// Sets `TETHER_RESUMED=1` for the worker.
    pub resumed: bool,
    /// Longest line kept as one frame; longer lines are split.
    pub max_line: u32,
}

/// What the daemon hands a shim, in full: [`ShimSpec`] with the run's
/// environment and output settings and how the previous attempt ended.
/// A shim reads this first and a plain [`ShimSpec`] otherwise.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShimSpecFull {
    pub spec: ShimSpec,
    /// `spec.env` is the worker's whole environment rather than additions
    /// to the shim's own (see [`RunSpecFull::whole_env`]).
    pub whole_env: bool,
    /// Give the worker a pseudo-terminal for stdout and stderr.
    pub pty: bool,
    /// `TETHER_LAST_EXIT` for the worker: `code:N` or `signal:NAME`, on a
    /// restart.
    pub last_exit: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn named(id: &'static str, name: &'static str, ended: bool, at: u64) -> Named<'static> {
        Named {
            id,
            name: Some(name),
            ended,
            created_micros: at,
        }
    }

    fn find(items: &[Named<'static>], key: &str) -> Option<&'static str> {
        find_execution(items.iter(), key, |n| **n).map(|n| n.id)
    }

    #[test]
    fn an_id_wins_then_the_live_one_then_the_newest_ended_one() {
        let ended_old = named("a1", "job", true, 1);
        let ended_new = named("a2", "job", true, 2);
        let live = named("a3", "job", false, 0);
        let id_named_job = named("job", "other", true, 0);
        assert_eq!(find(&[ended_new, ended_old], "job"), Some("a2"));
        assert_eq!(find(&[ended_old, live, ended_new], "job"), Some("a3"));
        assert_eq!(find(&[live, id_named_job], "job"), Some("job"));
        assert_eq!(find(&[live], "a1"), None);
        assert_eq!(find(&[ended_old], "a1"), Some("a1"));
    }

    #[test]
    fn run_ids_follow_the_documented_rule() {
        for good in ["job-1", "A.b_c", &"x".repeat(MAX_RUN_ID_LEN)] {
            assert_eq!(validate_run_id(good), Ok(()), "{good}");
        }
        for bad in ["", "a b", "a/b", "ü", "..", &"x".repeat(MAX_RUN_ID_LEN + 1)] {
            let why = validate_run_id(bad).unwrap_err();
            assert!(why.contains("invalid execution id"), "{why}");
        }
    }

    #[test]
    fn stop_signals_are_named_with_or_without_sig() {
        assert_eq!(stop_signal_name("sigint"), Some("INT"));
        assert_eq!(stop_signal_name("TERM"), Some("TERM"));
        assert_eq!(stop_signal_name("SEGV"), None);
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("KILL"), Some(9));
        assert_eq!(signal_number("USR2"), Some(12));
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(64), "64");
    }

    #[test]
    fn the_reason_word_says_why_an_execution_ended() {
        let info = |state, last_exit, reason: Option<&str>| ExecutionInfo {
            id: "x".into(),
            name: None,
            state,
            pid: None,
            attempt: 1,
            restarts: 0,
            command: vec![],
            restart: RestartPolicy::OnFailure,
            last_exit,
            reason: reason.map(str::to_owned),
            created_micros: 0,
            stream_last_seq: 0,
            last_checkpoint: None,
        };
        let word = |state, exit, reason| ended_because(&info(state, exit, reason));
        use ExecState::*;
        assert_eq!(word(Running, None, None), None);
        assert_eq!(
            word(Completed, Some(ExitStatus::Code(0)), None).as_deref(),
            Some("exit 0")
        );
        assert_eq!(
            word(Failed, Some(ExitStatus::Signal(9)), None).as_deref(),
            Some("signal SIGKILL")
        );
        assert_eq!(
            word(Failed, Some(ExitStatus::Code(1)), Some("crash loop")).as_deref(),
            Some("crash loop")
        );
        assert_eq!(
            word(
                Failed,
                Some(ExitStatus::Code(1)),
                Some("max restarts (2) reached")
            )
            .as_deref(),
            Some("max restarts")
        );
        assert_eq!(
            word(Failed, Some(ExitStatus::Code(1)), Some("deadline")).as_deref(),
            Some("deadline")
        );
        assert_eq!(
            word(Cancelled, Some(ExitStatus::Signal(15)), None).as_deref(),
            Some("stopped")
        );
        assert_eq!(
            word(Lost, None, Some("shim pid 4 is gone")).as_deref(),
            Some("lost")
        );
        assert_eq!(
            word(Failed, Some(ExitStatus::SpawnFailed("no".into())), None).as_deref(),
            Some("spawn failed")
        );
    }
}
