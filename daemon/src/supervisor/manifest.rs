//! Manifests: what the store remembers about an execution, and the checks
//! and names that go with them (validating a [`RunSpec`], execution ids).
//!
//! A manifest is stored as postcard bytes in the store's `executions`
//! table, wrapped in [`Stored`] whose variant index is the layout version:
//! postcard is not self-describing, so a new layout gets a new variant and
//! old files stay readable.

use serde::{Deserialize, Serialize};
use tether_protocol::{validate_name, ExecState, ExecutionInfo, ExitStatus, RunSpec, RunSpecFull};

use super::procfs::ProcessId;
use crate::{Error, Result};

/// Longest execution id, in bytes.
pub const MAX_ID_LEN: usize = 64;
/// Random characters at the end of an id.
const ID_SUFFIX_LEN: usize = 6;
/// RFC 4648 base32, lowercased.
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Longest accepted `--name`, in bytes.
pub const MAX_LABEL_LEN: usize = 255;
/// Most labels on one execution.
const MAX_LABELS: usize = 64;
/// Most arguments plus environment variables accepted in one spec, so that
/// a spec always fits in one shim hand-over frame.
const MAX_SPEC_ITEMS: usize = tether_protocol::MAX_RUN_ITEMS;
/// Most bytes of arguments, environment and cwd together.
const MAX_SPEC_BYTES: usize = tether_protocol::MAX_RUN_BYTES;

/// A pending `tether stop`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopRequest {
    /// When it was asked for, microseconds since the epoch.
    pub requested_micros: u64,
    /// SIGKILL follows SIGTERM after this long.
    pub timeout_ms: u64,
}

impl StopRequest {
    /// When SIGKILL is due, microseconds since the epoch.
    pub fn kill_at_micros(&self) -> u64 {
        self.requested_micros
            .saturating_add(self.timeout_ms.saturating_mul(1000))
    }
}

/// Everything the daemon knows about one execution. Field order is the
/// stored layout (see the module doc before changing it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub id: String,
    pub spec: RunSpec,
    pub state: ExecState,
    /// The current (or last) attempt; 0 before the first starts.
    pub attempt: u32,
    /// Attempts after the first.
    pub restarts: u32,
    /// When the run was recorded, microseconds since the epoch.
    pub created_micros: u64,
    /// What the deadline counts from, microseconds since the epoch.
    pub submitted_micros: u64,
    /// The current attempt's shim, once started.
    pub shim: Option<ProcessId>,
    /// The current attempt's worker, once the shim reported it.
    pub worker: Option<ProcessId>,
    /// The boot the shim and worker identities belong to.
    pub boot_id: String,
    /// How the last attempt ended.
    pub last_exit: Option<ExitStatus>,
    /// Why the execution is in its state, when there is more to say.
    pub reason: Option<String>,
    /// In `backoff`: when the next attempt starts, microseconds since the epoch.
    pub next_attempt_micros: Option<u64>,
    /// Set by `tether stop` until the execution ends.
    pub stop: Option<StopRequest>,
    /// When the execution reached a final state.
    pub ended_micros: Option<u64>,
    /// How the worker's environment and output are set up. Not part of
    /// the V1 layout: stored beside the manifest from V2 on.
    #[serde(skip)]
    pub setup: Setup,
}

/// What a run asked for beyond [`RunSpec`] (see [`RunSpecFull`]), and
/// the count of failures without progress, which must survive the daemon.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Setup {
    /// `spec.env` is the worker's whole environment, not additions to the
    /// daemon's.
    pub whole_env: bool,
    /// The worker's stdout and stderr are a pseudo-terminal.
    pub pty: bool,
    /// `run --label` pairs.
    pub labels: Vec<(String, String)>,
    /// The execution that started this one.
    pub parent: Option<String>,
    /// Consecutive failures without progress that end the execution;
    /// `None`: [`DEFAULT_MAX_FAILURES_WITHOUT_PROGRESS`].
    pub max_failures_without_progress: Option<u32>,
    /// `run --stop-signal`, a [`tether_protocol::STOP_SIGNALS`] name;
    /// `None`: `TERM`.
    pub stop_signal: Option<String>,
    /// Failed attempts in a row that recorded no checkpoint and no step.
    pub failures_without_progress: u32,
    /// When the current attempt started, microseconds since the epoch:
    /// what the attempt recorded after this is its progress.
    pub attempt_started_micros: u64,
}

/// Failures without progress in a row that end an execution whose run
/// named no limit and whose daemon configures none.
pub const DEFAULT_MAX_FAILURES_WITHOUT_PROGRESS: u32 = 5;

/// The stored form: the variant index is the layout version. V2 is V1's
/// fields followed by the [`Setup`]; a V1 manifest reads as the default
/// setup (the daemon's environment plus the spec's variables, pipes).
#[derive(Serialize, Deserialize, Debug)]
enum Stored {
    V1(Manifest),
    V2(Manifest, Setup),
}

impl Manifest {
    /// A new, pending execution.
    pub fn new(id: String, run: RunSpecFull, now_micros: u64, boot_id: String) -> Self {
        Self {
            id,
            spec: run.spec,
            state: ExecState::Pending,
            attempt: 0,
            restarts: 0,
            created_micros: now_micros,
            submitted_micros: now_micros,
            shim: None,
            worker: None,
            boot_id,
            last_exit: None,
            reason: None,
            next_attempt_micros: None,
            stop: None,
            ended_micros: None,
            setup: Setup {
                whole_env: run.whole_env,
                pty: run.pty,
                labels: run.labels,
                parent: run.parent,
                max_failures_without_progress: run.max_failures_without_progress,
                stop_signal: run.stop_signal,
                failures_without_progress: 0,
                attempt_started_micros: 0,
            },
        }
    }

    /// The signal a stop sends first.
    pub fn stop_signal(&self) -> i32 {
        self.setup
            .stop_signal
            .as_deref()
            .and_then(tether_protocol::signal_number)
            .unwrap_or(libc::SIGTERM)
    }

    /// How many failures without progress in a row end the execution.
    pub fn max_failures_without_progress(&self) -> u32 {
        self.setup
            .max_failures_without_progress
            .unwrap_or(DEFAULT_MAX_FAILURES_WITHOUT_PROGRESS)
    }

    /// The stored bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(&Stored::V2(self.clone(), self.setup.clone()))
            .map_err(|e| Error::storage(format!("cannot encode the manifest of {}", self.id), e))
    }

    /// Reads stored bytes; `id` names the row in the error.
    pub fn decode(id: &str, bytes: &[u8]) -> Result<Self> {
        match postcard::from_bytes(bytes) {
            Ok(Stored::V1(m)) => Ok(m),
            Ok(Stored::V2(mut m, setup)) => {
                m.setup = setup;
                Ok(m)
            }
            Err(e) => Err(Error::storage(
                format!("the manifest of execution {id} is unreadable"),
                e,
            )),
        }
    }

    /// The `tether ps` row; the stream's last seq comes from the queue.
    pub fn info(&self, stream_last_seq: u64) -> ExecutionInfo {
        ExecutionInfo {
            id: self.id.clone(),
            name: self.spec.name.clone(),
            state: self.state,
            pid: match self.state {
                ExecState::Running | ExecState::Starting => self.worker.map(|w| w.pid),
                _ => None,
            },
            attempt: self.attempt,
            restarts: self.restarts,
            command: self.spec.command.clone(),
            restart: self.spec.restart,
            last_exit: self.last_exit.clone(),
            reason: self.reason.clone(),
            created_micros: self.created_micros,
            stream_last_seq,
            last_checkpoint: None,
        }
    }
}

/// Checks what [`RunSpecFull`] adds to its [`RunSpec`]: the chosen id,
/// labels and stop signal. The stop signal is returned in its bare form.
pub fn validate_run(run: &RunSpecFull) -> Result<Option<String>> {
    let invalid = |msg: String| Err(Error::InvalidRequest(msg));
    validate_spec(&run.spec)?;
    if let Some(id) = &run.id {
        tether_protocol::validate_run_id(id).map_err(Error::InvalidRequest)?;
    }
    for (key, value) in &run.labels {
        if key.is_empty() || key.contains('=') || key.len() > MAX_LABEL_LEN {
            return invalid(format!(
                "label name {key:?} must be 1 to {MAX_LABEL_LEN} bytes without '='"
            ));
        }
        if value.len() > MAX_LABEL_LEN || value.contains('\0') || key.contains('\0') {
            return invalid(format!(
                "the label {key} must have a value of at most {MAX_LABEL_LEN} bytes, \
                 without NUL bytes"
            ));
        }
    }
    if run.labels.len() > MAX_LABELS {
        return invalid(format!("at most {MAX_LABELS} labels are allowed"));
    }
    match &run.stop_signal {
        None => Ok(None),
        Some(name) => match tether_protocol::stop_signal_name(name) {
            Some(bare) => Ok(Some(bare.to_owned())),
            None => invalid(format!(
                "stop signal {name:?} is not one of {}",
                tether_protocol::STOP_SIGNALS.join(", ")
            )),
        },
    }
}

/// Checks a [`RunSpec`] before anything is recorded: a command, sane
/// environment keys, an absolute cwd, a printable name, bounded size.
pub fn validate_spec(spec: &RunSpec) -> Result<()> {
    let invalid = |msg: String| Err(Error::InvalidRequest(msg));
    let Some(program) = spec.command.first() else {
        return invalid("run needs a command: the command is empty".into());
    };
    if program.is_empty() {
        return invalid("run needs a command: the program name is empty".into());
    }
    if let Some(arg) = spec.command.iter().find(|a| a.contains('\0')) {
        return invalid(format!("command argument {arg:?} contains a NUL byte"));
    }
    for (key, value) in &spec.env {
        if key.is_empty() {
            return invalid("environment variable with an empty name".into());
        }
        if key.contains('=') || key.contains('\0') {
            return invalid(format!(
                "environment variable name {key:?} contains '=' or a NUL byte"
            ));
        }
        if value.contains('\0') {
            return invalid(format!(
                "the value of environment variable {key} contains a NUL byte"
            ));
        }
    }
    if let Some(cwd) = &spec.cwd {
        if !cwd.starts_with('/') || cwd.contains('\0') {
            return invalid(format!(
                "working directory {cwd:?} must be an absolute path"
            ));
        }
    }
    if let Some(name) = &spec.name {
        if name.len() > MAX_LABEL_LEN {
            return invalid(format!(
                "name {name:?} is longer than {MAX_LABEL_LEN} bytes"
            ));
        }
        validate_name("execution", name)?;
    }
    let (items, bytes) = spec.size();
    if items > MAX_SPEC_ITEMS || bytes > MAX_SPEC_BYTES {
        return invalid(format!(
            "the run spec is too large ({items} arguments and variables, {bytes} bytes; \
             at most {MAX_SPEC_ITEMS} and {MAX_SPEC_BYTES})"
        ));
    }
    Ok(())
}

/// A new execution id: `<name or program basename, sanitized>-<6 base32
/// chars>`, at most [`MAX_ID_LEN`] bytes, valid as a stream name. `random`
/// supplies the suffix's bits.
pub fn new_id(spec: &RunSpec, random: u64) -> String {
    let base = match &spec.name {
        Some(name) => name.as_str(),
        None => spec
            .command
            .first()
            .map(|p| p.rsplit('/').next().unwrap_or(p))
            .unwrap_or(""),
    };
    let mut prefix: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let max_prefix = MAX_ID_LEN - ID_SUFFIX_LEN - 1;
    // All characters are ASCII here, so any byte index is a char boundary.
    prefix.truncate(max_prefix);
    let prefix = prefix.trim_matches('-');
    let prefix = if prefix.is_empty() || prefix.chars().all(|c| c == '.') {
        "exec"
    } else {
        prefix
    };
    let mut suffix = String::with_capacity(ID_SUFFIX_LEN);
    for i in 0..ID_SUFFIX_LEN {
        let index = ((random >> (i * 5)) & 31) as usize;
        suffix.push(char::from(BASE32[index]));
    }
    format!("{prefix}-{suffix}")
}

/// A command as a shell would read it back, for lifecycle messages.
pub fn display_command(command: &[String]) -> String {
    command
        .iter()
        .map(|arg| quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tether_protocol::RestartPolicy;

    use super::*;

    fn spec(command: &[&str]) -> RunSpec {
        RunSpec {
            name: None,
            command: command.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            restart: RestartPolicy::OnFailure,
            max_restarts: None,
            deadline_ms: None,
        }
    }

    #[test]
    fn manifest_round_trips_through_its_stored_form() {
        let mut m = Manifest::new(
            "sh-abcdef".into(),
            spec(&["sh", "-c", "x"]).into(),
            7,
            "boot".into(),
        );
        m.shim = Some(ProcessId {
            pid: 5,
            start_ticks: 9,
        });
        m.last_exit = Some(ExitStatus::Signal(9));
        m.stop = Some(StopRequest {
            requested_micros: 1,
            timeout_ms: 2,
        });
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode("sh-abcdef", &bytes).unwrap(), m);
        assert!(Manifest::decode("x", b"\xff\xff").is_err());
        m.setup = Setup {
            whole_env: true,
            pty: true,
            labels: vec![("team".into(), "a".into())],
            parent: Some("p".into()),
            max_failures_without_progress: Some(2),
            stop_signal: Some("INT".into()),
            failures_without_progress: 1,
            attempt_started_micros: 9,
        };
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode("sh-abcdef", &bytes).unwrap(), m);
    }

    #[test]
    fn a_first_layout_manifest_still_reads_with_the_default_setup() {
        let mut m = Manifest::new("sh-abcdef".into(), spec(&["sh"]).into(), 7, "boot".into());
        let v1 = postcard::to_stdvec(&Stored::V1(m.clone())).unwrap();
        assert_eq!(v1[0], 0, "layout version 1");
        m.setup = Setup::default();
        assert_eq!(Manifest::decode("sh-abcdef", &v1).unwrap(), m);
        assert_eq!(m.encode().unwrap()[0], 1, "written as layout version 2");
    }

    #[test]
    fn ids_name_the_program_and_are_valid_stream_names() {
        let id = new_id(&spec(&["/usr/bin/python3", "agent.py"]), 0x1234_5678);
        assert!(id.starts_with("python3-"), "{id}");
        assert_eq!(id.len(), "python3-".len() + 6);
        assert!(id[8..].chars().all(|c| BASE32.contains(&(c as u8))));
        validate_name("stream", &id).unwrap();

        let mut named = spec(&["x"]);
        named.name = Some("my agent/ü".into());
        let id = new_id(&named, 1);
        assert!(id.starts_with("my-agent-"), "{id}");
        assert_eq!(id.len(), "my-agent-".len() + 6);
        validate_name("stream", &id).unwrap();

        named.name = Some("a".repeat(300));
        let id = new_id(&named, 1);
        assert_eq!(id.len(), MAX_ID_LEN);

        let id = new_id(&spec(&["/"]), 1);
        assert!(id.starts_with("exec-"), "{id}");
        assert_ne!(new_id(&spec(&["a"]), 1), new_id(&spec(&["a"]), 2));
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let refused = |s: RunSpec| validate_spec(&s).unwrap_err().to_string();
        assert!(refused(spec(&[])).contains("command is empty"));
        assert!(refused(spec(&[""])).contains("program name is empty"));
        let mut s = spec(&["env"]);
        s.env = vec![("A=B".into(), "1".into())];
        assert!(refused(s.clone()).contains("'='"));
        s.env = vec![("A\0".into(), "1".into())];
        assert!(refused(s.clone()).contains("NUL"));
        s.env = vec![("A".into(), "1".into())];
        validate_spec(&s).unwrap();
        s.cwd = Some("relative/dir".into());
        assert!(refused(s.clone()).contains("absolute"));
        s.cwd = Some("/tmp".into());
        s.name = Some("two words".into());
        assert!(refused(s.clone()).contains("whitespace"));
        s.name = Some("agent".into());
        validate_spec(&s).unwrap();
    }

    #[test]
    fn chosen_ids_labels_and_stop_signals_are_checked() {
        let run = |f: &dyn Fn(&mut RunSpecFull)| {
            let mut run = RunSpecFull::from(spec(&["true"]));
            f(&mut run);
            validate_run(&run).map_err(|e| e.to_string())
        };
        assert_eq!(run(&|_| {}), Ok(None));
        assert_eq!(
            run(&|r| r.stop_signal = Some("sigint".into())),
            Ok(Some("INT".into()))
        );
        assert!(run(&|r| r.stop_signal = Some("SEGV".into()))
            .unwrap_err()
            .contains("TERM, INT"));
        assert!(run(&|r| r.id = Some("a b".into()))
            .unwrap_err()
            .contains("1 to 128"));
        run(&|r| r.id = Some("job-1".into())).unwrap();
        assert!(run(&|r| r.labels = vec![("".into(), "v".into())])
            .unwrap_err()
            .contains("label name"));
        let many: Vec<(String, String)> = (0..=MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        assert!(run(&|r| r.labels = many.clone())
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn commands_are_shown_quoted() {
        let c: Vec<String> = ["sh", "-c", "echo hi; exit 1", "it's"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(display_command(&c), r#"sh -c 'echo hi; exit 1' 'it'\''s'"#);
    }
}
