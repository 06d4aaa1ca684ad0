//! Capped exponential backoff with jitter.
//!
//! The delay before attempt `n` (counting from 0) is `initial * 2^n`, capped
//! at `cap` with `min`, so it can never exceed the cap however many attempts
//! fail. Jitter then picks a delay in the upper half of that range
//! (`[d/2, d]`), which spreads out clients that lost the daemon at the same
//! moment while keeping the growth visible. A success calls
//! [`Backoff::reset`].
//!
//! The jitter comes from a tiny SplitMix64 generator seeded from the clock
//! and the process id: jitter needs spread, not cryptographic quality, and a
//! dependency for it would be out of proportion.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Default first delay.
pub const DEFAULT_INITIAL: Duration = Duration::from_millis(20);
/// Default largest delay. Kept short because the common outage is a daemon
/// restart that takes well under a second.
pub const DEFAULT_CAP: Duration = Duration::from_secs(1);

/// Capped exponential backoff state.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    attempt: u32,
    rng: SplitMix64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(DEFAULT_INITIAL, DEFAULT_CAP)
    }
}

impl Backoff {
    /// Backoff starting at `initial` and never exceeding `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        Self::with_seed(initial, cap, seed_from_environment())
    }

    /// Like [`Backoff::new`] with a fixed jitter seed, for reproducible tests.
    pub fn with_seed(initial: Duration, cap: Duration, seed: u64) -> Self {
        Self {
            initial,
            cap,
            attempt: 0,
            rng: SplitMix64(seed),
        }
    }

    /// The un-jittered delay for the next attempt: `initial * 2^attempt`,
    /// capped at the cap.
    pub fn base_delay(&self) -> Duration {
        // 2^attempt overflows u32 after 31 doublings; the cap is reached long
        // before that for any sane configuration, so overflow means "cap".
        let uncapped = 2u32
            .checked_pow(self.attempt)
            .and_then(|factor| self.initial.checked_mul(factor))
            .unwrap_or(self.cap);
        uncapped.min(self.cap)
    }

    /// The jittered delay to wait before the next attempt, and one step of
    /// growth. Always within `[base/2, base]` and so never above the cap.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.base_delay();
        self.attempt = self.attempt.saturating_add(1);
        let half = base / 2;
        let spread = u64::try_from((base - half).as_nanos()).unwrap_or(u64::MAX);
        let extra = if spread == 0 {
            0
        } else {
            self.rng.next() % (spread + 1)
        };
        half + Duration::from_nanos(extra)
    }

    /// Attempts made since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Starts over from the initial delay (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A seed that differs between processes and between runs.
fn seed_from_environment() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15
}

/// SplitMix64: one add and three xor-shift-multiply rounds per number. Every
/// seed, zero included, gives a full-period sequence.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delay_never_exceeds_the_cap() {
        for seed in 0..50 {
            let mut b = Backoff::with_seed(10 * MS, 700 * MS, seed);
            for _ in 0..200 {
                assert!(b.base_delay() <= 700 * MS);
                assert!(b.next_delay() <= 700 * MS);
            }
        }
    }

    #[test]
    fn cap_holds_even_when_doubling_overflows() {
        let mut b = Backoff::with_seed(Duration::from_secs(3600), Duration::from_secs(5), 1);
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(5));
        }
        assert_eq!(b.base_delay(), Duration::from_secs(5));
    }

    #[test]
    fn base_delay_doubles_until_the_cap() {
        let mut b = Backoff::with_seed(10 * MS, 100 * MS, 7);
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(b.base_delay());
            b.next_delay();
        }
        assert_eq!(
            seen,
            vec![10 * MS, 20 * MS, 40 * MS, 80 * MS, 100 * MS, 100 * MS]
        );
    }

    #[test]
    fn jitter_stays_in_the_upper_half_of_the_base() {
        let mut b = Backoff::with_seed(8 * MS, Duration::from_secs(1), 42);
        for _ in 0..20 {
            let base = b.base_delay();
            let d = b.next_delay();
            assert!(
                d >= base / 2 && d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[test]
    fn jitter_actually_varies() {
        let mut delays = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let mut b = Backoff::with_seed(Duration::from_secs(1), Duration::from_secs(1), seed);
            delays.insert(b.next_delay());
        }
        assert!(delays.len() > 10, "only {} distinct delays", delays.len());
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::with_seed(10 * MS, Duration::from_secs(1), 3);
        for _ in 0..5 {
            b.next_delay();
        }
        assert_eq!(b.attempts(), 5);
        assert_eq!(b.base_delay(), 320 * MS);
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.base_delay(), 10 * MS);
        assert!(b.next_delay() <= 10 * MS);
    }

    #[test]
    fn zero_initial_delay_is_allowed() {
        let mut b = Backoff::with_seed(Duration::ZERO, Duration::from_secs(1), 0);
        assert_eq!(b.next_delay(), Duration::ZERO);
    }
}
