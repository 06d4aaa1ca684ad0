//! Restart policy: whether an ended attempt is followed by another, and
//! after how long.
//!
//! Exit codes are classified first (the sysexits.h meanings):
//! * 0 ends the execution `completed`, unless the policy is `always`;
//! * 75 (`EX_TEMPFAIL`) is transient: retried at once, without backoff;
//! * 77 (`EX_NOPERM`) and 78 (`EX_CONFIG`) are unrecoverable: never retried;
//! * a worker that could not be started at all is never retried either
//!   (another attempt would fail the same way, and a bad command must end
//!   quickly rather than loop);
//! * every other code, a signal and a lost shim follow the policy.
//!
//! `never` means never, whatever the class. A restart also needs a restart
//! left under `max_restarts` and must be able to start before the
//! deadline; otherwise the execution ends `failed` saying which limit it hit.
//!
//! On top of this decision the supervisor applies the crash-loop guard
//! (it needs the store to know whether an attempt recorded a checkpoint or
//! a step): a restart after too many failures in a row without progress
//! becomes the end, `failed` with reason [`CRASH_LOOP`].

use std::time::Duration;

use tether_protocol::{ExecState, ExitStatus, RestartPolicy, RunSpec};

/// The first backoff delay.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// No backoff delay is longer than this.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// The share of a delay that jitter may take off, so that workers failing
/// together do not restart in lockstep.
const JITTER_SHARE: f64 = 0.2;

/// The reason of an execution ended by too many failures in a row
/// without progress.
pub const CRASH_LOOP: &str = "crash loop";

/// Temporary failure: retried at once.
pub const EX_TEMPFAIL: i32 = 75;
/// Permission denied: never retried.
pub const EX_NOPERM: i32 = 77;
/// Configuration error: never retried.
pub const EX_CONFIG: i32 = 78;

/// How an attempt ended.
#[derive(Clone, Copy, Debug)]
pub enum Ending<'a> {
    /// The shim reported the worker's exit.
    Exited(&'a ExitStatus),
    /// The shim vanished without reporting it.
    Lost,
}

/// What follows an ended attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No further attempt: the execution ends in `state`
    /// (completed, failed or lost), with `reason` when there is one to give.
    End {
        state: ExecState,
        reason: Option<String>,
    },
    /// The next attempt starts after `delay`; zero means at once.
    Restart { delay: Duration },
}

/// The limits a restart must respect, taken from the [`RunSpec`].
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub restart: RestartPolicy,
    pub max_restarts: Option<u32>,
    /// No attempt starts after this, microseconds since the epoch.
    pub deadline_micros: Option<u64>,
}

impl Limits {
    /// The limits of `spec`, submitted at `submitted_micros`.
    pub fn of(spec: &RunSpec, submitted_micros: u64) -> Self {
        Self {
            restart: spec.restart,
            max_restarts: spec.max_restarts,
            deadline_micros: spec
                .deadline_ms
                .map(|ms| submitted_micros.saturating_add(ms.saturating_mul(1000))),
        }
    }

    /// True when an attempt may still start at `micros`.
    pub fn before_deadline(&self, micros: u64) -> bool {
        self.deadline_micros.is_none_or(|d| micros <= d)
    }
}

/// Decides what follows an attempt that ended as `ending`, after
/// `restarts` restarts so far, at `now_micros`. `jitter` in `[0, 1)` picks
/// the delay within its jitter range (see [`backoff_delay`]).
pub fn decide(
    limits: &Limits,
    restarts: u32,
    now_micros: u64,
    ending: Ending<'_>,
    jitter: f64,
) -> Decision {
    let end = |state, reason: Option<String>| Decision::End { state, reason };
    // (state when no restart follows, whether the class allows a restart,
    // whether it skips the backoff)
    let (fallback, retry, at_once) = match ending {
        Ending::Exited(ExitStatus::Code(0)) => (
            ExecState::Completed,
            limits.restart == RestartPolicy::Always,
            false,
        ),
        Ending::Exited(ExitStatus::Code(code @ (EX_NOPERM | EX_CONFIG))) => {
            return end(
                ExecState::Failed,
                Some(format!("exit code {code} is not retried")),
            );
        }
        Ending::Exited(ExitStatus::SpawnFailed(why)) => {
            return end(
                ExecState::Failed,
                Some(format!("the worker could not be started: {why}")),
            );
        }
        Ending::Exited(ExitStatus::Code(EX_TEMPFAIL)) => (
            ExecState::Failed,
            limits.restart != RestartPolicy::Never,
            true,
        ),
        Ending::Exited(ExitStatus::Code(_) | ExitStatus::Signal(_)) => (
            ExecState::Failed,
            limits.restart != RestartPolicy::Never,
            false,
        ),
        Ending::Lost => (
            ExecState::Lost,
            limits.restart != RestartPolicy::Never,
            false,
        ),
    };
    if !retry {
        return end(fallback, None);
    }
    // A limit ends an execution that would have gone on: a lost one is
    // then `failed` with the limit as its reason (lost -> failed).
    let limited = if fallback == ExecState::Completed {
        ExecState::Completed
    } else {
        ExecState::Failed
    };
    if let Some(max) = limits.max_restarts {
        if restarts >= max {
            return end(limited, Some(format!("max restarts ({max}) reached")));
        }
    }
    let delay = if at_once {
        Duration::ZERO
    } else {
        backoff_delay(restarts.saturating_add(1), jitter)
    };
    let starts_at = now_micros.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
    if !limits.before_deadline(starts_at) {
        return end(limited, Some("deadline".into()));
    }
    Decision::Restart { delay }
}

/// The delay before restart number `restart` (1 for the first restart):
/// `BACKOFF_BASE * 2^(restart - 1)`, capped at [`BACKOFF_CAP`] with `min`,
/// then shortened by up to a fifth according to `jitter` in `[0, 1)`. The
/// result never exceeds the cap.
pub fn backoff_delay(restart: u32, jitter: f64) -> Duration {
    let doublings = restart.saturating_sub(1).min(30);
    let exponential = BACKOFF_BASE.saturating_mul(1u32 << doublings);
    let capped = exponential.min(BACKOFF_CAP);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    capped.mul_f64(1.0 - JITTER_SHARE * jitter)
}

/// A jitter value in `[0, 1)`.
pub fn jitter() -> f64 {
    (random() >> 11) as f64 / (1u64 << 53) as f64
}

/// 64 random-looking bits for jitter and execution ids. Not
/// cryptographic: values only have to differ between calls, processes and
/// restarts, which the clock, the pid and a call counter guarantee.
pub fn random() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let calls = CALLS.fetch_add(1, Ordering::Relaxed);
    let mut x = now ^ (u64::from(std::process::id()) << 40) ^ calls.rotate_left(20);
    // splitmix64: spreads the low-entropy input over all bits.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A short human form of a delay: "450ms", "2s", "1.5s", "60s".
pub fn human(delay: Duration) -> String {
    let ms = delay.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", delay.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(restart: RestartPolicy) -> Limits {
        Limits {
            restart,
            max_restarts: None,
            deadline_micros: None,
        }
    }

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::Code(code)
    }

    fn ended(state: ExecState) -> Decision {
        Decision::End {
            state,
            reason: None,
        }
    }

    #[test]
    fn backoff_doubles_from_the_base() {
        assert_eq!(backoff_delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(backoff_delay(2, 0.0), Duration::from_secs(1));
        assert_eq!(backoff_delay(3, 0.0), Duration::from_secs(2));
        assert_eq!(
            backoff_delay(8, 0.0),
            Duration::from_secs(64).min(BACKOFF_CAP)
        );
    }

    #[test]
    fn backoff_is_capped_with_min_even_for_huge_restart_counts() {
        for restart in [8, 9, 20, 31, 32, 64, 1000, u32::MAX] {
            for jitter in [0.0, 0.5, 0.999] {
                let d = backoff_delay(restart, jitter);
                assert!(d <= BACKOFF_CAP, "restart {restart}: {d:?} over the cap");
                assert!(d >= BACKOFF_CAP.mul_f64(0.8), "restart {restart}: {d:?}");
            }
        }
    }

    #[test]
    fn jitter_only_shortens_within_a_fifth() {
        assert_eq!(backoff_delay(1, 1.0), Duration::from_millis(400));
        assert_eq!(backoff_delay(1, f64::NAN), Duration::from_millis(500));
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
            let d = backoff_delay(1, j);
            assert!(d > Duration::from_millis(399) && d <= Duration::from_millis(500));
        }
    }

    #[test]
    fn exit_zero_completes_unless_always() {
        for policy in [RestartPolicy::Never, RestartPolicy::OnFailure] {
            let d = decide(&limits(policy), 0, 0, Ending::Exited(&exit(0)), 0.0);
            assert_eq!(d, ended(ExecState::Completed));
        }
        let d = decide(
            &limits(RestartPolicy::Always),
            0,
            0,
            Ending::Exited(&exit(0)),
            0.0,
        );
        assert_eq!(
            d,
            Decision::Restart {
                delay: BACKOFF_BASE
            }
        );
    }

    #[test]
    fn failures_follow_the_policy() {
        for status in [exit(1), exit(2), exit(255), ExitStatus::Signal(9)] {
            let d = decide(
                &limits(RestartPolicy::Never),
                0,
                0,
                Ending::Exited(&status),
                0.0,
            );
            assert_eq!(d, ended(ExecState::Failed), "{status:?}");
            for policy in [RestartPolicy::OnFailure, RestartPolicy::Always] {
                let d = decide(&limits(policy), 2, 0, Ending::Exited(&status), 0.0);
                assert_eq!(
                    d,
                    Decision::Restart {
                        delay: Duration::from_secs(2)
                    }
                );
            }
        }
    }

    #[test]
    fn exit_75_is_retried_at_once() {
        let d = decide(
            &limits(RestartPolicy::OnFailure),
            5,
            0,
            Ending::Exited(&exit(75)),
            0.0,
        );
        assert_eq!(
            d,
            Decision::Restart {
                delay: Duration::ZERO
            }
        );
        let d = decide(
            &limits(RestartPolicy::Never),
            0,
            0,
            Ending::Exited(&exit(75)),
            0.0,
        );
        assert_eq!(d, ended(ExecState::Failed));
    }

    #[test]
    fn exit_77_and_78_are_never_retried() {
        for code in [77, 78] {
            let d = decide(
                &limits(RestartPolicy::Always),
                0,
                0,
                Ending::Exited(&exit(code)),
                0.0,
            );
            assert_eq!(
                d,
                Decision::End {
                    state: ExecState::Failed,
                    reason: Some(format!("exit code {code} is not retried")),
                }
            );
        }
    }

    #[test]
    fn a_worker_that_cannot_start_is_never_retried() {
        let status = ExitStatus::SpawnFailed("No such file or directory".into());
        let d = decide(
            &limits(RestartPolicy::Always),
            0,
            0,
            Ending::Exited(&status),
            0.0,
        );
        assert!(matches!(
            d,
            Decision::End { state: ExecState::Failed, reason: Some(r) } if r.contains("No such file")
        ));
    }

    #[test]
    fn a_lost_shim_follows_the_policy() {
        let d = decide(&limits(RestartPolicy::Never), 0, 0, Ending::Lost, 0.0);
        assert_eq!(d, ended(ExecState::Lost));
        let d = decide(&limits(RestartPolicy::OnFailure), 0, 0, Ending::Lost, 0.0);
        assert_eq!(
            d,
            Decision::Restart {
                delay: BACKOFF_BASE
            }
        );
    }

    #[test]
    fn max_restarts_ends_the_execution() {
        let l = Limits {
            max_restarts: Some(2),
            ..limits(RestartPolicy::OnFailure)
        };
        assert!(matches!(
            decide(&l, 1, 0, Ending::Exited(&exit(1)), 0.0),
            Decision::Restart { .. }
        ));
        let reason = Some("max restarts (2) reached".to_owned());
        assert_eq!(
            decide(&l, 2, 0, Ending::Exited(&exit(1)), 0.0),
            Decision::End {
                state: ExecState::Failed,
                reason: reason.clone()
            }
        );
        assert_eq!(
            decide(&l, 2, 0, Ending::Lost, 0.0),
            Decision::End {
                state: ExecState::Failed,
                reason: reason.clone()
            }
        );
        let always = Limits {
            restart: RestartPolicy::Always,
            ..l
        };
        assert_eq!(
            decide(&always, 2, 0, Ending::Exited(&exit(0)), 0.0),
            Decision::End {
                state: ExecState::Completed,
                reason
            }
        );
    }

    #[test]
    fn no_attempt_starts_after_the_deadline() {
        let spec = RunSpec {
            name: None,
            command: vec!["true".into()],
            cwd: None,
            env: Vec::new(),
            restart: RestartPolicy::OnFailure,
            max_restarts: None,
            deadline_ms: Some(1_000),
        };
        let l = Limits::of(&spec, 10_000_000);
        assert_eq!(l.deadline_micros, Some(11_000_000));
        // First restart after 500 ms: inside the deadline.
        assert!(matches!(
            decide(&l, 0, 10_000_000, Ending::Exited(&exit(1)), 0.0),
            Decision::Restart { .. }
        ));
        // The next one would start after it.
        assert_eq!(
            decide(&l, 1, 10_200_000, Ending::Exited(&exit(1)), 0.0),
            Decision::End {
                state: ExecState::Failed,
                reason: Some("deadline".into())
            }
        );
        // At once is still too late past the deadline.
        assert_eq!(
            decide(&l, 0, 11_000_001, Ending::Exited(&exit(75)), 0.0),
            Decision::End {
                state: ExecState::Failed,
                reason: Some("deadline".into())
            }
        );
    }

    #[test]
    fn delays_read_well() {
        assert_eq!(human(Duration::from_millis(450)), "450ms");
        assert_eq!(human(Duration::from_secs(2)), "2s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
    }
}
