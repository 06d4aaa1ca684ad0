//! Degraded mode: what the daemon does while its store cannot be written.
//!
//! A write that fails (a full disk, a quota, `EIO` or `EROFS` from a write
//! or a sync) is neither a crash nor a reason to spin. The writer enters
//! degraded mode: it refuses every new write at once with the cause (the
//! producer keeps its frames and retries), holds consumers' acks to record
//! later, runs no background work, and tries the store again on a slow
//! schedule ([`FIRST_RETRY`], then every [`RETRY_EVERY`]). Reads are served
//! from what is stored throughout. The log gets one line when the fault
//! begins, at most one every [`LOG_EVERY`] while it lasts, and one when it
//! clears, so that a full disk does not also fill the journal.
//!
//! [`StorageHealth`] is the part everyone else reads (`status`, metrics);
//! [`Degradation`] is the writer's own bookkeeping.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::Error;

/// The first retry after a fault began. Short, so that a fault that
/// passed at once (a transient error) costs about a second.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);

/// The time between later retries: each is a durable commit, so this
/// bounds what a lasting fault costs (well under 5 % of a core), and
/// writing resumes within this much of the fault ending.
pub const RETRY_EVERY: Duration = Duration::from_secs(5);

/// At most one log line this often while a fault lasts.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// How [`Error::DiskFull`] begins when shown.
const FULL_PREFIX: &str = "storage full: ";

/// Why the store cannot be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The cause as producers and `status` show it: `storage full: ...` or
    /// `I/O error on FILE: ...`.
    pub cause: String,
    /// Whether it is a lack of space (the wire's `storage_full`) rather
    /// than a failing device.
    pub full: bool,
    /// When it began (wall clock, for `status`).
    pub since: SystemTime,
}

impl Fault {
    /// The fault a failed write reports, or `None` for a failure that is
    /// not the store's (the daemon shutting down, a refused request). A
    /// failing device's cause is its error's own words (`I/O error on
    /// FILE: ...`, as the store and the log word theirs), without the
    /// `storage error: ` that the refusal adds (see [`Fault::refusal`]).
    /// The error itself is the caller's to log: a fault keeps its words.
    pub fn of(e: &Error) -> Option<Fault> {
        let (cause, full) = match e {
            Error::DiskFull { .. } => (e.to_string(), true),
            Error::Storage { context, source } => (format!("{context}: {source}"), false),
            Error::Invariant(detail) | Error::Refused(detail) => (detail.clone(), false),
            Error::Io { .. } => (e.to_string(), false),
            _ => return None,
        };
        Some(Fault {
            cause,
            full,
            since: SystemTime::now(),
        })
    }

    /// Whether `other` is the same kind of fault: both a full disk, or
    /// both the same I/O error (the cause names the file and the error).
    fn is_like(&self, other: &Fault) -> bool {
        self.full == other.full && (self.full || self.cause == other.cause)
    }

    /// The error a write refused while degraded gets: it names the cause,
    /// and its wire code tells a full disk from a failing one.
    pub fn refusal(&self) -> Error {
        if self.full {
            let detail = self.cause.strip_prefix(FULL_PREFIX).unwrap_or(&self.cause);
            Error::DiskFull {
                detail: detail.to_owned(),
                source: None,
            }
        } else {
            Error::Refused(self.cause.clone())
        }
    }
}

/// Whether the store can be written, shared with everyone who reports it.
#[derive(Clone, Debug, Default)]
pub struct StorageHealth {
    fault: Arc<Mutex<Option<Fault>>>,
}

impl StorageHealth {
    /// The fault the store is degraded by, if any.
    pub fn fault(&self) -> Option<Fault> {
        self.fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, fault: Option<Fault>) {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = fault;
    }
}

/// The writer's record of a fault that lasts: when to try again and when
/// it last said so.
#[derive(Debug)]
pub struct Degradation {
    fault: Fault,
    began: Instant,
    next_retry: Instant,
    last_logged: Instant,
    /// Retries that failed, for the lines while it lasts.
    failed_retries: u64,
    /// Began soon after the last one cleared: logged at debug level.
    quiet: bool,
}

impl Degradation {
    /// A fault began: logs it once and tells `health`. `cleared`: when the
    /// last one cleared, and that fault. The same fault back within
    /// [`LOG_EVERY`] of that (a disk hovering at full) is logged only at
    /// debug level while the first retry may still cure it, so that blips
    /// cost no lines; one that outlasts that retry, and another fault, are
    /// logged as any.
    pub fn begin(
        fault: Fault,
        health: &StorageHealth,
        now: Instant,
        cleared: Option<(Instant, &Fault)>,
    ) -> Degradation {
        let quiet = cleared
            .is_some_and(|(at, last)| now.duration_since(at) < LOG_EVERY && last.is_like(&fault));
        if quiet {
            tracing::debug!("storage degraded again: {}", fault.cause);
        } else {
            tracing::warn!(
                "storage degraded: {}; writes are refused and retried every {}s, reads go on",
                fault.cause,
                RETRY_EVERY.as_secs()
            );
        }
        health.set(Some(fault.clone()));
        Degradation {
            fault,
            began: now,
            next_retry: now + FIRST_RETRY,
            last_logged: now,
            failed_retries: 0,
            quiet,
        }
    }

    /// The fault, for refusing writes.
    pub fn fault(&self) -> &Fault {
        &self.fault
    }

    /// When the next retry is due.
    pub fn next_retry(&self) -> Instant {
        self.next_retry
    }

    /// Whether a retry is due at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        now >= self.next_retry
    }

    /// A retry failed with `fault`: the next one is [`RETRY_EVERY`] on. The
    /// cause shown is the newest (a full disk may turn into a failing
    /// one); its start stays when the store first became unwritable. Logs
    /// at most once a [`LOG_EVERY`].
    pub fn retry_failed(&mut self, fault: Option<Fault>, health: &StorageHealth, now: Instant) {
        self.failed_retries += 1;
        self.next_retry = now + RETRY_EVERY;
        if let Some(fault) = fault {
            if fault.cause != self.fault.cause || fault.full != self.fault.full {
                let changed = !fault.is_like(&self.fault);
                self.fault = Fault {
                    since: self.fault.since,
                    ..fault
                };
                health.set(Some(self.fault.clone()));
                if changed {
                    // Another fault: said at once, and its end too.
                    self.quiet = false;
                    self.last_logged = now;
                    tracing::warn!("storage still degraded, now by: {}", self.fault.cause);
                    return;
                }
            }
        }
        if self.quiet {
            // Back soon after clearing, and not a blip that the first
            // retry cured: said once, so that the last line about storage
            // is not that it was writable again.
            self.quiet = false;
            self.last_logged = now;
            tracing::warn!(
                "storage degraded again: {}; writes are refused and retried every {}s, reads \
                 go on",
                self.fault.cause,
                RETRY_EVERY.as_secs()
            );
            return;
        }
        if now.duration_since(self.last_logged) >= LOG_EVERY {
            self.last_logged = now;
            tracing::warn!(
                "storage still degraded after {}s ({} retries): {}",
                now.duration_since(self.began).as_secs(),
                self.failed_retries,
                self.fault.cause
            );
        }
    }

    /// The store took a write again: logs it once, tells `health`, and
    /// returns the fault that cleared.
    pub fn clear(self, health: &StorageHealth, now: Instant) -> Fault {
        health.set(None);
        let took = now.duration_since(self.began).as_secs_f64();
        if self.quiet {
            tracing::debug!("storage writable again after {took:.1}s");
        } else {
            tracing::info!(
                "storage writable again after {took:.1}s: {} cleared",
                self.fault.cause
            );
        }
        self.fault
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io;

    use super::*;

    fn full() -> Fault {
        let e = io::Error::from_raw_os_error(libc::ENOSPC);
        Fault::of(&Error::DiskFull {
            detail: e.to_string(),
            source: Some(e.into()),
        })
        .unwrap()
    }

    /// An `EIO` on `file`, as the store and the log word theirs.
    fn eio(file: &str) -> Error {
        Error::storage(
            format!("I/O error on {file}"),
            io::Error::from_raw_os_error(libc::EIO),
        )
    }

    #[test]
    fn retries_come_first_within_a_second_then_every_five() {
        let health = StorageHealth::default();
        let t0 = Instant::now();
        let mut d = Degradation::begin(full(), &health, t0, None);
        assert!(!d.is_due(t0));
        assert!(d.is_due(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        d.retry_failed(None, &health, t1);
        assert!(!d.is_due(t1 + Duration::from_millis(4_999)));
        assert!(d.is_due(t1 + RETRY_EVERY));
        assert_eq!(d.next_retry(), t1 + RETRY_EVERY);
    }

    #[test]
    fn health_shows_the_fault_until_it_clears_and_keeps_its_start() {
        let health = StorageHealth::default();
        let t0 = Instant::now();
        let first = full();
        let mut d = Degradation::begin(first.clone(), &health, t0, None);
        assert_eq!(health.fault().unwrap().cause, first.cause);
        let io = Fault::of(&eio("/s/tether.wal"));
        d.retry_failed(io, &health, t0 + RETRY_EVERY);
        let shown = health.fault().unwrap();
        assert_eq!(
            shown.cause,
            "I/O error on /s/tether.wal: Input/output error (os error 5)"
        );
        assert!(!shown.full);
        assert_eq!(shown.since, first.since);
        d.clear(&health, t0 + 2 * RETRY_EVERY);
        assert_eq!(health.fault(), None);
    }

    #[test]
    fn only_the_same_fault_back_within_a_minute_is_quiet() {
        let health = StorageHealth::default();
        let t0 = Instant::now();
        let began = Degradation::begin(full(), &health, t0, None);
        assert!(!began.quiet);
        let cleared_at = t0 + RETRY_EVERY;
        let cleared = began.clear(&health, cleared_at);
        let soon = cleared_at + Duration::from_secs(1);
        let last = Some((cleared_at, &cleared));
        assert!(Degradation::begin(full(), &health, soon, last).quiet);
        let later = cleared_at + LOG_EVERY;
        assert!(!Degradation::begin(full(), &health, later, last).quiet);
        let io = Fault::of(&eio("/s/tether.wal")).unwrap();
        assert!(!Degradation::begin(io.clone(), &health, soon, last).quiet);
        // A quiet one that outlasts its first retry says so, and its end.
        let mut lasting = Degradation::begin(full(), &health, soon, last);
        lasting.retry_failed(None, &health, soon + FIRST_RETRY);
        assert!(!lasting.quiet);
        // A quiet one that turns into another fault says so, and its end.
        let mut again = Degradation::begin(full(), &health, soon, last);
        again.retry_failed(Some(io), &health, soon + RETRY_EVERY);
        assert!(!again.quiet);
    }

    #[test]
    fn a_refusal_names_the_cause_and_keeps_the_full_disk_code() {
        let refusal = full().refusal();
        assert_eq!(refusal.code(), tether_protocol::ErrorCode::STORAGE_FULL);
        assert_eq!(
            refusal.to_string(),
            "storage full: No space left on device (os error 28)"
        );
        assert_eq!(Fault::of(&Error::ShuttingDown), None);
        // A storage error's cause is its own words, not nested in the
        // `storage error: ` its refusal adds.
        let failed = eio("/s/tether.redb");
        let io = Fault::of(&failed).unwrap();
        assert_eq!(
            io.cause,
            "I/O error on /s/tether.redb: Input/output error (os error 5)"
        );
        assert!(!io.full);
        let refusal = io.refusal();
        assert_eq!(refusal.code(), tether_protocol::ErrorCode::STORAGE);
        assert_eq!(refusal.to_string(), failed.to_string());
        // A refusal is a fault of its own: the same one again.
        assert_eq!(Fault::of(&refusal).unwrap().cause, io.cause);
    }
}
