//! The crate's one error type and its mapping to process exit codes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tether_protocol::ErrorCode;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: any failure without a more specific code.
pub const EXIT_ERROR: u8 = 1;
/// Exit code: the command line was wrong.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: no such stream (or execution, or checkpoint).
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit code: the daemon could not be reached within the retry window.
pub const EXIT_UNREACHABLE: u8 = 4;
/// `attach`, `run --attach` and `wait`: tether itself failed, or the
/// execution was `lost` (as `docker run` uses 125).
pub const EXIT_TETHER_FAILED: u8 = 125;
/// `attach`, `run --attach` and `wait`: the worker never started (as a
/// shell's 127 for a command not found).
pub const EXIT_NOT_STARTED: u8 = 127;

/// Everything that can go wrong in the client library and the CLI.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No session could be opened within the retry window. `last_error`
    /// is the last failure seen, in the words worth repeating (usually the
    /// OS error of `connect`); `source` is that failure itself, when there
    /// was one (ssh's own words have none).
    #[error("cannot reach tetherd at {endpoint} (gave up after {}): {last_error}", humanize(*.waited))]
    Unreachable {
        endpoint: String,
        waited: Duration,
        last_error: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The daemon could be reached, but a failure that retrying may cure
    /// (a full disk, a daemon shutting down) lasted for the whole retry
    /// window. `cause` is the last such failure; the exit code is its own.
    #[error("gave up after {}: {cause}", humanize(*.waited))]
    GaveUp {
        waited: Duration,
        #[source]
        cause: Box<Error>,
    },

    /// The daemon refused a request. It closes the connection after this.
    #[error("{message} ({code})")]
    Daemon { code: ErrorCode, message: String },

    /// The daemon refused the greeting that opens every session of a
    /// publisher (a shim's `ShimHello`): it does not want this producer at
    /// all, so reconnecting would not help.
    #[error("tetherd refused {request}: {message} ({code})")]
    Refused {
        request: &'static str,
        code: ErrorCode,
        message: String,
    },

    /// The socket's directory, or the process listening on the socket, is
    /// not one this user can trust; nothing was sent to it.
    #[error("{0}")]
    Untrusted(String),

    /// Connecting failed for a reason that retrying will not cure
    /// (permission denied).
    #[error("cannot connect to {endpoint}: {reason}")]
    CannotConnect {
        endpoint: String,
        reason: String,
        #[source]
        source: Arc<std::io::Error>,
    },

    /// A socket operation failed; the session is lost.
    #[error("connection to {endpoint} failed: {source}")]
    Io {
        endpoint: String,
        /// Shared, as the codec's I/O errors are.
        #[source]
        source: Arc<std::io::Error>,
    },

    /// The daemon closed the connection without saying why.
    #[error("tetherd at {endpoint} closed the connection")]
    Closed { endpoint: String },

    /// The daemon did not answer in time.
    #[error("tetherd at {endpoint} did not answer within {}", humanize(*.after))]
    Timeout { endpoint: String, after: Duration },

    /// The client dropped a session on purpose, to resume from the last
    /// position it trusts (for example after an unexpected seq).
    #[error("session dropped to resume: {reason}")]
    Resync { reason: String },

    /// A message could not be framed, parsed or encoded.
    #[error("{0}")]
    Codec(#[from] tether_protocol::Error),

    /// The daemon sent something the protocol does not allow here.
    #[error("protocol violation by tetherd: {0}")]
    Protocol(String),

    /// A payload would not fit in one frame.
    #[error("a payload of {len} bytes exceeds the maximum of {max} bytes per frame")]
    PayloadTooLarge { len: usize, max: usize },

    /// A `tether publish` input line would not fit in one frame.
    #[error("line {line} is longer than the maximum of {max} bytes per frame")]
    LineTooLong { line: u64, max: usize },

    /// The caller used the library or the command line wrongly.
    #[error("{0}")]
    Usage(String),

    /// A cursor file could not be read, parsed or written.
    #[error("cursor file {}: {detail}", path.display())]
    Cursor {
        path: PathBuf,
        detail: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Local I/O (stdin, stdout, files) failed.
    #[error("{context}: {source}")]
    Local {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A question closed at its timeout with no default to record as the
    /// answer (`tether ask`, exit code 1).
    #[error("question {question} timed out with no answer")]
    Unanswered { question: u64 },

    /// No message came to the inbox within the time given (`tether recv
    /// --timeout`, exit code 1).
    #[error("no message for {execution} within {}", humanize(*.waited))]
    NoMessage { execution: String, waited: Duration },

    // The worker SDK's own (see `crate::worker`); exit code 1.
    /// The program was not started by tether: a variable it sets is absent.
    #[error(
        "{variable} is not set: this program expects to run as a tether worker \
         (start it with `tether run -- COMMAND`)"
    )]
    NotUnderTether { variable: &'static str },

    /// The newest checkpoint was written in another schema version than
    /// the one the worker asked for. What to do (migrate, start over) is
    /// the worker's decision.
    #[error("the newest checkpoint has schema version {stored}, this worker expects {expected}")]
    SchemaMismatch { stored: u32, expected: u32 },

    /// Stored JSON (a checkpoint or a step result) does not fit the type
    /// asked for.
    #[error("{what} does not decode as the expected type: {source}")]
    Decode {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A value could not be encoded as JSON.
    #[error("{what} cannot be encoded as JSON: {source}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A step's body failed; nothing was recorded, so a later attempt runs
    /// it again.
    #[error("step {step:?} failed: {source}")]
    Step {
        step: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process exit code this error maps to: 1 error (also an answer
    /// to a question already answered), 2 usage (also an invalid answer),
    /// 3 not found, 4 cannot reach the daemon.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Unreachable { .. } => EXIT_UNREACHABLE,
            Error::GaveUp { cause, .. } => cause.exit_code(),
            Error::Daemon { code, .. } | Error::Refused { code, .. }
                if *code == ErrorCode::NOT_FOUND =>
            {
                EXIT_NOT_FOUND
            }
            // An answer outside the choices, or one that names no question
            // while several are open: the command line must change.
            Error::Daemon { code, .. } if *code == ErrorCode::INVALID_ANSWER => EXIT_USAGE,
            Error::Usage(_) => EXIT_USAGE,
            // `already_answered` among them: the question stands answered.
            _ => EXIT_ERROR,
        }
    }

    /// True when reconnecting (after a backoff) may cure the failure: lost
    /// connections, timeouts, and daemon errors it marks as transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io { .. }
            | Error::Closed { .. }
            | Error::Timeout { .. }
            | Error::Resync { .. } => true,
            Error::Daemon { code, .. } => code.is_transient(),
            // The retrying already happened: its window ran out.
            Error::GaveUp { .. } => false,
            // A frame cut short by a dropped connection is a lost session,
            // not a sign of a confused peer.
            Error::Codec(tether_protocol::Error::Io(_)) => true,
            Error::Codec(tether_protocol::Error::Truncated { .. }) => true,
            _ => false,
        }
    }

    /// True for failures to reach the daemon at all (as opposed to the
    /// daemon answering with an error). These become [`Error::Unreachable`]
    /// when the retry window runs out.
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            Error::Io { .. }
                | Error::Closed { .. }
                | Error::Timeout { .. }
                | Error::Codec(tether_protocol::Error::Io(_))
                | Error::Codec(tether_protocol::Error::Truncated { .. })
        )
    }

    /// True when the daemon is not there: no socket, or nobody accepting
    /// on it. The failure a first-time user meets when no daemon runs.
    pub fn is_no_daemon(&self) -> bool {
        matches!(
            self,
            Error::Io { source, .. }
                if matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused)
        )
    }

    /// The daemon's error code, when the daemon refused something (also
    /// when that refusal lasted until the retry window ran out).
    pub fn daemon_code(&self) -> Option<ErrorCode> {
        match self {
            Error::Daemon { code, .. } | Error::Refused { code, .. } => Some(*code),
            Error::GaveUp { cause, .. } => cause.daemon_code(),
            _ => None,
        }
    }

    /// True when the daemon refused a request as a message type it does not
    /// know: it is older than this client, which may then ask the older way.
    pub fn is_unknown_request(&self) -> bool {
        match self {
            Error::Daemon { code, message } => {
                *code == ErrorCode::MALFORMED && message.contains("unknown request type")
            }
            Error::GaveUp { cause, .. } => cause.is_unknown_request(),
            _ => false,
        }
    }
}

/// A duration as people write it: `200ms`, `30s`, `2m5s`.
pub fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if !ms.is_multiple_of(1000) {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        let unreachable = Error::Unreachable {
            endpoint: "/x.sock".into(),
            waited: Duration::from_millis(200),
            last_error: "no such file".into(),
            source: None,
        };
        assert_eq!(unreachable.exit_code(), 4);
        let missing = Error::Daemon {
            code: ErrorCode::NOT_FOUND,
            message: "no stream".into(),
        };
        assert_eq!(missing.exit_code(), 3);
        assert_eq!(Error::Usage("bad".into()).exit_code(), 2);
        let refused = Error::Daemon {
            code: ErrorCode::INVALID_REQUEST,
            message: "beyond".into(),
        };
        assert_eq!(refused.exit_code(), 1);
    }

    #[test]
    fn gates_that_closed_empty_say_so_and_exit_1() {
        let e = Error::Unanswered { question: 3 };
        assert_eq!(e.to_string(), "question 3 timed out with no answer");
        assert_eq!(e.exit_code(), 1);
        let e = Error::NoMessage {
            execution: "job-1".into(),
            waited: Duration::from_secs(2),
        };
        assert_eq!(e.to_string(), "no message for job-1 within 2s");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn refused_answers_exit_as_the_design_says() {
        let refusal = |code| Error::Daemon {
            code,
            message: "refused".into(),
        };
        assert_eq!(refusal(ErrorCode::ALREADY_ANSWERED).exit_code(), 1);
        assert_eq!(refusal(ErrorCode::INVALID_ANSWER).exit_code(), 2);
        assert_eq!(refusal(ErrorCode::NOT_FOUND).exit_code(), 3);
        assert!(!refusal(ErrorCode::ALREADY_ANSWERED).is_transient());
        assert!(!refusal(ErrorCode::INVALID_ANSWER).is_transient());
    }

    #[test]
    fn unreachable_names_the_socket_and_the_cause() {
        let e = Error::Unreachable {
            endpoint: "/run/t.sock".into(),
            waited: Duration::from_millis(200),
            last_error: "No such file or directory (os error 2)".into(),
            source: Some(std::io::Error::from_raw_os_error(2).into()),
        };
        assert_eq!(
            e.to_string(),
            "cannot reach tetherd at /run/t.sock (gave up after 200ms): \
             No such file or directory (os error 2)"
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.and_then(std::io::Error::raw_os_error), Some(2));
    }

    #[test]
    fn transient_errors_are_the_retryable_ones() {
        let full = Error::Daemon {
            code: ErrorCode::STORAGE_FULL,
            message: "disk full".into(),
        };
        assert!(full.is_transient());
        assert!(!full.is_connection_failure());
        let closed = Error::Closed {
            endpoint: "s".into(),
        };
        assert!(closed.is_transient() && closed.is_connection_failure());
        let missing = Error::Daemon {
            code: ErrorCode::NOT_FOUND,
            message: "x".into(),
        };
        assert!(!missing.is_transient());
    }

    #[test]
    fn giving_up_on_a_refusal_keeps_its_cause_its_code_and_its_exit_code() {
        let full = Error::Daemon {
            code: ErrorCode::STORAGE_FULL,
            message: "disk full: the store could not commit".into(),
        };
        let e = Error::GaveUp {
            waited: Duration::from_secs(2),
            cause: Box::new(full),
        };
        assert_eq!(
            e.to_string(),
            "gave up after 2s: disk full: the store could not commit (storage_full)"
        );
        assert_eq!(e.exit_code(), 1);
        assert_eq!(e.daemon_code(), Some(ErrorCode::STORAGE_FULL));
        assert!(!e.is_transient());
        assert!(!e.is_connection_failure());
    }

    #[test]
    fn durations_are_humanized() {
        assert_eq!(humanize(Duration::from_millis(200)), "200ms");
        assert_eq!(humanize(Duration::from_secs(30)), "30s");
        assert_eq!(humanize(Duration::from_millis(1500)), "1.5s");
        assert_eq!(humanize(Duration::from_secs(120)), "2m");
        assert_eq!(humanize(Duration::from_secs(125)), "2m5s");
        assert_eq!(humanize(Duration::from_secs(3661)), "1h1m1s");
    }
}
