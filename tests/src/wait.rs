//! Polling with a deadline, for conditions another process makes true.

use std::time::{Duration, Instant};

/// How often [`wait_until`] re-checks its condition.
const POLL: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds, panicking with `what` when `timeout` passes
/// first. Returns how long it took.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(POLL);
    }
}
