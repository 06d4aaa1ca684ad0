//! Where the daemon's log lines go, chosen once at start-up:
//!
//! * `--log-format json`: one JSON object per line on stderr, wherever
//!   stderr leads.
//! * Under systemd, when stderr is the journal stream the service manager
//!   set up (`JOURNAL_STREAM` names stderr's device and inode): the
//!   journal's native protocol, with priorities and each event's fields
//!   (`EXECUTION=`, `STREAM=`, ...) as journal fields. If the journal's
//!   socket cannot be reached, text lines on stderr, which the journal
//!   still gets.
//! * Otherwise text lines on stderr, with their time. `JOURNAL_STREAM` may
//!   be inherited by a daemon whose stderr was redirected elsewhere (a
//!   shell started from a service); it counts only when it names stderr.

use crate::config::LogFormat;

/// Where log lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// The journal's native protocol.
    Journal,
    /// Text lines on stderr; without their time when the journal, which
    /// adds its own, reads stderr.
    Text { time: bool },
    /// JSON lines on stderr.
    Json,
}

/// The device and inode of an open file, as `JOURNAL_STREAM` writes them.
pub type FileId = (u64, u64);

/// Chooses the sink for `format`, given `$JOURNAL_STREAM` and the device
/// and inode of stderr (`None` when they cannot be read).
pub fn choose(format: LogFormat, journal_stream: Option<&str>, stderr: Option<FileId>) -> Sink {
    if format == LogFormat::Json {
        return Sink::Json;
    }
    match (journal_stream.and_then(parse_journal_stream), stderr) {
        (Some(journal), Some(stderr)) if journal == stderr => Sink::Journal,
        _ => Sink::Text { time: true },
    }
}

/// What to use when the journal was chosen but cannot be reached: stderr,
/// which is the journal's stream, so without our own times.
pub const JOURNAL_FALLBACK: Sink = Sink::Text { time: false };

/// `"DEV:INODE"`, both decimal.
fn parse_journal_stream(value: &str) -> Option<FileId> {
    let (dev, ino) = value.trim().split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// The device and inode of this process's stderr.
pub fn stderr_id() -> Option<FileId> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_chosen_whatever_the_journal() {
        for journal in [None, Some("8:42")] {
            assert_eq!(choose(LogFormat::Json, journal, Some((8, 42))), Sink::Json);
        }
    }

    #[test]
    fn the_journal_is_chosen_only_when_it_names_stderr() {
        assert_eq!(
            choose(LogFormat::Text, Some("8:42"), Some((8, 42))),
            Sink::Journal
        );
        // Inherited, while stderr goes elsewhere.
        assert_eq!(
            choose(LogFormat::Text, Some("8:42"), Some((8, 43))),
            Sink::Text { time: true }
        );
        assert_eq!(
            choose(LogFormat::Text, Some("8:42"), None),
            Sink::Text { time: true }
        );
        assert_eq!(
            choose(LogFormat::Text, None, Some((8, 42))),
            Sink::Text { time: true }
        );
        for junk in ["", "8", "8:", ":42", "a:b", "8:42:1"] {
            assert_eq!(
                choose(LogFormat::Text, Some(junk), Some((8, 42))),
                Sink::Text { time: true },
                "{junk:?}"
            );
        }
    }

    #[test]
    fn stderr_has_an_identity() {
        assert!(stderr_id().is_some());
    }
}
