//! The crash-loop soak: supervised workers and `tether publish` producers
//! write while `tail -f` clients follow, and the daemon is `kill -9`'d at
//! random moments (and a shim now and then). At the end every acknowledged
//! line must be stored exactly once, every tailer must have printed every
//! stored frame exactly once and in order, and no stream may repeat a seq.
//!
//! [`Plan::from_env`] reads the size of the run from `TETHER_SOAK_*`
//! variables, so that the short CI version and the long `scripts/soak.sh`
//! run share one implementation.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::StdinFeeder;
use crate::supervise::{parse_frame, Frame, Supervised};
use crate::wait::wait_until;
use crate::{procs, raw, Background, Signal};

/// How big a soak is.
#[derive(Clone, Debug)]
pub struct Plan {
    /// `kill -9`s of the daemon.
    pub kills: u32,
    /// Supervised workers printing numbered lines.
    pub workers: u32,
    /// `tether publish` producers.
    pub producers: u32,
    /// `tail -f` clients, spread over the streams round-robin.
    pub tailers: u32,
    /// Lines each worker prints and each producer publishes.
    pub lines: u64,
    /// A shim is killed after every this many daemon kills (0: never).
    pub shim_kill_every: u32,
    /// Seed of the kill timing; printed so that a failing run can be
    /// repeated.
    pub seed: u64,
}

impl Plan {
    /// Reads `TETHER_SOAK_{KILLS,WORKERS,PRODUCERS,TAILERS,LINES,SHIM_EVERY,SEED}`,
    /// falling back to `default` for each one that is not set.
    pub fn from_env(default: Plan) -> Plan {
        let get = |name: &str, fallback: u64| -> u64 {
            match std::env::var(format!("TETHER_SOAK_{name}")) {
                Ok(v) => v
                    .parse()
                    .unwrap_or_else(|e| panic!("TETHER_SOAK_{name}={v:?} is not a number: {e}")),
                Err(_) => fallback,
            }
        };
        let small = |name: &str, fallback: u32| -> u32 {
            u32::try_from(get(name, u64::from(fallback)))
                .unwrap_or_else(|_| panic!("TETHER_SOAK_{name} is too large"))
        };
        Plan {
            kills: small("KILLS", default.kills),
            workers: small("WORKERS", default.workers),
            producers: small("PRODUCERS", default.producers),
            tailers: small("TAILERS", default.tailers),
            lines: get("LINES", default.lines),
            shim_kill_every: small("SHIM_EVERY", default.shim_kill_every),
            seed: get("SEED", default.seed),
        }
    }
}

/// A seed from the clock, for runs that did not ask for one.
pub fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// What a soak found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub kills: u32,
    pub shim_kills: u32,
    /// Frames stored over all streams at the end.
    pub frames: u64,
    /// Acknowledged lines missing from the store, plus stored frames a
    /// tailer never printed.
    pub lost: u64,
    /// Lines stored twice, seqs repeated in a stream, plus frames a tailer
    /// printed more than once.
    pub duplicated: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "soak: kills={} shim_kills={} frames={} lost={} duplicated={}",
            self.kills, self.shim_kills, self.frames, self.lost, self.duplicated
        )
    }
}

/// A small deterministic generator for kill timing (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the soak and returns what it found; panics on a setup failure.
pub fn run(plan: &Plan) -> Summary {
    let mut rng = Rng(plan.seed | 1);
    let mut sv = Supervised::start();
    let socket = sv.sb().socket();
    let mut summary = Summary::default();

    // Workers: numbered lines at a steady pace, so that they are mid-output
    // at every kill. A killed shim makes the attempt lost; the restart
    // prints from 1 again, which the stream check allows (it is the store,
    // not the worker, that must not repeat).
    let worker_script = format!(
        "i=0; while [ $i -lt {} ]; do i=$((i+1)); echo \"line $i\"; \
         if [ $((i % 20)) -eq 0 ]; then sleep 0.05; fi; done",
        plan.lines
    );
    let mut streams: Vec<String> = (0..plan.workers)
        .map(|w| {
            sv.run(&[
                "--name",
                &format!("soak{w}"),
                "--restart",
                "on-failure",
                "--max-restarts",
                "5",
                "--",
                "sh",
                "-c",
                &worker_script,
            ])
        })
        .collect();
    let worker_ids = streams.clone();

    // Producers: each publishes its lines in chunks, one between kills.
    let mut producers = Vec::new();
    for p in 0..plan.producers {
        let stream = format!("pub{p}");
        let mut child = Background::spawn(
            &format!("producer{p}"),
            sv.sb()
                .tether_with_timeout("120s", &["publish", &stream, "--producer", "soak"]),
            sv.sb().path(),
        );
        let feeder = StdinFeeder::new(child.take_stdin());
        streams.push(stream);
        producers.push((child, Some(feeder)));
    }
    let chunks = u64::from(plan.kills) + 1;
    let chunk = plan.lines.div_ceil(chunks);
    let feed = |producers: &mut Vec<(Background, Option<StdinFeeder>)>, k: u64| {
        let first = k * chunk + 1;
        let last = plan.lines.min(first + chunk - 1);
        if first > last {
            return;
        }
        let text: String = (first..=last).map(|n| format!("msg {n}\n")).collect();
        for (_, feeder) in producers.iter() {
            if let Some(feeder) = feeder {
                feeder.feed(text.clone());
            }
        }
    };
    feed(&mut producers, 0);

    for stream in &streams {
        wait_until(STEP_TIMEOUT, &format!("first frame of {stream}"), || {
            raw::last_seq(&socket, stream) >= 1
        });
    }
    let mut tailers: Vec<(String, Background)> = (0..plan.tailers)
        .map(|t| {
            let stream = streams[t as usize % streams.len()].clone();
            let child = sv.sb().spawn(
                &format!("tailer{t}"),
                &["tail", &stream, "-f", "--json", "--from-seq", "1"],
            );
            (stream, child)
        })
        .collect();

    for k in 0..plan.kills {
        std::thread::sleep(Duration::from_millis(150 + rng.below(600)));
        sv.daemon().kill9();
        summary.kills += 1;
        // Sometimes the daemon stays away a while, so that shim windows
        // fill and clients back off.
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        sv.daemon().restart();
        feed(&mut producers, u64::from(k) + 1);
        if plan.shim_kill_every > 0 && (k + 1) % plan.shim_kill_every == 0 {
            let id = &worker_ids[rng.below(worker_ids.len() as u64) as usize];
            if kill_shim_of(&sv, id) {
                summary.shim_kills += 1;
            }
        }
    }

    // Quiet: producers finish, workers end, tailers catch up.
    for (child, feeder) in &mut producers {
        if let Some(feeder) = feeder.take() {
            feeder.finish();
        }
        child.assert_exit(0, STEP_TIMEOUT);
    }
    for id in &worker_ids {
        sv.wait_for(id, "a final state", STEP_TIMEOUT, |row| {
            matches!(row["state"].as_str(), Some("completed" | "failed"))
        });
    }
    let stored: Vec<(String, Vec<Frame>)> = streams
        .iter()
        .map(|s| (s.clone(), stored_frames(&sv, s)))
        .collect();
    for (stream, frames) in &stored {
        summary.frames += frames.len() as u64;
        let mut seen = HashSet::new();
        for (i, f) in frames.iter().enumerate() {
            if !seen.insert(f.seq) {
                summary.duplicated += 1;
            }
            assert_eq!(f.seq, i as u64 + 1, "{stream}: seqs are not 1, 2, 3, ...");
        }
        if stream.starts_with("pub") {
            let (lost, dup) = count_lines(frames, plan.lines);
            summary.lost += lost;
            summary.duplicated += dup;
        }
    }
    for (stream, tailer) in &mut tailers {
        let frames = &stored.iter().find(|(s, _)| s == stream).expect("stream").1;
        let last = frames.last().map_or(0, |f| f.seq);
        let start = Instant::now();
        while printed_seqs(tailer).last().copied().unwrap_or(0) < last
            && start.elapsed() < STEP_TIMEOUT
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        tailer.signal(Signal::Term);
        tailer.assert_exit(0, STEP_TIMEOUT);
        let printed = printed_seqs(tailer);
        let (lost, dup) = compare_tail(&printed, last);
        summary.lost += lost;
        summary.duplicated += dup;
    }
    summary
}

/// Kills the shim of execution `id` if it has one running; true if it did.
fn kill_shim_of(sv: &Supervised, id: &str) -> bool {
    let row = sv.info(id);
    let Some(worker) = row["pid"].as_u64().and_then(|p| u32::try_from(p).ok()) else {
        return false;
    };
    let Some(stat) = procs::stat(worker) else {
        return false;
    };
    let shim = stat.ppid;
    match procs::stat(shim) {
        Some(s) if s.comm == "tether-shim" => procs::kill9(shim).is_ok(),
        _ => false,
    }
}

/// Every frame stored in `stream`, read with `tether tail --json`.
fn stored_frames(sv: &Supervised, stream: &str) -> Vec<Frame> {
    let out = sv.sb().run(&["tail", stream, "--json", "--from-seq", "1"]);
    out.assert_success();
    out.stdout.lines().map(parse_frame).collect()
}

/// Lines `msg 1` .. `msg N` missing from, and repeated in, a producer's
/// stream.
fn count_lines(frames: &[Frame], lines: u64) -> (u64, u64) {
    let mut counts = vec![0u64; lines as usize + 1];
    for f in frames {
        let n = f
            .payload
            .strip_prefix("msg ")
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("unexpected payload {:?}", f.payload));
        counts[n] += 1;
    }
    let lost = counts[1..].iter().filter(|&&c| c == 0).count() as u64;
    let dup = counts[1..].iter().map(|&c| c.saturating_sub(1)).sum();
    (lost, dup)
}

/// The seqs a `tail --json` client printed, in order.
fn printed_seqs(tailer: &Background) -> Vec<u64> {
    tailer
        .stdout()
        .lines()
        .filter(|l| l.ends_with('}'))
        .map(|l| parse_frame(l).seq)
        .collect()
}

/// Seqs 1..=last missing from, and repeated in, what a tailer printed; a
/// seq out of order counts as both.
fn compare_tail(printed: &[u64], last: u64) -> (u64, u64) {
    let mut seen = HashSet::new();
    let mut dup = 0;
    let mut prev = 0;
    for &seq in printed {
        if !seen.insert(seq) || seq <= prev {
            dup += 1;
        }
        prev = seq;
    }
    let lost = (1..=last).filter(|s| !seen.contains(s)).count() as u64;
    (lost, dup)
}
