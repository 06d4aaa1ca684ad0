//! Storage faults, `tetherd repair`: the one way past damage. It copies
//! the damaged files to `damaged-<UTC time>/`, keeps every record that
//! verifies, records each lost seq range (a reader resuming into one gets
//! the gap notice), gives no seq twice (not even one only a consumer's
//! ack still names), prints the loss per stream and exits 0; the daemon
//! then starts. It refuses while a daemon runs, and leaves a whole store
//! as it is.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tether_tests::damage::{self, StateSnapshot, LOG_FILE, STORE_FILE};
use tether_tests::text::{line, lines, payload_len, wide_lines};
use tether_tests::{raw, Sandbox};

const STREAM: &str = "s1";

fn log_file(sb: &Sandbox) -> PathBuf {
    sb.state_dir().join(LOG_FILE)
}

/// The `damaged-*` directory repair made in the state directory; there
/// must be exactly one.
fn damaged_dir(sb: &Sandbox) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(sb.state_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("damaged-"))
        })
        .collect();
    assert_eq!(dirs.len(), 1, "one damaged-* directory: {dirs:?}");
    dirs[0].clone()
}

/// Runs `tetherd repair` on the damaged store of `sb`: it exits 0, copies
/// the damaged files byte for byte, and prints exactly the damage, the
/// copy, then `lost` and `kept` lines. Returns its stdout.
fn assert_repaired(sb: &Sandbox, lost: &str, kept: &str) -> String {
    let before = StateSnapshot::take(&sb.state_dir());
    let refused = damage::check(sb);
    refused.assert_code(65);
    let damage = refused
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("tetherd: error: "))
        .expect("check names the damage")
        .to_owned();
    let out = damage::repair(sb);
    out.assert_success();
    let copied = damaged_dir(sb);
    before.assert_same_as(&copied, "tetherd repair's copy");
    assert_eq!(
        out.stdout,
        format!(
            "{damage}\ncopied the damaged files to {}\n{lost}{kept}\n",
            copied.display()
        )
    );
    out.stdout
}

/// What `tether tail STREAM` prints over a lost range `first..=last` of a
/// stream ending at `end`.
fn assert_tail_skips(sb: &Sandbox, first: u64, last: u64, end: u64) {
    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    let mut expected = if first > 1 {
        lines(1..=first - 1)
    } else {
        String::new()
    };
    if last < end {
        expected.push_str(&lines(last + 1..=end));
    }
    assert_eq!(out.stdout, expected);
    let gap = if first == last {
        format!("frame {first} was")
    } else {
        format!("frames {first}..{last} were")
    };
    assert!(
        out.stderr.contains(&format!(
            "stream {STREAM}: {gap} compacted or lost; continuing at {}",
            last + 1
        )),
        "tail should give the gap notice for {first}..{last}:\n{}",
        out.stderr
    );
}

#[test]
fn a_damaged_record_is_recorded_lost_and_everything_else_kept() {
    const ALL: u64 = 50_000;
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=ALL));
    assert!(d.terminate().success());
    let log = log_file(&sb);
    let records = damage::records(&log);
    assert!(records.len() >= 5, "{records:?}");
    let victim = records[records.len() / 2].clone();
    let (first, last) = damage::line_numbers(&damage::body(&log, &victim));
    damage::flip_byte(&log, victim.body_offset() + victim.body_len / 2);

    let kept_frames = ALL - (last - first + 1);
    let kept_bytes: u64 = (1..first).chain(last + 1..=ALL).map(payload_len).sum();
    assert_repaired(
        &sb,
        &format!("lost, per stream:\n  {STREAM}: seqs {first}..{last}\n"),
        &format!("repaired: 1 streams, {kept_frames} frames, {kept_bytes} bytes kept"),
    );

    // The daemon starts; a reader gets everything kept and the gap notice
    // over the lost range; the stream goes on above every seq it had.
    let mut d = sb.start_daemon();
    assert_tail_skips(&sb, first, last, ALL);
    sb.publish(STREAM, &line(ALL + 1));
    assert_eq!(raw::last_seq(&sb.socket(), STREAM), ALL + 1);
    assert!(d.terminate().success());
    let checked = damage::check(&sb);
    checked.assert_success();
    let bytes = kept_bytes + payload_len(ALL + 1);
    assert_eq!(
        checked.stdout,
        format!("ok: 1 streams, {} frames, {bytes} bytes\n", kept_frames + 1)
    );
}

#[test]
fn without_its_log_a_stream_skips_ahead_by_what_the_log_could_hold() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=1000));
    assert!(d.terminate().success());
    let log = log_file(&sb);
    let capacity = std::fs::metadata(&log).unwrap().len();
    std::fs::remove_file(&log).unwrap();

    // The store file names the stream through seq 1000; the frames were
    // in the log, and so may later ones have been: the most the log could
    // hold, at 3 bytes a frame.
    let last = 1000 + capacity / 3 + 1;
    assert_repaired(
        &sb,
        &format!("lost, per stream:\n  {STREAM}: seqs 1..{last}\nlost: the log could not be read (cannot open the log {}: No such file or directory (os error 2))\n", log.display()),
        "repaired: 1 streams, 0 frames, 0 bytes kept",
    );
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &line(1));
    assert_eq!(raw::last_seq(&sb.socket(), STREAM), last + 1);
    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, line(1));
    assert!(d.terminate().success());
}

#[test]
fn a_store_file_past_reading_is_rebuilt_from_the_log() {
    let sb = damage::small_store(STREAM, 1000);
    let store = sb.state_dir().join(STORE_FILE);
    damage::truncate(&store, 100_000);
    let out = damage::repair(&sb);
    out.assert_success();
    let bytes: u64 = (1..=1000).map(payload_len).sum();
    // The log wraps: it holds every commit since the store began.
    assert!(
        !out.stdout.contains("lost, per stream")
            && out.stdout.contains(&format!(
                "lost: the store file could not be opened (store {} is corrupt or unreadable",
                store.display()
            ))
            && out.stdout.ends_with(&format!(
                "repaired: 1 streams, 1000 frames, {bytes} bytes kept\n"
            )),
        "{}",
        out.stdout
    );
    let mut d = sb.start_daemon();
    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=1000));
    assert!(d.terminate().success());
}

#[test]
fn repair_refuses_beside_a_running_daemon_and_leaves_a_whole_store_alone() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=10));
    let out = damage::repair(&sb);
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "tetherd: error: state directory {} is in use by tetherd pid {}",
            sb.state_dir().display(),
            d.pid()
        )),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
    assert!(d.terminate().success());

    let before = StateSnapshot::take(&sb.state_dir());
    let out = damage::repair(&sb);
    out.assert_success();
    let bytes: u64 = (1..=10).map(payload_len).sum();
    assert_eq!(
        out.stdout,
        format!(
            "nothing to repair: the store is whole (ok: 1 streams, 10 frames, {bytes} bytes)\n"
        )
    );
    before.assert_unchanged("tetherd repair on a whole store");
    assert_no_damaged_dir(&sb.state_dir());
}

fn assert_no_damaged_dir(dir: &Path) {
    let any = std::fs::read_dir(dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("damaged-")
    });
    assert!(!any, "no damaged-* directory should be made");
}

#[test]
fn repair_changes_nothing_when_its_copy_would_not_fit_on_the_disk() {
    let Some((sb, tmpfs)) = crate::fault_disk_full::sandbox_on_a_small_tmpfs() else {
        return;
    };
    // Room to fill the store at any pace of copying the log into redb;
    // the disk is shrunk to fit the files once they are written.
    tmpfs.resize("24m");
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &wide_lines(1..=2500, 1000));
    assert!(d.terminate().success());
    let store = sb.state_dir().join(STORE_FILE);
    let len = std::fs::metadata(&store).unwrap().len();
    assert!(len > 2 * 1024 * 1024, "the store holds the frames: {len}");
    // Its magic number: damage every check finds, the file as long.
    damage::flip_byte(&store, 0);
    // Room for half a copy more than the files take up on the disk
    // (which counts the blocks the store reserved ahead of its end).
    let size = len + std::fs::metadata(log_file(&sb)).unwrap().len();
    let used = disk_usage(&sb.state_dir());
    tmpfs.resize(&format!("{}k", (used + size / 2) / 1024 + 64));
    let before = StateSnapshot::take(&sb.state_dir());
    let out = damage::repair(&sb);
    out.assert_code(1);
    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("tetherd: error: storage full: repair needs "))
        .unwrap_or_else(|| panic!("repair should say it needs room:\n{}", out.stderr));
    assert!(
        error.ends_with("are; nothing was changed")
            && error.contains(&format!("free in {} (a copy", sb.state_dir().display())),
        "{error}"
    );
    before.assert_unchanged("tetherd repair refusing for want of room");
    assert_no_damaged_dir(&sb.state_dir());

    // With room, it goes ahead.
    tmpfs.resize("64m");
    damage::repair(&sb).assert_success();
    damaged_dir(&sb);
}

#[test]
fn a_repair_stopped_while_putting_its_store_in_place_is_finished_by_the_next() {
    // What a repair leaves when stopped after its new store was whole and
    // before both files were moved: the new log still in `repair.new/`
    // with the `done` mark holding its report (here, a whole store's log
    // and an empty report).
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=10));
    assert!(d.terminate().success());
    let new_dir = sb.state_dir().join("repair.new");
    std::fs::create_dir(&new_dir).unwrap();
    std::fs::rename(log_file(&sb), new_dir.join(LOG_FILE)).unwrap();
    std::fs::write(new_dir.join("done"), "the report\n").unwrap();

    let started = damage::start_refused(&sb);
    started.assert_code(65);
    assert!(
        started.stderr.contains(&format!(
            "tetherd: error: the store is damaged: {}: a repair was stopped while putting its \
             new store in place; affected: the whole store until `tetherd repair` finishes it",
            sb.state_dir().join(STORE_FILE).display()
        )),
        "{}",
        started.stderr
    );
    damage::check(&sb).assert_code(65);

    let out = damage::repair(&sb);
    out.assert_success();
    assert_eq!(
        out.stdout,
        "finished an interrupted repair: its new store is now in place\nthe report\n\n"
    );
    assert!(!new_dir.exists());
    let mut d = sb.start_daemon();
    assert_eq!(sb.run(&["tail", STREAM]).stdout, lines(1..=10));
    assert!(d.terminate().success());
}

#[test]
fn after_each_kind_of_damage_repair_lets_the_daemon_start_and_no_seq_is_reused() {
    type Damage = fn(&Sandbox);
    let kinds: [(&str, Damage); 5] = [
        ("a record's header", |sb| {
            damage::flip_byte(&log_file(sb), 2)
        }),
        ("the log cut to nothing", |sb| {
            damage::truncate(&log_file(sb), 0)
        }),
        ("the log deleted", |sb| {
            std::fs::remove_file(log_file(sb)).unwrap()
        }),
        ("the store file's pages", |sb| {
            let store = sb.state_dir().join(STORE_FILE);
            let len = std::fs::metadata(&store).unwrap().len();
            for at in (0..len).step_by(64 * 1024) {
                damage::flip_byte(&store, at);
            }
        }),
        ("the store file cut short", |sb| {
            damage::truncate(&sb.state_dir().join(STORE_FILE), 100_000)
        }),
    ];
    for (kind, damage_it) in kinds {
        let sb = damage::small_store(STREAM, 1000);
        damage_it(&sb);
        damage::check(&sb).assert_code(65);
        let repaired = damage::repair(&sb);
        assert_eq!(repaired.code, Some(0), "{kind}: {}", repaired.stderr);

        let mut d = sb.start_daemon();
        sb.publish(STREAM, "after\n");
        let last = raw::last_seq(&sb.socket(), STREAM);
        assert!(last > 1000, "{kind}: the new frame got seq {last}");
        let out = sb.run(&["tail", STREAM]);
        out.assert_success();
        // What is printed is what was published, in order, gaps aside,
        // and the new line last; a gap is announced.
        let published: Vec<String> = lines(1..=1000).lines().map(str::to_owned).collect();
        let printed: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(printed.last(), Some(&"after"), "{kind}");
        let mut from = published.iter();
        for line in &printed[..printed.len() - 1] {
            assert!(
                from.any(|p| p == line),
                "{kind}: {line:?} out of order or never published"
            );
        }
        if printed.len() < 1001 {
            assert!(
                out.stderr.contains("were compacted or lost; continuing at"),
                "{kind}: {} lines printed without a gap notice:\n{}",
                printed.len(),
                out.stderr
            );
        }
        assert!(d.terminate().success());
        damage::check(&sb).assert_success();
    }
}

/// Lines persisted into the store file before the commits the test of
/// consumer acks damages, and the last line, which a consumer acks.
const PERSISTED: u64 = 20;
const ACKED: u64 = 30;

/// How long the commits after [`PERSISTED`] may take: under this, the
/// daemon cannot have persisted them (it persists an idle store 1 s after
/// its first commit that is in the log only).
const UNPERSISTED_WITHIN: Duration = Duration::from_millis(800);

/// Publishes lines 1 to [`PERSISTED`], which consumer `slow` reads the
/// first of, and waits until the store persisted them; then publishes
/// the lines to [`ACKED`], lets consumer `c` read and ack them all, and
/// crashes the daemon at once: only the log holds the last lines and
/// `c`'s ack. (`slow` keeps the lines it has not acked from being
/// compacted.) `None` when that took too long to be sure of it.
fn crash_after_an_unpersisted_ack() -> Option<Sandbox> {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=PERSISTED));
    let read = sb.run(&["tail", STREAM, "--consumer", "slow", "--count", "1"]);
    read.assert_success();
    assert_eq!(read.stdout, line(1));
    std::thread::sleep(Duration::from_millis(2500));
    let started = Instant::now();
    sb.publish(STREAM, &lines(PERSISTED + 1..=ACKED));
    let count = (ACKED - 1).to_string();
    let read = sb.run(&["tail", STREAM, "--consumer", "c", "--count", &count]);
    d.kill9();
    read.assert_success();
    assert_eq!(read.stdout, lines(2..=ACKED));
    (started.elapsed() < UNPERSISTED_WITHIN).then_some(sb)
}

#[test]
fn repair_continues_a_stream_above_a_consumer_ack_past_every_frame_kept() {
    let sb = (0..3)
        .find_map(|_| crash_after_an_unpersisted_ack())
        .expect("a publish and a read took over 800 ms three times: too slow to test");
    // The record of the lines after those persisted fails its check; the
    // record of `c`'s ack after it passes.
    let log = log_file(&sb);
    let records = damage::records(&log);
    let at = records
        .iter()
        .rposition(|r| damage::body(&log, r).windows(5).any(|w| w == b"line-"))
        .expect("a record holding lines");
    let victim = records[at].clone();
    assert_eq!(
        damage::line_numbers(&damage::body(&log, &victim)),
        (PERSISTED + 1, ACKED)
    );
    assert!(
        at + 1 < records.len(),
        "the ack's record follows: {records:?}"
    );
    damage::flip_byte(&log, victim.body_offset() + victim.body_len / 2);

    // Lines 2 to 20 are kept (`slow` acked line 1); 21 to 30 are lost,
    // though `c` acked them. No surviving record names the stream's last
    // seq after 20, so the stream goes on above `c`'s ack and past the
    // most frames the lost record could hold (3 bytes each, at least).
    let lost_to = ACKED + (victim.end() - victim.offset) / 3 + 1;
    let kept_bytes: u64 = (2..=PERSISTED).map(payload_len).sum();
    assert_repaired(
        &sb,
        &format!(
            "lost, per stream:\n  {STREAM}: seqs {}..{lost_to}\n",
            PERSISTED + 1
        ),
        &format!(
            "repaired: 1 streams, {} frames, {kept_bytes} bytes kept",
            PERSISTED - 1
        ),
    );

    // The next frame gets a seq above every one `c` acked; `c` reads it
    // alone, and `slow` what was kept, the gap, and it.
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &line(ACKED + 1));
    assert_eq!(raw::last_seq(&sb.socket(), STREAM), lost_to + 1);
    let read = sb.run(&["tail", STREAM, "--consumer", "c"]);
    read.assert_success();
    assert_eq!(read.stdout, line(ACKED + 1));
    let read = sb.run(&["tail", STREAM, "--consumer", "slow"]);
    read.assert_success();
    assert_eq!(
        read.stdout,
        format!("{}{}", lines(2..=PERSISTED), line(ACKED + 1))
    );
    assert_eq!(
        read.stderr,
        format!(
            "tether: stream {STREAM}: frames {}..{lost_to} were compacted or lost; continuing at \
             {}\n",
            PERSISTED + 1,
            lost_to + 1
        )
    );
    assert!(d.terminate().success());
}

/// The bytes the files under `dir` take up on their disk.
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                disk_usage(&entry.path())
            } else {
                meta.blocks() * 512
            }
        })
        .sum()
}
