//! The daemon's one error type, and its translation to wire error codes.

use std::io;
use std::path::PathBuf;

use tether_protocol::ErrorCode;

/// Everything that can go wrong inside `tetherd`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store file exists but is not a readable redb database. The daemon
    /// refuses to start and does not touch the file.
    #[error("store {path} is corrupt or unreadable: {detail}")]
    CorruptStore { path: PathBuf, detail: String },

    /// The store is damaged: acknowledged data may be lost. The daemon
    /// refuses to start (exit 65) and changes no byte of the state
    /// directory; `tetherd repair` is the way past it.
    #[error("{0}")]
    Damaged(Box<Damage>),

    /// A running daemon found its store damaged when asked to verify it
    /// (`tetherd check` beside a daemon); its words.
    #[error("{0}")]
    DamageReported(String),

    /// Another daemon holds the state directory's lock.
    #[error("state directory {dir} is in use by {holder}")]
    AlreadyRunning { dir: PathBuf, holder: String },

    /// The disk holding the store is full; nothing of the failed commit was stored.
    #[error("storage full: {detail}")]
    DiskFull { detail: String },

    /// Any other storage failure; the operation was not carried out.
    #[error("storage error: {0}")]
    Storage(String),

    /// No stream by that name.
    #[error("no such stream {0:?}")]
    StreamNotFound(String),

    /// No execution by that id.
    #[error("no such execution {0:?}")]
    ExecutionNotFound(String),

    /// A state change the execution state machine does not allow. It is
    /// refused (never applied): it means the daemon has a bug.
    #[error("illegal transition of execution {execution}: {from} -> {to}")]
    IllegalTransition {
        execution: String,
        from: &'static str,
        to: &'static str,
    },

    /// A well-formed request that cannot be carried out as asked.
    #[error("{0}")]
    InvalidRequest(String),

    /// The daemon is shutting down and takes no new work.
    #[error("the daemon is shutting down")]
    ShuttingDown,

    /// A configuration value is wrong.
    #[error("configuration: {0}")]
    Config(String),

    /// An I/O failure with the path or action it concerned.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A wire-level failure on one connection.
    #[error(transparent)]
    Protocol(#[from] tether_protocol::Error),
}

/// Result with the daemon [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] naming what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether this is damage to the store (exit 65), rather than a
    /// failure to reach or use it.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            Error::Damaged(_) | Error::CorruptStore { .. } | Error::DamageReported(_)
        )
    }

    /// The wire error code a client sees for this error. The one place where
    /// daemon errors become protocol errors.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::DiskFull { .. } => ErrorCode::STORAGE_FULL,
            Error::Storage(_)
            | Error::CorruptStore { .. }
            | Error::Damaged(_)
            | Error::DamageReported(_)
            | Error::Io { .. } => ErrorCode::STORAGE,
            Error::StreamNotFound(_) | Error::ExecutionNotFound(_) => ErrorCode::NOT_FOUND,
            Error::IllegalTransition { .. } => ErrorCode::INTERNAL,
            Error::InvalidRequest(_) => ErrorCode::INVALID_REQUEST,
            Error::ShuttingDown => ErrorCode::SHUTTING_DOWN,
            Error::Protocol(tether_protocol::Error::FrameTooLarge { .. }) => {
                ErrorCode::FRAME_TOO_LARGE
            }
            Error::Protocol(tether_protocol::Error::InvalidName { .. }) => {
                ErrorCode::INVALID_REQUEST
            }
            Error::Protocol(_) => ErrorCode::MALFORMED,
            Error::AlreadyRunning { .. } | Error::Config(_) => ErrorCode::INTERNAL,
        }
    }
}

/// Whether a failure means the disk (or a quota) is full: such a failure
/// is reported as [`Error::DiskFull`]. Decided by the I/O error under it
/// (its kind, or the OS error), looked for down its sources.
pub(crate) fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        next = e.source();
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
            ) || matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
            {
                return true;
            }
            // An I/O error made from another error shows that error's
            // sources, not the error itself.
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
            }
        } else if let Some(redb::Error::Io(io)) = e.downcast_ref::<redb::Error>() {
            // redb names no source for its own I/O errors.
            next = Some(io);
        }
    }
    false
}

/// Where a store is damaged, and what that costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The damaged file.
    pub file: PathBuf,
    /// The byte of the file where the damage starts, when known.
    pub offset: Option<u64>,
    /// What is wrong there.
    pub what: String,
    /// What is affected: stream and seq ranges, or what cannot be known.
    pub affected: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the store is damaged: {}", self.file.display())?;
        if let Some(offset) = self.offset {
            write!(f, " at byte {offset}")?;
        }
        write!(
            f,
            ": {}; affected: {}. Nothing was changed",
            self.what, self.affected
        )
    }
}
