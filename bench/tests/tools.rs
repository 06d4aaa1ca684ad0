//! The bench binaries, end to end on a tiny load: every workload gives a
//! whole row against a real daemon, the floors run, and bad flags are
//! refused with a message. The figures themselves are not checked: a debug
//! build on a shared machine measures nothing worth asserting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn run(exe: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(exe)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {exe}: {e}"))
}

/// Runs `exe` with its files in a directory of its own.
fn run_in_temp(exe: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    run(exe, args, dir.path())
}

/// The JSON rows a successful run printed.
fn rows(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "exit {:?}, stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The JSON rows of one `floors` measurement at a tenth of its counts.
fn quick_floor(only: &str) -> Vec<Value> {
    let out = run_in_temp(
        env!("CARGO_BIN_EXE_floors"),
        &["--quick", "--json", "--only", only],
    );
    rows(&out)
}

fn positive(row: &Value, field: &str) -> f64 {
    let value = row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no {field} in {row}"));
    assert!(value > 0.0, "{field} is {value} in {row}");
    value
}

#[test]
fn every_workload_gives_a_whole_row() {
    let dir = tempfile::tempdir().unwrap();
    let tetherd = tether_tests::bins::tetherd();
    let out = run(
        env!("CARGO_BIN_EXE_tether-bench"),
        &[
            "--workload",
            "all",
            "--frames",
            "300",
            "--streams",
            "3",
            "--window",
            "64",
            "--json",
            "--tetherd",
            tetherd.to_str().unwrap(),
        ],
        dir.path(),
    );
    let rows = rows(&out);
    let workloads: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["W0", "W1", "W2"]);
    let frames: Vec<u64> = rows.iter().map(|r| r["frames"].as_u64().unwrap()).collect();
    assert_eq!(frames, [300, 300, 900]);
    for row in &rows {
        positive(row, "ingest_frames_per_s");
        positive(row, "p50_ms");
        positive(row, "peak_rss_mib");
        assert!(row["daemon_cpu_us_per_frame"].as_f64().unwrap() >= 0.0);
    }
    positive(&rows[0], "follow_p99_ms");
    positive(&rows[1], "replay_frames_per_s");
    positive(&rows[2], "fairness");
    // Each run's directory is removed with it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn w1_writes_each_frames_latency_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("latencies.txt");
    let out = run(
        env!("CARGO_BIN_EXE_tether-bench"),
        &[
            "--workload",
            "w1",
            "--frames",
            "3000",
            "--json",
            "--latencies",
            file.to_str().unwrap(),
        ],
        dir.path(),
    );
    let row = &rows(&out)[0];
    let lines: Vec<f64> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(lines.len(), 3000);
    assert!(lines.iter().all(|&us| us > 0.0));
    // The row's p50 (nearest rank) is the median of the lines written,
    // which are rounded to 0.1 µs.
    let mut sorted = lines.clone();
    sorted.sort_by(f64::total_cmp);
    let p50_ms = positive(row, "p50_ms");
    let median_ms = sorted[1499] / 1000.0;
    assert!(
        (median_ms - p50_ms).abs() < 0.0001,
        "{median_ms} against {p50_ms}"
    );

    assert_eq!(
        refusal(&["--workload", "w0", "--latencies", "x"]),
        "tether-bench: --latencies is for W1 (or all)\n"
    );
    assert_eq!(
        refusal(&["--workload", "w1", "--latencies", "/nonexistent/x"]),
        "tether-bench: cannot write the latencies to /nonexistent/x: \
         No such file or directory (os error 2)\n"
    );
}

/// What `tether-bench` with `args` says as it fails.
fn refusal(args: &[&str]) -> String {
    let out = run_in_temp(env!("CARGO_BIN_EXE_tether-bench"), args);
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_gate_workloads_give_their_figures() {
    let tetherd = tether_tests::bins::tetherd();
    let tetherd = tetherd.to_str().unwrap();
    let bench = env!("CARGO_BIN_EXE_tether-bench");
    let answer = rows(&run_in_temp(
        bench,
        &[
            "--workload",
            "answer",
            "--questions",
            "3",
            "--json",
            "--tetherd",
            tetherd,
        ],
    ));
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0]["workload"], "answer");
    assert_eq!(answer[0]["questions"], 3);
    for field in ["ask_returns_p50_ms", "answer_acked_p50_ms"] {
        positive(&answer[0], field);
    }

    let listed = rows(&run_in_temp(
        bench,
        &[
            "--workload",
            "questions",
            "--questions",
            "20",
            "--executions",
            "2",
            "--json",
            "--tetherd",
            tetherd,
        ],
    ));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["executions"], 2);
    assert_eq!(listed[0]["questions"], 20);
    for field in [
        "ps_none_open_ms",
        "ps_open_ms",
        "ps_ratio",
        "questions_none_open_ms",
        "questions_open_ms",
        "questions_ratio",
    ] {
        positive(&listed[0], field);
    }
}

#[test]
fn the_gate_workloads_refuse_flags_that_are_not_theirs() {
    assert_eq!(
        refusal(&["--workload", "w1", "--questions", "5"]),
        "tether-bench: --questions is for the answer and questions workloads\n"
    );
    assert_eq!(
        refusal(&["--workload", "answer", "--questions", "0"]),
        "tether-bench: --questions and --executions must be at least 1\n"
    );
    assert_eq!(
        refusal(&["--workload", "questions", "--runs", "3"]),
        "tether-bench: --runs is for W0, W1 and W2; answer and questions run once\n"
    );
}

#[test]
fn a_payload_too_short_for_its_send_time_is_refused() {
    let out = run_in_temp(env!("CARGO_BIN_EXE_tether-bench"), &["--size", "4"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tether-bench: --size must be at least 8 (the payload carries its send time)\n"
    );
}

#[test]
fn floors_measure_round_trips_with_and_without_a_thread_hop() {
    let rows = quick_floor("round-trip");
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["round trip 300 B", "round trip 300 B + thread hop"]);
    for row in &rows {
        assert_eq!(row["samples"], 1000);
        let p50 = positive(row, "p50_ms");
        assert!(positive(row, "p99_ms") >= p50);
    }
}

#[test]
fn floors_measure_durable_appends() {
    let rows = quick_floor("append");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["count"], 100_000);
    assert_eq!(rows[0]["unit"], "frames");
    positive(&rows[0], "per_second");
}

#[test]
fn floors_refuse_a_measurement_they_do_not_have() {
    let out = run_in_temp(env!("CARGO_BIN_EXE_floors"), &["--only", "disk"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'disk' for '--only <NAME>'"),
        "{stderr}"
    );
}
