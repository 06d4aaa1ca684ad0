//! Restarts that know progress: a worker that fails five times in a row
//! without recording a checkpoint or a step ends `failed` with reason
//! `crash loop`; one that records progress between failures is kept
//! alive; the count survives a daemon killed with `kill -9`.

use std::time::Duration;

use tether_tests::bins;
use tether_tests::supervise::{number, Supervised};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A worker that counts its attempts in `count` (in its working
/// directory), prints `attempt N`, runs `progress` (a shell command), and
/// exits `fail_code` until attempt `succeed_at`, then 0.
fn counting_worker(progress: &str, fail_code: i32, succeed_at: u32) -> String {
    format!(
        "n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count; \
         echo \"attempt $n\"; {progress} \
         if [ $n -lt {succeed_at} ]; then exit {fail_code}; fi"
    )
}

/// The REASON column of `ps --all` for `id`.
fn reason_column(sup: &Supervised, id: &str) -> String {
    let out = sup.sb().run(&["ps", "--all"]);
    out.assert_success();
    let header = out.stdout.lines().next().unwrap_or_default();
    let at = header.find("REASON").expect("a REASON column");
    let row = out
        .stdout
        .lines()
        .find(|line| line.starts_with(id))
        .unwrap_or_else(|| panic!("no row for {id}:\n{}", out.stdout));
    row.get(at..).unwrap_or_default().trim().to_owned()
}

#[test]
fn five_failures_without_progress_end_the_execution_as_a_crash_loop() {
    let sup = Supervised::start();
    let id = sup.run_sh(&[], &counting_worker("", 1, 1000));
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 5, "{info}");
    assert_eq!(info["reason"], "crash loop", "{info}");
    assert_eq!(reason_column(&sup, &id), "crash loop");
    assert!(
        sup.events(&id).iter().any(|e| e == "failed: crash loop"),
        "{}",
        sup.describe(&id)
    );
}

#[test]
fn a_worker_that_records_progress_between_failures_is_kept_alive() {
    let sup = Supervised::start();
    let tether = bins::tether().display().to_string();
    // Odd attempts save a checkpoint, even ones record a step; exit 75 is
    // retried at once, so the eight failures take no backoff.
    let progress = "if [ $((n % 2)) -eq 1 ]; then echo \"s$n\" | \"$TETHER_BIN\" checkpoint save; \
                    else echo \"r$n\" | \"$TETHER_BIN\" step put \"step$n\"; fi || exit 99;";
    let env = format!("TETHER_BIN={tether}");
    let id = sup.run_sh(&["--env", &env], &counting_worker(progress, 75, 9));
    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 9, "{info}");
    assert_eq!(reason_column(&sup, &id), "exit 0");

    // Without progress the same worker stops after five.
    std::fs::remove_file(sup.sb().file("count")).unwrap();
    let id = sup.run_sh(&[], &counting_worker("", 75, 9));
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 5, "{info}");
    assert_eq!(info["reason"], "crash loop", "{info}");
}

#[test]
fn the_failure_count_survives_a_daemon_kill() {
    let mut sup = Supervised::start();
    let id = sup.run_sh(
        &["--max-failures-without-progress", "4"],
        &counting_worker("", 1, 1000),
    );
    sup.wait_for(&id, "at attempt 3", TIMEOUT, |v| number(v, "attempt") >= 3);
    sup.daemon().kill9();
    sup.daemon().restart();
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 4, "{info}");
    assert_eq!(info["reason"], "crash loop", "{info}");
}

#[test]
fn max_restarts_still_caps_every_restart() {
    let sup = Supervised::start();
    let id = sup.run_sh(&["--max-restarts", "1"], &counting_worker("", 75, 1000));
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(number(&info, "attempt"), 2, "{info}");
    assert_eq!(reason_column(&sup, &id), "max restarts");
}
