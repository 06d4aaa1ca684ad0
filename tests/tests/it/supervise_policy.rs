//! The restart policy: failures are retried with exponential backoff,
//! `--max-restarts` and `--deadline` end the retries, and exit codes are
//! classified (75 retried at once, 77 and 78 never retried, signals follow
//! the policy). Every attempt shows in the lifecycle events.

use std::time::{Duration, Instant};

use tether_tests::supervise::{assert_event_order, gap, number, payloads, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest first backoff: 500 ms less a fifth of jitter, with a
/// little slack for the clock.
const MIN_FIRST_BACKOFF: Duration = Duration::from_millis(380);
/// The shortest second backoff: 1 s less a fifth of jitter, with slack.
const MIN_SECOND_BACKOFF: Duration = Duration::from_millis(760);

/// A worker that counts its attempts in `count` (in its working
/// directory), prints `attempt N`, and exits `fail_code` until attempt
/// `succeed_at`, then 0.
fn counting_worker(fail_code: i32, succeed_at: u32) -> String {
    format!(
        "n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count; \
         echo \"attempt $n\"; if [ $n -lt {succeed_at} ]; then exit {fail_code}; fi"
    )
}

#[test]
fn a_worker_failing_twice_is_restarted_with_backoff_and_completes() {
    let sup = Supervised::start();
    let script = counting_worker(1, 3);
    let id = sup.run_sh(&[], &script);

    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        (number(&info, "attempt"), number(&info, "restarts")),
        (3, 2),
        "{info}"
    );
    assert_eq!(info["last_exit"]["code"], 0, "{info}");

    let frames = sup.frames(&id);
    assert_eq!(
        payloads(&frames, "stdout"),
        ["attempt 1", "attempt 2", "attempt 3"]
    );
    let found = assert_event_order(
        &frames,
        &[
            "starting attempt 1",
            "started pid",
            "exited 1",
            "restarting in",
            "starting attempt 2",
            "started pid",
            "exited 1",
            "restarting in",
            "starting attempt 3",
            "started pid",
            "exited 0",
            "completed",
        ],
    );
    assert!(
        found[3].payload.ends_with("(attempt 2)") && found[7].payload.ends_with("(attempt 3)"),
        "restart events name the next attempt: {:?}, {:?}",
        found[3].payload,
        found[7].payload
    );
    // The backoff doubles: ~500 ms before attempt 2, ~1 s before attempt 3.
    let first = gap(found[2], found[4]);
    let second = gap(found[6], found[8]);
    assert!(
        first >= MIN_FIRST_BACKOFF,
        "attempt 2 started {first:?} after attempt 1 failed"
    );
    assert!(
        second >= MIN_SECOND_BACKOFF,
        "attempt 3 started {second:?} after attempt 2 failed"
    );
}

#[test]
fn max_restarts_ends_a_failing_execution_as_failed() {
    let sup = Supervised::start();
    let id = sup.run(&["--max-restarts", "2", "--", "sh", "-c", "echo try; exit 1"]);

    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(
        (number(&info, "attempt"), number(&info, "restarts")),
        (3, 2),
        "{info}"
    );
    assert_eq!(info["last_exit"]["code"], 1, "{info}");
    let reason = info["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("max restarts"), "reason: {info}");

    let frames = sup.frames(&id);
    assert_eq!(payloads(&frames, "stdout"), ["try", "try", "try"]);
    let events = payloads(&frames, "event");
    assert!(
        events
            .last()
            .is_some_and(|e| e.starts_with("failed") && e.contains("max restarts")),
        "events: {events:#?}"
    );
    let starts = events
        .iter()
        .filter(|e| e.starts_with("starting attempt"))
        .count();
    assert_eq!(starts, 3, "events: {events:#?}");
}

#[test]
fn no_attempt_starts_after_the_deadline() {
    let sup = Supervised::start();
    let started = Instant::now();
    // Backoff 0.5 s, 1 s, 2 s...: the third restart would start after 2 s.
    let failing = sup.run(&["--deadline", "2s", "--", "sh", "-c", "exit 1"]);
    // A running attempt is not cut short by the deadline: it ends on its
    // own, and only the restart is refused.
    let slow = sup.run(&["--deadline", "1s", "--", "sh", "-c", "sleep 2; exit 1"]);

    let info = sup.wait_state(&failing, "failed", TIMEOUT);
    let elapsed = started.elapsed();
    assert_eq!(info["reason"], "deadline", "{info}");
    assert!(
        number(&info, "attempt") >= 2,
        "the deadline stopped retries that were still in time: {info}"
    );
    assert!(
        elapsed < Duration::from_secs(15),
        "the deadline ended the execution only after {elapsed:?}"
    );
    let events = sup.events(&failing);
    assert_eq!(
        events.last().map(String::as_str),
        Some("failed: deadline"),
        "events: {events:#?}"
    );

    let info = sup.wait_state(&slow, "failed", TIMEOUT);
    assert_eq!(info["reason"], "deadline", "{info}");
    assert_eq!(number(&info, "attempt"), 1, "{info}");
    assert_eq!(
        info["last_exit"]["code"], 1,
        "the running attempt should end on its own: {info}"
    );
}

#[test]
fn exit_75_is_retried_at_once() {
    let sup = Supervised::start();
    let script = counting_worker(75, 3);
    let id = sup.run_sh(&[], &script);

    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        (number(&info, "attempt"), number(&info, "restarts")),
        (3, 2),
        "{info}"
    );
    let frames = sup.frames(&id);
    let found = assert_event_order(
        &frames,
        &[
            "exited 75",
            "restarting at once (attempt 2)",
            "starting attempt 2",
            "exited 75",
            "restarting at once (attempt 3)",
            "starting attempt 3",
            "completed",
        ],
    );
    let events = payloads(&frames, "event");
    assert!(
        !events.iter().any(|e| e.starts_with("restarting in")),
        "exit 75 went through the backoff: {events:#?}"
    );
    for (failed, next) in [(found[0], found[2]), (found[3], found[5])] {
        let waited = gap(failed, next);
        assert!(
            waited < MIN_FIRST_BACKOFF,
            "{:?} came {waited:?} after {:?}: that is a backoff, not at once",
            next.payload,
            failed.payload
        );
    }
}

#[test]
fn exit_77_and_78_are_never_retried() {
    let sup = Supervised::start();
    // Not even under `always`.
    let noperm = sup.run(&["--", "sh", "-c", "echo no; exit 77"]);
    let config = sup.run(&["--restart", "always", "--", "sh", "-c", "echo no; exit 78"]);

    for (id, code) in [(&noperm, 77), (&config, 78)] {
        let info = sup.wait_state(id, "failed", TIMEOUT);
        assert_eq!(info["last_exit"]["code"], code, "{info}");
        let reason = info["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!("exit code {code}")),
            "the reason should name the exit code: {info}"
        );
    }
    // A restart would come after at least the first backoff.
    std::thread::sleep(Duration::from_secs(1));
    for (id, code) in [(&noperm, 77), (&config, 78)] {
        let info = sup.info(id);
        assert_eq!(info["state"], "failed", "{info}");
        assert_eq!(
            (number(&info, "attempt"), number(&info, "restarts")),
            (1, 0),
            "exit {code} was retried: {info}"
        );
        let events = sup.events(id);
        assert!(
            !events.iter().any(|e| e.starts_with("restarting")),
            "exit {code}: {events:#?}"
        );
        assert_eq!(sup.stdout_lines(id), ["no"]);
    }
}

#[test]
fn a_worker_killed_by_a_signal_follows_the_policy() {
    let sup = Supervised::start();
    let restarted = sup.run(&["--max-restarts", "1", "--", "sh", "-c", "kill -KILL $$"]);
    let never = sup.run(&["--restart", "never", "--", "sh", "-c", "kill -KILL $$"]);

    let info = sup.wait_state(&restarted, "failed", TIMEOUT);
    assert_eq!(info["last_exit"]["signal"], 9, "{info}");
    assert_eq!(number(&info, "restarts"), 1, "{info}");
    assert_event_order(
        &sup.frames(&restarted),
        &[
            "killed by signal 9",
            "restarting in",
            "starting attempt 2",
            "killed by signal 9",
            "failed",
        ],
    );

    let info = sup.wait_state(&never, "failed", TIMEOUT);
    assert_eq!(info["last_exit"]["signal"], 9, "{info}");
    assert_eq!(number(&info, "restarts"), 0, "{info}");
}
