//! [`RunOptions`]: a worker to start, checked and made into the daemon's
//! [`RunSpec`] the same way for `tether run` and the SDKs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_protocol::{RestartPolicy, RunSpec};

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
        }
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
