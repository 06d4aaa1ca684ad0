//! One row of figures per run: as a table row or as a JSON object, and the
//! median row of several runs.

/// What one run of any workload measured. A figure a workload does not
/// measure is `None` and printed as `-`.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// `W0`, `W1` or `W2`.
    pub workload: &'static str,
    /// The run number, or `med` for the median row.
    pub run: String,
    /// Frames published in the run (all streams).
    pub frames: u64,
    /// Acknowledged frames per second (all streams).
    pub ingest_per_s: f64,
    /// Latency percentiles in ms: producer send to ack for W0, producer
    /// send to follower receive for W1 and W2.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// W0: producer send to follower receive, 99th percentile, in ms.
    pub follow_p99_ms: Option<f64>,
    /// W1: frames per second a fresh reader replays.
    pub replay_per_s: Option<f64>,
    /// W2: the first and the last stream's completion time, in seconds.
    pub completion_s: Option<(f64, f64)>,
    /// The daemon's peak resident set (VmHWM), in MiB.
    pub peak_rss_mib: f64,
    /// CPU time per frame from the first timed append until the last frame
    /// was acknowledged and received, in µs: the daemon's (all threads) and
    /// the load generator's.
    pub daemon_cpu_us: f64,
    pub bench_cpu_us: f64,
    /// W1: the daemon's CPU time per frame replayed, in µs.
    pub replay_cpu_us: Option<f64>,
}

impl Row {
    /// W2's fairness figure: first stream's completion time over the
    /// last's (1.0 when every stream finished together).
    pub fn fairness(&self) -> Option<f64> {
        self.completion_s
            .map(|(min, max)| if max > 0.0 { min / max } else { 1.0 })
    }
}

/// The table's header line.
pub fn header() -> String {
    format!(
        "{:<3} {:>4} {:>10} {:>9} {:>9} {:>9} {:>10} {:>11} {:>15} {:>10} {:>11}",
        "wl",
        "run",
        "ingest/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "follow p99",
        "replay/s",
        "fair (min/max)",
        "peak RSS",
        "cpu µs/frm"
    )
}

/// One table row.
pub fn table_row(r: &Row) -> String {
    let follow = r
        .follow_p99_ms
        .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    let replay = r
        .replay_per_s
        .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let fair = match (r.fairness(), r.completion_s) {
        (Some(f), Some((_, max))) => format!("{f:.2} ({max:.1}s)"),
        _ => "-".to_owned(),
    };
    format!(
        "{:<3} {:>4} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>10} {:>11} {:>15} {:>6.1} MiB {:>11.2}",
        r.workload,
        r.run,
        r.ingest_per_s,
        r.p50_ms,
        r.p99_ms,
        r.p999_ms,
        follow,
        replay,
        fair,
        r.peak_rss_mib,
        r.daemon_cpu_us
    )
}

/// One JSON object.
pub fn json_row(r: &Row, size: usize) -> String {
    serde_json::json!({
        "workload": r.workload,
        "run": r.run,
        "frames": r.frames,
        "size": size,
        "ingest_frames_per_s": r.ingest_per_s.round(),
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "p999_ms": r.p999_ms,
        "follow_p99_ms": r.follow_p99_ms,
        "replay_frames_per_s": r.replay_per_s.map(f64::round),
        "completion_min_s": r.completion_s.map(|c| c.0),
        "completion_max_s": r.completion_s.map(|c| c.1),
        "fairness": r.fairness(),
        "peak_rss_mib": r.peak_rss_mib,
        "daemon_cpu_us_per_frame": r.daemon_cpu_us,
        "bench_cpu_us_per_frame": r.bench_cpu_us,
        "replay_daemon_cpu_us_per_frame": r.replay_cpu_us,
    })
    .to_string()
}

/// Each figure's median over `rows` (which must not be empty), taken
/// figure by figure.
pub fn median(rows: &[Row]) -> Row {
    fn med(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
    fn med_opt(v: Vec<Option<f64>>) -> Option<f64> {
        let v: Vec<f64> = v.into_iter().flatten().collect();
        (!v.is_empty()).then(|| med(v))
    }
    let all = |f: fn(&Row) -> f64| med(rows.iter().map(f).collect());
    let some = |f: fn(&Row) -> Option<f64>| med_opt(rows.iter().map(f).collect());
    let min = some(|r| r.completion_s.map(|c| c.0));
    let max = some(|r| r.completion_s.map(|c| c.1));
    Row {
        workload: rows.first().map_or("", |r| r.workload),
        run: "med".to_owned(),
        frames: rows.first().map_or(0, |r| r.frames),
        ingest_per_s: all(|r| r.ingest_per_s),
        p50_ms: all(|r| r.p50_ms),
        p99_ms: all(|r| r.p99_ms),
        p999_ms: all(|r| r.p999_ms),
        follow_p99_ms: some(|r| r.follow_p99_ms),
        replay_per_s: some(|r| r.replay_per_s),
        completion_s: min.zip(max),
        peak_rss_mib: all(|r| r.peak_rss_mib),
        daemon_cpu_us: all(|r| r.daemon_cpu_us),
        bench_cpu_us: all(|r| r.bench_cpu_us),
        replay_cpu_us: some(|r| r.replay_cpu_us),
    }
}

/// Latency percentiles in ms from samples in ns: (p50, p99, p999).
pub fn percentiles_ms(samples: &mut [u64]) -> (f64, f64, f64) {
    samples.sort_unstable();
    let sorted: Vec<f64> = samples.iter().map(|&ns| ns as f64 / 1e6).collect();
    (
        tether_bench::percentile(&sorted, 0.50),
        tether_bench::percentile(&sorted, 0.99),
        tether_bench::percentile(&sorted, 0.999),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_each_figure_on_its_own() {
        let row = |ingest: f64, rss: f64, done: (f64, f64)| Row {
            workload: "W2",
            ingest_per_s: ingest,
            peak_rss_mib: rss,
            completion_s: Some(done),
            ..Row::default()
        };
        let m = median(&[
            row(3.0, 10.0, (1.0, 4.0)),
            row(1.0, 30.0, (2.0, 2.0)),
            row(2.0, 20.0, (3.0, 3.0)),
        ]);
        assert_eq!(m.ingest_per_s, 2.0);
        assert_eq!(m.peak_rss_mib, 20.0);
        assert_eq!(m.completion_s, Some((2.0, 3.0)));
        assert_eq!(m.replay_per_s, None);
        assert_eq!(m.run, "med");
    }

    #[test]
    fn fairness_is_first_over_last_completion() {
        let r = Row {
            completion_s: Some((1.0, 4.0)),
            ..Row::default()
        };
        assert_eq!(r.fairness(), Some(0.25));
        assert_eq!(Row::default().fairness(), None);
    }
}
