//! Guarantee 7, a full disk: with the state directory on a small tmpfs, a
//! producer that fills it is told "storage full" and keeps its
//! unacknowledged lines; the daemon says so once, does not spin (its log
//! and its CPU time stay quiet while the disk stays full), keeps serving
//! every read from what is stored (streams, ps, checkpoints, steps), shows
//! the fault in `tether status`, and once the tmpfs is grown resumes by
//! itself within 10 s, says so once, and the producer finishes with every
//! line stored exactly once. And a disk that
//! stays full: the producer says so once, keeps retrying for its retry
//! window (`--connect-timeout`), then says which lines are stored and that
//! it gave up, with the cause; nothing stored before is lost, and a re-run
//! as the same producer stores the rest once; a durable consumer's ack
//! made meanwhile is held and stored once there is room.
//!
//! Mounting needs root (CI runs as root); elsewhere the tests print why they
//! did nothing and pass.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use tether_tests::fault::{self, Tmpfs};
use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::{lines, wide_lines};
use tether_tests::wait::wait_until;
use tether_tests::{cli, Daemon, Sandbox, Signal};

const LINES: u64 = 6000;
const WIDTH: usize = 1000;

/// A sandbox whose state directory is a 3 MiB tmpfs; `None`, after saying
/// why, where it cannot be mounted (not root).
pub(crate) fn sandbox_on_a_small_tmpfs() -> Option<(Sandbox, Tmpfs)> {
    if !fault::is_root() {
        eprintln!("skipped: mounting a tmpfs for the state directory needs root");
        return None;
    }
    let sb = Sandbox::new();
    match Tmpfs::mount(&sb.state_dir(), "3m") {
        Ok(tmpfs) => Some((sb, tmpfs)),
        Err(e) => {
            eprintln!("skipped: cannot mount a tmpfs ({e})");
            None
        }
    }
}

#[test]
fn a_full_disk_refuses_appends_clearly_keeps_reads_going_and_recovers() {
    let Some((sb, tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let socket = sb.socket();
    let d = sb.start_daemon();
    let stored_before = StoredReads::store(&sb);
    let began_after = utc_now();
    let mut publisher = tether_tests::Background::spawn(
        "publisher",
        sb.tether_with_timeout("300s", &["publish", "full", "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(wide_lines(1..=LINES, WIDTH));
    wait_until(Duration::from_secs(60), "the first frame", || {
        raw::last_seq(&socket, "full") >= 1
    });
    let mut follower = sb.spawn("follower", &["tail", "full", "-f"]);

    // The disk fills: the daemon says why.
    wait_until(
        Duration::from_secs(120),
        "the daemon to log the full disk",
        || d.logs().contains("storage degraded: "),
    );

    // While the disk stays full, the daemon neither spins nor talks: its
    // log grows by at most a few lines in 20 s (one a minute is allowed),
    // and it uses under 5 % of a core. Nothing else is asked of it
    // meanwhile; only the producer retries.
    let quiet = Duration::from_secs(20);
    let log_lines = d.logs().lines().count();
    let cpu = cpu_time(d.pid());
    let quiet_from = Instant::now();
    std::thread::sleep(quiet);
    let cpu_used = cpu_time(d.pid()).saturating_sub(cpu);
    let waited = quiet_from.elapsed();
    let logged = d.logs().lines().count() - log_lines;
    assert!(
        logged <= 3,
        "the daemon logged {logged} lines in {waited:?} on a full disk:\n{}",
        d.logs()
    );
    assert!(
        cpu_used.as_secs_f64() < 0.05 * waited.as_secs_f64(),
        "the daemon used {cpu_used:?} of CPU in {waited:?} on a full disk (5 % allowed)"
    );
    // Said once, with the cause.
    let logged_cause = degraded_logged(&d.logs());
    assert_storage_full(&logged_cause, "the cause the daemon logged");
    assert!(
        publisher.is_running(),
        "publish gave up on a full disk:\n{}",
        publisher.stderr()
    );

    // Every read goes on from what is stored, each answered at once.
    let mut read_list: Vec<&[&str]> = vec![&["status"], &["streams"], &["tail", "full"]];
    let stored_reads = stored_before.reads();
    read_list.extend(stored_reads.iter().map(Vec::as_slice));
    let reads = Reads::start(&sb, &read_list);
    stored_before.assert_same(&reads);
    let status = reads.output("status");
    let shown = degraded_shown(&status);
    assert_storage_full(&shown.cause, "the cause `tether status` shows");
    shown.assert_began_between(&began_after, &utc_now());
    let stuck_at = stream_row(&reads.output("streams"), "full");
    assert!(
        (1..LINES).contains(&stuck_at),
        "{stuck_at} of {LINES} lines stored on a 3 MiB disk?"
    );
    tether_tests::text::assert_same_lines(
        &reads.output("tail full"),
        &wide_lines(1..=stuck_at, WIDTH),
        "`tether tail` of the stream while the disk is full",
    );
    follower.wait_stdout_len(stuck_at * WIDTH as u64, Duration::from_secs(60));

    // Room again: the daemon resumes by itself within the 10 s the
    // contract promises (it retries every 5 s), and says so once.
    tmpfs.resize("64m");
    wait_until(
        RESUME_DEADLINE,
        "`tether status` to show the storage ok",
        || storage_line(&sb) == STORAGE_OK,
    );
    feeder.finish();
    publisher.assert_exit(0, Duration::from_secs(240));
    let told = publisher.stderr();
    let told_cause = told
        .strip_prefix("tether: ")
        .and_then(|rest| {
            rest.strip_suffix(" (storage_full); keeping unacknowledged data and retrying\n")
        })
        .unwrap_or_else(|| {
            panic!(
                "stderr of `tether publish` on a disk that filled and was grown is not one line \
                 `tether: CAUSE (storage_full); keeping unacknowledged data and retrying`:\n{told}"
            )
        });
    assert_storage_full(told_cause, "the cause `tether publish` printed");
    assert_cleared_once(&d, "storage full: ");
    // Every line exactly once, in order: a dedupe that acknowledged a
    // resent line without storing it shows here as a missing line.
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(
        &stored.stdout,
        &wide_lines(1..=LINES, WIDTH),
        "the stored stream",
    );
    raw::assert_stored(&socket, "full", LINES);
    follower.wait_stdout_len(LINES * WIDTH as u64, Duration::from_secs(60));
    follower.signal(Signal::Term);
    follower.assert_exit(0, Duration::from_secs(30));
    tether_tests::text::assert_same_lines(
        &follower.stdout(),
        &wide_lines(1..=LINES, WIDTH),
        "what the follower printed",
    );
    drop(d);
}

/// Lines published, and acknowledged, before the disk fills.
const STORED_BEFORE: u64 = 500;

/// What the daemon's log says, after the cause, when a fault begins.
const REFUSED_AND_RETRIED: &str = "writes are refused and retried every 5s, reads go on";

/// How long a read may take while the store cannot be written: it is
/// served from what is stored, at once.
pub(crate) const READ_DEADLINE: Duration = Duration::from_secs(30);

/// How long after the fault ends the daemon may take to write again: the
/// contract's own bound.
pub(crate) const RESUME_DEADLINE: Duration = Duration::from_secs(10);

/// The last line of `tether status` while the store can be written.
pub(crate) const STORAGE_OK: &str = "storage:     ok";

#[test]
fn publish_gives_up_on_a_disk_that_stays_full_after_its_window() {
    let Some((sb, _tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let socket = sb.socket();
    let mut d = sb.start_daemon();
    let before = wide_lines(1..=STORED_BEFORE, WIDTH);
    let out = sb.run_with_stdin(
        &["publish", "full", "--producer", "before"],
        before.as_bytes(),
    );
    out.assert_success();
    // A durable consumer of another stream (its acks let the stream's
    // frames go) reads and acks the first lines.
    sb.publish(ACKED, &lines(1..=ACKED_LINES));
    assert_consumer_reads(&sb, 1..=ACKED_BEFORE);
    assert_eq!(consumer_ack(&sb), Some(ACKED_BEFORE));
    // Once idle, the daemon moves those lines from its write-ahead log into
    // the store and empties the log; on a disk with this little room it
    // also cuts the log's file, which then holds no space of its own.
    let log = sb.state_dir().join("tether.wal");
    wait_until(Duration::from_secs(60), "the log emptied", || {
        std::fs::metadata(&log).is_ok_and(|m| m.len() == 0)
    });

    // Another program takes the rest of the disk before the next run starts,
    // so that it is refused from its first append on. (Filling the disk by
    // publishing would leave it to timing which lines fit and how often the
    // producer is refused, and so how often it says so.)
    let filler = sb.state_dir().join("filler");
    fill_disk(&filler);
    let after = wide_lines(STORED_BEFORE + 1..=2 * STORED_BEFORE, WIDTH);
    let publish_after = ["publish", "full", "--producer", "after"];
    let out = cli::run(
        sb.tether_with_timeout("2s", &publish_after),
        after.as_bytes(),
        Duration::from_secs(60),
    );

    // Told once that the disk is full (and that nothing is dropped while
    // retrying); when the window has run out, which lines are stored (none
    // of this run) and how to store them, then that it gave up, and why.
    // Giving up on a daemon that answers is an error (1), not "cannot reach
    // the daemon" (4).
    out.assert_code(1);
    assert_eq!(out.stdout, "", "`tether publish` wrote to stdout");
    let cause = out
        .stderr
        .strip_prefix("tether: ")
        .and_then(|rest| rest.split_once(" (storage_full); "))
        .map_or("", |(cause, _)| cause);
    assert_storage_full(
        cause,
        &format!("the cause `tether publish` printed:\n{}", out.stderr),
    );
    let retrying =
        format!("tether: {cause} (storage_full); keeping unacknowledged data and retrying\n");
    let stored = "tether: no line of this run is confirmed stored. Run again with \
                  --producer after and the same input, from its first line, to store \
                  them, each line once.\n";
    let gave_up = format!("tether: gave up after 2s: {cause} (storage_full)\n");
    assert_eq!(
        out.stderr,
        format!("{retrying}{gave_up}{stored}"),
        "stderr of `tether publish` on a full disk"
    );
    assert!(
        out.elapsed >= Duration::from_secs(2),
        "gave up after {:?}, before its 2s retry window ran out",
        out.elapsed
    );

    // Without --producer the name is made up for the run: the advice names
    // the one it used.
    let out = cli::run(
        sb.tether_with_timeout("2s", &["publish", "full"]),
        after.as_bytes(),
        Duration::from_secs(60),
    );
    out.assert_code(1);
    let generated = advised_producer(&out.stderr);
    assert_ne!(generated, "after", "stderr: {}", out.stderr);
    let stored = format!(
        "tether: no line of this run is confirmed stored. Run again with \
         --producer {generated} and the same input, from its first line, to store \
         them, each line once.\n"
    );
    assert_eq!(
        out.stderr,
        format!("{retrying}{gave_up}{stored}"),
        "stderr of `tether publish` without --producer on a full disk"
    );

    // Nothing acknowledged before the disk filled was lost, and nothing of
    // the refused runs was stored.
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(&stored.stdout, &before, "the stored stream");
    raw::assert_stored(&socket, "full", STORED_BEFORE);
    assert_storage_full(&degraded_logged(&d.logs()), "the cause the daemon logged");

    // The consumer reads on and acks while the store cannot be written:
    // the ack is held (its reader is not refused), to be stored once it
    // can be.
    let status = sb.run(&["status"]);
    status.assert_success();
    assert_storage_full(&degraded_shown(&status.stdout).cause, "`tether status`");
    assert_consumer_reads(&sb, ACKED_BEFORE + 1..=ACKED_WHILE_FULL);

    // Once there is room again, re-running as advised (the same input with
    // the producer name that was printed) stores the refused lines, each
    // once.
    std::fs::remove_file(&filler).expect("remove the filler");
    let out = sb.run_with_stdin(
        &["publish", "full", "--producer", &generated],
        after.as_bytes(),
    );
    out.assert_success();
    let stored = sb.run(&["tail", "full"]);
    stored.assert_success();
    tether_tests::text::assert_same_lines(
        &stored.stdout,
        &format!("{before}{after}"),
        "the stored stream after the re-run",
    );
    raw::assert_stored(&socket, "full", 2 * STORED_BEFORE);

    // The ack held while the disk was full was stored once writing
    // resumed: the daemon shows it, also after a restart, and the
    // consumer goes on after it.
    wait_until(Duration::from_secs(30), "the held ack to be stored", || {
        consumer_ack(&sb) == Some(ACKED_WHILE_FULL)
    });
    assert!(d.terminate().success());
    d.restart();
    assert_eq!(consumer_ack(&sb), Some(ACKED_WHILE_FULL), "after a restart");
    assert_consumer_reads(&sb, ACKED_WHILE_FULL + 1..=ACKED_LINES);
    raw::assert_stored(&socket, "full", 2 * STORED_BEFORE);
    drop(d);
}

/// The stream a durable consumer reads in the full-disk tests, its
/// lines, and the consumer.
const ACKED: &str = "acked";
const ACKED_LINES: u64 = 310;
const CONSUMER: &str = "c";

/// Lines the consumer acks before the disk fills, and while it is full.
const ACKED_BEFORE: u64 = 100;
const ACKED_WHILE_FULL: u64 = 300;

/// Asserts that `tether tail acked --consumer c --count N` prints lines
/// `seqs` and exits 0, acking the last.
fn assert_consumer_reads(sb: &Sandbox, seqs: std::ops::RangeInclusive<u64>) {
    let count = (seqs.end() + 1 - seqs.start()).to_string();
    let out = sb.run(&["tail", ACKED, "--consumer", CONSUMER, "--count", &count]);
    out.assert_success();
    assert_eq!(out.stdout, lines(seqs), "what the consumer read");
}

/// The consumer's ack as `tether streams --json` shows it, if any.
fn consumer_ack(sb: &Sandbox) -> Option<u64> {
    let out = sb.run(&["streams", "--json"]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .unwrap_or_else(|e| panic!("`tether streams --json` printed {line:?}: {e}"))
        })
        .find(|row| row["name"] == ACKED)
        .and_then(|row| {
            row["consumers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == CONSUMER)?["acked_through"]
                .as_u64()
        })
}

/// The producer name that `tether publish` advises re-running with.
fn advised_producer(stderr: &str) -> String {
    let (_, rest) = stderr
        .split_once(" --producer ")
        .unwrap_or_else(|| panic!("no --producer advice on stderr:\n{stderr}"));
    rest.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no producer name after --producer:\n{stderr}"))
        .to_owned()
}

/// Writes `path` until the file system it is on has no space left.
fn fill_disk(path: &Path) {
    let mut file = File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return,
            Err(e) => panic!("filling {} failed: {e}", path.display()),
        }
    }
}

/// Asserts that `cause` is a full disk's, as the daemon words it:
/// `storage full: ...No space left on device (os error 28)` (after the
/// prefix it may name the file whose write failed).
pub(crate) fn assert_storage_full(cause: &str, what: &str) {
    assert!(
        cause.starts_with("storage full: ")
            && cause.ends_with("No space left on device (os error 28)"),
        "{what} is not `storage full: ...No space left on device (os error 28)`: {cause:?}"
    );
}

/// The last line of `tether status`, which must exit 0.
pub(crate) fn storage_line(sb: &Sandbox) -> String {
    let out = sb.run(&["status"]);
    out.assert_success();
    out.stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("`tether status` printed nothing"))
        .to_owned()
}

/// A fault as `tether status` shows it: `storage:     degraded (CAUSE)
/// since TIME`.
#[derive(Debug)]
pub(crate) struct Shown {
    pub(crate) line: String,
    pub(crate) cause: String,
    pub(crate) since: String,
}

impl Shown {
    /// Asserts the fault began after `after` and by `by` (times as
    /// [`utc_now`] gives them).
    pub(crate) fn assert_began_between(&self, after: &str, by: &str) {
        assert!(
            after <= self.since.as_str() && self.since.as_str() <= by,
            "the fault shown began at {}, not between {after} and {by}: {}",
            self.since,
            self.line
        );
    }
}

/// Reads the fault off the last line of `status` (what `tether status`
/// printed), asserting the line's form.
pub(crate) fn degraded_shown(status: &str) -> Shown {
    let line = status.lines().last().unwrap_or_default().to_owned();
    let (cause, since) = line
        .strip_prefix("storage:     degraded (")
        .and_then(|rest| rest.rsplit_once(") since "))
        .unwrap_or_else(|| {
            panic!(
                "`tether status` does not end in `storage:     degraded (CAUSE) since TIME`:\n{status}"
            )
        });
    assert!(
        is_utc_micros(since),
        "the time in `tether status`'s storage line is not UTC in RFC 3339 with microseconds: {line:?}"
    );
    Shown {
        cause: cause.to_owned(),
        since: since.to_owned(),
        line: line.clone(),
    }
}

/// Whether `text` reads `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn is_utc_micros(text: &str) -> bool {
    let form = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    text.len() == form.len()
        && text.chars().zip(form.chars()).all(|(c, f)| match f {
            'd' => c.is_ascii_digit(),
            f => c == f,
        })
}

/// The time now as the daemon and `tether status` write it.
pub(crate) fn utc_now() -> String {
    let mut cmd = Command::new("date");
    cmd.arg("-u").arg("+%Y-%m-%dT%H:%M:%S.%6NZ");
    let out = cli::run(cmd, b"", Duration::from_secs(30));
    out.assert_success();
    out.stdout.trim_end().to_owned()
}

/// What an ended execution's checkpoint and step read while the store
/// could be written: every read of them must print the same while it
/// cannot (`ps --all` and `checkpoint list` as JSON, which shows times
/// rather than ages).
#[derive(Debug)]
pub(crate) struct StoredReads {
    reads: Vec<(Vec<String>, String)>,
}

/// The checkpoint [`StoredReads::store`] saves.
const CHECKPOINT: &str = "state saved before the fault";

/// The step result [`StoredReads::store`] records.
const STEP_RESULT: &str = "fetched 42\n";

impl StoredReads {
    /// Runs an execution to its end, saves a checkpoint of it and records
    /// a step, then reads them, and all executions, back.
    pub(crate) fn store(sb: &Sandbox) -> Self {
        let ran = sb.run(&["run", "--json", "--restart", "never", "--", "true"]);
        ran.assert_success();
        let ran: serde_json::Value =
            serde_json::from_str(ran.stdout.trim()).expect("`tether run --json` prints JSON");
        let id = ran["id"].as_str().expect("an execution id").to_owned();
        wait_until(Duration::from_secs(60), "the execution to complete", || {
            let ps = sb.run(&["ps", "--json", &id]);
            ps.assert_success();
            serde_json::from_str::<serde_json::Value>(ps.stdout.trim())
                .is_ok_and(|row| row["state"] == "completed")
        });
        let saved = sb.run_with_stdin(
            &["checkpoint", "save", "--force", "--execution", &id],
            CHECKPOINT.as_bytes(),
        );
        saved.assert_success();
        let put = sb.run_with_stdin(
            &["step", "put", "fetch", "--execution", &id],
            STEP_RESULT.as_bytes(),
        );
        put.assert_success();
        assert_eq!(put.stdout, STEP_RESULT, "`tether step put`");
        let reads = [
            vec!["--json", "ps", "--all"],
            vec!["--json", "checkpoint", "list", &id],
            vec!["checkpoint", "load", "--execution", &id],
            vec!["step", "get", "fetch", "--execution", &id],
        ]
        .into_iter()
        .map(|args| {
            let out = sb.run(&args);
            out.assert_success();
            (args.into_iter().map(str::to_owned).collect(), out.stdout)
        })
        .collect::<Vec<(Vec<String>, String)>>();
        assert_eq!(reads[2].1, CHECKPOINT, "`tether checkpoint load`");
        assert_eq!(reads[3].1, STEP_RESULT, "`tether step get`");
        assert!(
            reads[0].1.contains(&format!("\"id\":\"{id}\"")),
            "`tether ps --all` lists no {id}:\n{}",
            reads[0].1
        );
        Self { reads }
    }

    /// The reads, as [`Reads::start`] takes them.
    pub(crate) fn reads(&self) -> Vec<Vec<&str>> {
        self.reads
            .iter()
            .map(|(args, _)| args.iter().map(String::as_str).collect())
            .collect()
    }

    /// Asserts that each read printed, in `reads`, what it printed when
    /// the store could be written.
    pub(crate) fn assert_same(&self, reads: &Reads) {
        for (args, before) in &self.reads {
            let args = args.join(" ");
            assert_eq!(
                &reads.output(&args),
                before,
                "`tether {args}` while the store cannot be written"
            );
        }
    }
}

/// Reads commands started together, each given [`READ_DEADLINE`] to
/// finish: while the store cannot be written, one that hangs must not hide
/// whether the others work.
#[derive(Debug)]
pub(crate) struct Reads {
    done: Vec<(String, tether_tests::Background, Option<ExitStatus>)>,
}

impl Reads {
    /// Starts `tether ARGS` for each of `reads` and waits for them.
    pub(crate) fn start(sb: &Sandbox, reads: &[&[&str]]) -> Self {
        let mut started: Vec<(String, tether_tests::Background)> = reads
            .iter()
            .enumerate()
            .map(|(i, args)| {
                let mut read = sb.spawn(&format!("read-{i}"), args);
                read.close_stdin();
                (args.join(" "), read)
            })
            .collect();
        let deadline = Instant::now() + READ_DEADLINE;
        while Instant::now() < deadline && started.iter_mut().any(|(_, r)| r.is_running()) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let done = started
            .into_iter()
            .map(|(name, mut read)| {
                let status = read.poll();
                (name, read, status)
            })
            .collect();
        Self { done }
    }

    /// What `tether ARGS` printed. Asserts that every read exited 0 in time,
    /// naming each that did not.
    pub(crate) fn output(&self, args: &str) -> String {
        let failed: Vec<String> = self
            .done
            .iter()
            .filter(|(_, _, status)| !status.is_some_and(|s| s.success()))
            .map(|(name, read, status)| {
                let state = status.map_or_else(
                    || format!("still running after {READ_DEADLINE:?}"),
                    |s| s.to_string(),
                );
                let stderr = read.stderr();
                format!(
                    "`tether {name}`: {state}; {} lines on stderr, the first: {}",
                    stderr.lines().count(),
                    stderr.lines().next().unwrap_or_default()
                )
            })
            .collect();
        assert!(
            failed.is_empty(),
            "every read must work while the store cannot be written:\n{}",
            failed.join("\n")
        );
        self.done
            .iter()
            .find(|(name, _, _)| name == args)
            .unwrap_or_else(|| panic!("`tether {args}` was not started"))
            .1
            .stdout()
    }
}

/// The daemon's lines saying that the storage is degraded: `WARN storage
/// degraded: CAUSE; writes are refused and retried every 5s, reads go on`
/// when a fault begins, `WARN storage degraded again: ...` when it came
/// back soon after clearing and outlasted its first retry. One fault, or
/// a short one cured by its first retry and then the lasting one (a log
/// append refused, then no room for the store to grow), are allowed.
fn degraded_lines(logs: &str) -> Vec<&str> {
    let found: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(" WARN storage degraded"))
        .collect();
    assert!(
        (1..=2).contains(&found.len()),
        "expected one or two `storage degraded` lines in the daemon's log, found {}:\n{logs}",
        found.len()
    );
    found
}

/// The cause of the last fault the daemon logged (see [`degraded_lines`]),
/// asserting the form of every such line.
pub(crate) fn degraded_logged(logs: &str) -> String {
    let mut cause = String::new();
    for (i, line) in degraded_lines(logs).into_iter().enumerate() {
        let begins = if i == 0 {
            " WARN storage degraded: "
        } else {
            " WARN storage degraded again: "
        };
        cause = line
            .split_once(begins)
            .and_then(|(_, rest)| rest.strip_suffix(&format!("; {REFUSED_AND_RETRIED}")))
            .unwrap_or_else(|| {
                panic!(
                    "not `{}CAUSE; {REFUSED_AND_RETRIED}`:\n{line}",
                    begins.trim_start()
                )
            })
            .to_owned();
    }
    cause
}

/// Asserts that the daemon logged once, for each fault it logged, that
/// the storage is writable again, as `INFO storage writable again after
/// N.Ns: CAUSE cleared`; the last CAUSE contains `cause`.
pub(crate) fn assert_cleared_once(d: &Daemon, cause: &str) {
    let logs = d.logs();
    let found: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("storage writable again"))
        .collect();
    let faults = degraded_lines(&logs).len();
    assert_eq!(
        found.len(),
        faults,
        "expected one `storage writable again` line for each of {faults} faults, found {}:\n{logs}",
        found.len()
    );
    for (i, line) in found.iter().enumerate() {
        let took = line
            .split_once(" INFO storage writable again after ")
            .and_then(|(_, rest)| rest.split_once("s: "))
            .filter(|(_, rest)| {
                rest.ends_with(" cleared") && (i + 1 < found.len() || rest.contains(cause))
            })
            .map(|(took, _)| took);
        assert!(
            took.is_some_and(|t| t.parse::<f64>().is_ok() && t.contains('.')),
            "not `INFO storage writable again after N.Ns: ...{cause}... cleared`:\n{line}"
        );
    }
}

/// The last seq of `stream` in what `tether streams` printed, asserting
/// that its row holds every seq from 1 to there (FIRST is 1, FRAMES is
/// LAST).
pub(crate) fn stream_row(streams: &str, stream: &str) -> u64 {
    let row: Vec<&str> = streams
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&stream))
        .unwrap_or_else(|| panic!("`tether streams` has no row for {stream}:\n{streams}"));
    let number = |i: usize| row.get(i).and_then(|c| c.parse::<u64>().ok());
    match (number(1), number(2), number(3)) {
        (Some(1), Some(last), Some(frames)) if frames == last => last,
        _ => {
            panic!("`tether streams`' row for {stream} is not `{stream}  1  N  N ...`:\n{streams}")
        }
    }
}

/// The CPU time (user and system) process `pid` has used so far.
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/stat: {e}"));
    // Fields 14 and 15 (utime, stime), counted after the command name,
    // which may hold spaces and ends at the last `)`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no utime/stime in /proc/{pid}/stat: {stat}"))
        })
        .sum();
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64)
}

fn clock_ticks_per_second() -> u64 {
    let mut cmd = Command::new("getconf");
    cmd.arg("CLK_TCK");
    let out = cli::run(cmd, b"", Duration::from_secs(30));
    out.assert_success();
    out.stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("getconf CLK_TCK printed {:?}: {e}", out.stdout))
}

#[test]
fn a_workers_output_waits_in_its_shim_while_the_disk_is_full_and_none_is_lost() {
    let Some((sb, tmpfs)) = sandbox_on_a_small_tmpfs() else {
        return;
    };
    let mut sup = tether_tests::supervise::Supervised::on(sb);
    // Twice what the disk holds, as fast as the worker can write it.
    let script = format!(
        "awk 'BEGIN {{ for (i = 1; i <= {LINES}; i++) {{ s = sprintf(\"wide-%09d-\", i); \
         while (length(s) < {WIDTH} - 1) s = s \"x\"; print s }} }}'"
    );
    let id = sup.run_sh(&[], &script);
    wait_until(
        Duration::from_secs(120),
        "the daemon to log the full disk",
        || sup.daemon().logs().contains("storage degraded: "),
    );
    // The worker is held up on its pipe, not failed, and not finished.
    std::thread::sleep(Duration::from_secs(10));
    let info = sup.info(&id);
    assert_eq!(info["state"], "running", "{info}");

    tmpfs.resize("64m");
    sup.wait_state(&id, "completed", Duration::from_secs(240));
    let expected: Vec<String> = wide_lines(1..=LINES, WIDTH)
        .lines()
        .map(str::to_owned)
        .collect();
    let stored = sup.stdout_lines(&id);
    assert_eq!(stored.len(), expected.len(), "lines stored");
    assert!(stored == expected, "every line once, in order");
    assert_cleared_once(sup.daemon(), "storage full: ");
    // The shim asked again about once a second, not in a tight loop, and
    // the daemon's log did not note each of its sessions.
    let logs = sup.daemon().logs();
    assert!(!logs.contains("reattached"), "{logs}");
    let told = sup
        .shim_log(&id)
        .matches("holding the worker's output")
        .count();
    // Once per fault: a short fault cured at its first retry lets the
    // shim store frames, and the lasting one after it is news again.
    let faults = degraded_lines(&logs).len();
    assert!(
        (1..=faults).contains(&told),
        "the shim said {told} times that it holds the output, over {faults} faults"
    );
}
