//! [`RunOptions`]: a worker to start, checked and made into the daemon's
//! [`RunSpec`] (or [`RunSpecFull`]) the same way for `tether run` and the
//! SDKs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_protocol::{RestartPolicy, RunSpec, RunSpecFull};

use crate::error::{Error, Result};

/// A worker to start; see `tether run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Program and arguments.
    pub command: Vec<String>,
    /// A label for `ps`.
    pub name: Option<String>,
    pub restart: RestartPolicy,
    /// Restarts allowed after the first attempt; `None` is unlimited.
    pub max_restarts: Option<u32>,
    /// No attempt starts later than this after the run was submitted.
    pub deadline: Option<Duration>,
    /// The worker's directory: made absolute here, against this process's
    /// directory, because the daemon's is unrelated. The daemon's own
    /// when `None`.
    pub cwd: Option<PathBuf>,
    /// Variables added to the worker's environment.
    pub env: Vec<(String, String)>,
    /// The execution's id (`run --id`): when one with this id exists,
    /// nothing is started and its id is returned.
    pub id: Option<String>,
    /// `K=V` labels for `ps --label`.
    pub labels: Vec<(String, String)>,
    /// The execution that starts this one; it must exist.
    pub parent: Option<String>,
    /// Failed attempts in a row without a checkpoint or step that end the
    /// execution (`crash loop`); `None`: the daemon's default (5).
    pub max_failures_without_progress: Option<u32>,
    /// The signal a stop sends first (`TERM`, `INT`, ...); `None`: `TERM`.
    pub stop_signal: Option<String>,
}

impl RunOptions {
    /// `command` with the defaults of `tether run`: restart on failure, no
    /// limits.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            name: None,
            restart: RestartPolicy::OnFailure,
            max_restarts: None,
            deadline: None,
            cwd: None,
            env: Vec::new(),
            id: None,
            labels: Vec::new(),
            parent: None,
            max_failures_without_progress: None,
            stop_signal: None,
        }
    }

    /// True when the run asks for more than a plain `Run` can carry.
    pub fn needs_full(&self) -> bool {
        self.id.is_some()
            || !self.labels.is_empty()
            || self.parent.is_some()
            || self.max_failures_without_progress.is_some()
            || self.stop_signal.is_some()
    }

    /// The full request body, with `cwd` resolved against `base`'s answer;
    /// the environment is added to the daemon's, through pipes (the caller
    /// may change `whole_env` and `pty`). A bad id, label or stop signal is
    /// a usage error naming the rule.
    pub fn into_full_in(
        mut self,
        base: &dyn Fn() -> std::io::Result<PathBuf>,
    ) -> Result<RunSpecFull> {
        if let Some(id) = &self.id {
            tether_protocol::validate_run_id(id).map_err(Error::Usage)?;
        }
        for (key, _) in &self.labels {
            if key.is_empty() || key.contains('=') {
                return Err(Error::Usage(format!(
                    "label name {key:?} must be non-empty and without '='"
                )));
            }
        }
        let stop_signal = match self.stop_signal.take() {
            None => None,
            Some(name) => Some(stop_signal(&name).map_err(Error::Usage)?),
        };
        let (id, labels, parent) = (
            self.id.take(),
            std::mem::take(&mut self.labels),
            self.parent.take(),
        );
        let max_failures_without_progress = self.max_failures_without_progress;
        let spec = self.into_spec_in(base)?;
        Ok(RunSpecFull {
            id,
            labels,
            parent,
            max_failures_without_progress,
            stop_signal,
            ..RunSpecFull::from(spec)
        })
    }

    /// The spec to send, with `cwd` resolved against this process's
    /// working directory.
    pub fn into_spec(self) -> Result<RunSpec> {
        self.into_spec_in(&std::env::current_dir)
    }

    /// The spec to send, with `cwd` resolved against `base`'s answer.
    pub fn into_spec_in(self, base: &dyn Fn() -> std::io::Result<PathBuf>) -> Result<RunSpec> {
        if self.command.first().is_none_or(String::is_empty) {
            return Err(Error::Usage("the command's program is empty".into()));
        }
        for (key, value) in &self.env {
            env_pair_error(key, value).map_or(Ok(()), |e| Err(Error::Usage(e)))?;
        }
        let cwd = match self.cwd {
            Some(dir) => Some(absolute(&dir, base)?),
            None => None,
        };
        Ok(RunSpec {
            name: self.name,
            command: self.command,
            cwd,
            env: self.env,
            restart: self.restart,
            max_restarts: self.max_restarts,
            deadline_ms: self.deadline.map(crate::time::millis),
        })
    }
}

/// The bare name of a stop signal (`TERM` for `sigterm`), or the rule.
pub fn stop_signal(name: &str) -> std::result::Result<String, String> {
    tether_protocol::stop_signal_name(name)
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "stop signal {name:?} is not one of {}",
                tether_protocol::STOP_SIGNALS.join(", ")
            )
        })
}

/// A `K=V` label, or what is wrong with it.
pub fn label_pair(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected a label KEY=VALUE, got {s:?}")),
    }
}

/// What is wrong with an environment variable for a worker, if anything.
fn env_pair_error(key: &str, value: &str) -> Option<String> {
    if key.is_empty() {
        Some("an environment variable's name is empty".into())
    } else if key.contains('=') {
        Some(format!("environment variable name {key:?} contains '='"))
    } else if key.contains('\0') || value.contains('\0') {
        Some("environment variables cannot contain NUL bytes".into())
    } else {
        None
    }
}

fn absolute(dir: &Path, base: &dyn Fn() -> std::io::Result<PathBuf>) -> Result<String> {
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        let base = base().map_err(|source| Error::Local {
            context: "cannot resolve the working directory: the current directory is unknown"
                .into(),
            source,
        })?;
        base.join(dir)
    };
    dir.to_str().map(str::to_owned).ok_or_else(|| {
        Error::Usage(format!(
            "the working directory {} is not valid UTF-8",
            dir.display()
        ))
    })
}
