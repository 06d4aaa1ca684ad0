//! The daemon's one error type, and its translation to wire error codes.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tether_protocol::ErrorCode;

/// Everything that can go wrong inside `tetherd`. `Clone`, so that one
/// failure can be told to every caller waiting on it (each command of a
/// failed batch, each job waiting on a failed sync); sources are shared.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The store file exists but is not a readable redb database. The daemon
    /// refuses to start and does not touch the file.
    #[error("store {path} is corrupt or unreadable: {detail}")]
    CorruptStore {
        path: PathBuf,
        /// The whole description, the source's words included.
        detail: String,
        /// The failure that found the file unreadable (redb's, or the
        /// file system's); none where the daemon's own checks did (a
        /// schema version it cannot read, records missing from the log,
        /// a panic inside redb).
        #[source]
        source: Option<StorageSource>,
    },

    /// The store is damaged: acknowledged data may be lost. The daemon
    /// refuses to start (exit 65) and changes no byte of the state
    /// directory; `tetherd repair` is the way past it.
    #[error("{0}")]
    Damaged(Box<Damage>),

    /// Damage in more than one place (`tetherd check`), each named.
    #[error("{}", list_places(.0))]
    DamagedPlaces(Vec<Damage>),

    /// A running daemon found its store damaged when asked to verify it
    /// (`tetherd check` beside a daemon); its words.
    #[error("{0}")]
    DamageReported(String),

    /// Another daemon holds the state directory's lock.
    #[error("state directory {dir} is in use by {holder}")]
    AlreadyRunning { dir: PathBuf, holder: String },

    /// The disk holding the store is full; nothing of the failed commit was stored.
    #[error("storage full: {detail}")]
    DiskFull {
        /// The whole description, the source's words included.
        detail: String,
        /// The failure that found the disk full; none when no failure
        /// did: a write refused while the store is degraded by an earlier
        /// one (see `crate::degraded`), or a free-space check that fell
        /// short.
        #[source]
        source: Option<StorageSource>,
    },

    /// A storage operation failed; it was not carried out. `context`
    /// says what was being done (and on which file, where there is one).
    #[error("storage error: {context}: {source}")]
    Storage {
        context: String,
        #[source]
        source: StorageSource,
    },

    /// The store or the daemon's own storage machinery is not as it must
    /// be: data missing or out of place, a limit passed, one of its
    /// threads gone. No error lies under it; the operation was not
    /// carried out.
    #[error("storage error: {0}")]
    Invariant(String),

    /// An operation refused for a storage failure that was reported, and
    /// logged, where it happened: a write while the store is degraded, a
    /// use of a store that a failed reopening left closed, appends that a
    /// failed commit lost. Its words alone.
    #[error("storage error: {0}")]
    Refused(String),

    /// No stream by that name.
    #[error("no such stream {0:?}")]
    StreamNotFound(String),

    /// No execution by that id.
    #[error("no such execution {0:?}")]
    ExecutionNotFound(String),

    /// No checkpoint by that id: its words alone.
    #[error("{0}")]
    CheckpointNotFound(String),

    /// No such question, or no open one where one was needed: its words
    /// alone.
    #[error("{0}")]
    QuestionNotFound(String),

    /// The question already has an answer (the first one wins): the
    /// message names it and who gave it.
    #[error("{0}")]
    AlreadyAnswered(String),

    /// An answer outside the question's choices, or one that does not say
    /// which of several open questions it answers: its words alone.
    #[error("{0}")]
    InvalidAnswer(String),

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

    /// One item of an answer (a stream with its consumers, an execution)
    /// is larger than the maximum message size, so the answer cannot be
    /// sent even in parts.
    #[error(
        "cannot answer: {what} takes {len} bytes, more than the maximum message \
         size of {max} bytes (max_frame_len)"
    )]
    AnswerTooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },

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
        source: Arc<io::Error>,
    },

    /// The peer may not send what it began to send (see
    /// [`crate::access::Peer::permits_kind`]); the sentence saying why.
    #[error("{0}")]
    PermissionDenied(String),

    /// A connection sent part of a message, then nothing for `after`.
    #[error(
        "the connection sent {received} of the {expected} bytes of a message, then nothing \
         for {after:?}"
    )]
    Stalled {
        received: usize,
        expected: usize,
        after: std::time::Duration,
    },

    /// A connection closed to keep the partly received messages of all
    /// connections within `max_partial_bytes`: it had sent the least.
    #[error(
        "partly received messages passed max_partial_bytes ({limit} bytes across \
         connections); this connection, {held} bytes into its message, was among those \
         that had sent the least"
    )]
    OverPartialBudget { held: usize, limit: usize },

    /// A wire-level failure on one connection.
    #[error(transparent)]
    Protocol(#[from] tether_protocol::Error),
}

/// Result with the daemon [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] naming what was being done.
    pub fn io(context: impl Into<String>, source: impl Into<Arc<io::Error>>) -> Self {
        Error::Io {
            context: context.into(),
            source: source.into(),
        }
    }

    /// An [`Error::Storage`]: what was being done, and the failure under it.
    pub fn storage(context: impl Into<String>, source: impl Into<StorageSource>) -> Self {
        Error::Storage {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A failed write of a store file: [`Error::DiskFull`] when the disk
    /// (or a quota) is full, so that producers can tell it apart, else
    /// [`Error::Storage`]; either way `context`, then the error.
    pub fn write_failed(context: String, source: io::Error) -> Self {
        if is_disk_full(&source) {
            Error::DiskFull {
                detail: format!("{context}: {source}"),
                source: Some(source.into()),
            }
        } else {
            Error::storage(context, source)
        }
    }

    /// Whether this is damage to the store (exit 65), rather than a
    /// failure to reach or use it.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            Error::Damaged(_)
                | Error::DamagedPlaces(_)
                | Error::CorruptStore { .. }
                | Error::DamageReported(_)
        )
    }

    /// The wire error code a client sees for this error. The one place where
    /// daemon errors become protocol errors.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::DiskFull { .. } => ErrorCode::STORAGE_FULL,
            Error::Storage { .. }
            | Error::Invariant(_)
            | Error::Refused(_)
            | Error::CorruptStore { .. }
            | Error::Damaged(_)
            | Error::DamagedPlaces(_)
            | Error::DamageReported(_)
            | Error::Io { .. } => ErrorCode::STORAGE,
            Error::StreamNotFound(_)
            | Error::ExecutionNotFound(_)
            | Error::CheckpointNotFound(_)
            | Error::QuestionNotFound(_) => ErrorCode::NOT_FOUND,
            Error::AlreadyAnswered(_) => ErrorCode::ALREADY_ANSWERED,
            Error::InvalidAnswer(_) => ErrorCode::INVALID_ANSWER,
            Error::IllegalTransition { .. } => ErrorCode::INTERNAL,
            Error::InvalidRequest(_) => ErrorCode::INVALID_REQUEST,
            Error::ShuttingDown => ErrorCode::SHUTTING_DOWN,
            Error::PermissionDenied(_) => ErrorCode::PERMISSION_DENIED,
            Error::Stalled { .. } => ErrorCode::MALFORMED,
            // The daemon's own limit, as with too many connections: the
            // client may reconnect and send again.
            Error::OverPartialBudget { .. } => ErrorCode::TOO_MANY_CONNECTIONS,
            Error::AnswerTooLarge { .. }
            | Error::Protocol(tether_protocol::Error::FrameTooLarge { .. }) => {
                ErrorCode::FRAME_TOO_LARGE
            }
            Error::Protocol(
                tether_protocol::Error::InvalidName { .. }
                | tether_protocol::Error::ReservedKind { .. },
            ) => ErrorCode::INVALID_REQUEST,
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
        } else if let Some(io) = e.downcast_ref::<Arc<io::Error>>() {
            // An I/O error shared so that its error can be cloned
            // (`Error::Io`): the error itself, not its sources.
            next = Some(&**io);
        }
    }
    false
}

/// The failure under an [`Error::Storage`] (or an [`Error::DiskFull`]):
/// kept whole, so that [`std::error::Error::source`] leads to it, and
/// shared, so that every caller waiting on one failure (each command of a
/// failed batch) gets the same error.
#[derive(Debug, Clone)]
pub enum StorageSource {
    /// redb failed.
    Redb(Arc<redb::Error>),
    /// A file operation of the daemon's own failed (on the log, or
    /// reserving the store file's blocks).
    Io(Arc<io::Error>),
    /// Bytes to store cannot be encoded, or stored bytes decoded.
    Encoding(postcard::Error),
    /// Stored frames cannot be put in their wire form.
    Wire(Arc<tether_protocol::Error>),
    /// The task that ran the storage operation failed (it panicked or was
    /// cancelled).
    Task(Arc<tokio::task::JoinError>),
}

impl StorageSource {
    /// The I/O failure under it, if there is one.
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            StorageSource::Io(e) => Some(e),
            StorageSource::Redb(e) => match &**e {
                redb::Error::Io(e) => Some(e),
                _ => None,
            },
            StorageSource::Encoding(_) | StorageSource::Wire(_) | StorageSource::Task(_) => None,
        }
    }
}

impl fmt::Display for StorageSource {
    /// Its own words; redb's I/O failure without redb's `I/O error: `,
    /// which the context says where it matters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageSource::Redb(e) => match &**e {
                redb::Error::Io(e) => e.fmt(f),
                e => e.fmt(f),
            },
            StorageSource::Io(e) => e.fmt(f),
            StorageSource::Encoding(e) => e.fmt(f),
            StorageSource::Wire(e) => e.fmt(f),
            StorageSource::Task(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StorageSource {
    /// The error it holds; for redb's I/O failure, the I/O error itself
    /// (redb names no source for it), so that its kind and OS error can be
    /// found down the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(match self {
            StorageSource::Redb(e) => match &**e {
                redb::Error::Io(e) => e,
                e => e,
            },
            StorageSource::Io(e) => &**e,
            StorageSource::Encoding(e) => e,
            StorageSource::Wire(e) => &**e,
            StorageSource::Task(e) => &**e,
        })
    }
}

impl From<redb::Error> for StorageSource {
    fn from(e: redb::Error) -> Self {
        StorageSource::Redb(Arc::new(e))
    }
}

impl From<io::Error> for StorageSource {
    fn from(e: io::Error) -> Self {
        StorageSource::Io(Arc::new(e))
    }
}

impl From<postcard::Error> for StorageSource {
    fn from(e: postcard::Error) -> Self {
        StorageSource::Encoding(e)
    }
}

impl From<tether_protocol::Error> for StorageSource {
    fn from(e: tether_protocol::Error) -> Self {
        StorageSource::Wire(Arc::new(e))
    }
}

impl From<tokio::task::JoinError> for StorageSource {
    fn from(e: tokio::task::JoinError) -> Self {
        StorageSource::Task(Arc::new(e))
    }
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

/// Every damaged place, one a line.
fn list_places(places: &[Damage]) -> String {
    let mut text = format!("the store is damaged in {} places:", places.len());
    for place in places {
        text.push_str(&format!("\n  {place}"));
    }
    text
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::error::Error as _;

    use super::*;

    fn eio() -> io::Error {
        io::Error::from_raw_os_error(libc::EIO)
    }

    /// The I/O error somewhere under `e`.
    fn io_under(e: &Error) -> &io::Error {
        std::iter::successors(e.source(), |e| (*e).source())
            .find_map(|e| {
                e.downcast_ref::<io::Error>()
                    .or_else(|| e.downcast_ref::<Arc<io::Error>>().map(|io| &**io))
            })
            .unwrap_or_else(|| panic!("no I/O error under {e:?}"))
    }

    #[test]
    fn a_storage_error_reads_as_context_then_cause_and_keeps_the_io_error() {
        let e = Error::storage("I/O error on /s/tether.wal: cannot sync it", eio());
        assert_eq!(
            e.to_string(),
            "storage error: I/O error on /s/tether.wal: cannot sync it: \
             Input/output error (os error 5)"
        );
        assert_eq!(e.code(), ErrorCode::STORAGE);
        assert_eq!(io_under(&e).raw_os_error(), Some(libc::EIO));
        assert_eq!(io_under(&e).kind(), eio().kind());
    }

    #[test]
    fn redb_io_errors_read_without_redbs_prefix_and_lead_to_the_io_error() {
        let e = Error::storage("I/O error on /s/tether.redb", redb::Error::Io(eio()));
        assert_eq!(
            e.to_string(),
            "storage error: I/O error on /s/tether.redb: Input/output error (os error 5)"
        );
        assert_eq!(io_under(&e).raw_os_error(), Some(libc::EIO));
        let e = Error::storage("redb", redb::Error::PreviousIo);
        let redb = e.source().and_then(|s| s.source()).unwrap();
        assert!(matches!(
            redb.downcast_ref::<redb::Error>(),
            Some(redb::Error::PreviousIo)
        ));
    }

    #[test]
    fn a_full_disk_is_found_down_the_sources() {
        let full = || io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&full()));
        assert!(is_disk_full(&io::Error::from(io::ErrorKind::QuotaExceeded)));
        assert!(is_disk_full(&Error::storage("writing", full())));
        assert!(is_disk_full(&Error::storage(
            "writing",
            redb::Error::Io(full())
        )));
        // An I/O error made from another hides it from `source`.
        assert!(is_disk_full(&io::Error::other(Error::storage("x", full()))));
        assert!(is_disk_full(&Error::io("x", full())));
        assert!(!is_disk_full(&Error::storage("writing", eio())));
        assert!(!is_disk_full(&Error::Invariant(
            "a chunk over 4 GiB".into()
        )));
    }

    #[test]
    fn a_clone_shares_the_source_and_keeps_the_words_and_code() {
        let e = Error::storage("cannot append to the log /s/tether.wal", eio());
        let copy = e.clone();
        assert_eq!(copy.to_string(), e.to_string());
        assert_eq!(io_under(&copy).raw_os_error(), Some(libc::EIO));
        let full = Error::DiskFull {
            detail: "No space left on device (os error 28)".into(),
            source: Some(io::Error::from_raw_os_error(libc::ENOSPC).into()),
        };
        let copy = full.clone();
        assert_eq!(copy.code(), ErrorCode::STORAGE_FULL);
        assert_eq!(io_under(&copy).raw_os_error(), Some(libc::ENOSPC));
        let io = Error::io("cannot open the log /s/tether.wal", eio());
        let copy = io.clone();
        assert_eq!(copy.code(), ErrorCode::STORAGE);
        assert_eq!(
            copy.to_string(),
            "cannot open the log /s/tether.wal: Input/output error (os error 5)"
        );
        assert_eq!(io_under(&copy).raw_os_error(), Some(libc::EIO));
    }
}
