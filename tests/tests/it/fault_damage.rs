//! Storage faults, "damage is never silent": a store damaged while the
//! daemon was down makes `tetherd` exit 65 at once, naming the damaged
//! file (and, in the log, the byte), and `tetherd check` exit 65 too,
//! neither changing a byte of the state directory; the only damage
//! repaired silently is a torn tail, the log's last record cut short by a
//! crash. `tetherd check` sums up a whole store in one line, from the
//! files or by asking the daemon that runs on them; the shipped units do
//! not restart a damaged store.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tether_tests::damage::{self, Record, StateSnapshot, LOG_FILE, STORE_FILE};
use tether_tests::text::{line, lines, payload_len};
use tether_tests::{raw, Output, Sandbox, StdinFeeder};

const STREAM: &str = "s1";

/// The small store most kinds of damage are done to: 1000 frames of
/// stream `s1` from four publishes (so the log holds a few records),
/// stopped cleanly.
const SMALL: u64 = 1000;

fn small_store() -> Sandbox {
    damage::small_store(STREAM, SMALL)
}

fn store_file(sb: &Sandbox) -> PathBuf {
    sb.state_dir().join(STORE_FILE)
}

fn log_file(sb: &Sandbox) -> PathBuf {
    sb.state_dir().join(LOG_FILE)
}

/// The line of stderr where `tetherd` says why it stopped.
fn error_line(out: &Output) -> &str {
    out.stderr
        .lines()
        .find(|l| l.starts_with("tetherd: error: "))
        .unwrap_or_else(|| panic!("`{}` gave no error line:\n{}", out.command, out.stderr))
}

/// Starts `tetherd` on the sandbox's damaged store, then runs `tetherd
/// check` on it: both exit 65 with an error line starting with `expected`,
/// and neither changes a byte of the state directory. Returns the
/// daemon's error line.
fn assert_refused(sb: &Sandbox, expected: &str) -> String {
    let before = StateSnapshot::take(&sb.state_dir());
    let started = damage::start_refused(sb);
    started.assert_code(65);
    let said = error_line(&started).to_owned();
    assert!(
        said.starts_with(expected),
        "tetherd should refuse with\n  {expected}...\nit said\n  {said}"
    );
    assert!(
        said.contains("; affected: ") || said.contains("is corrupt or unreadable"),
        "the refusal should say what is affected: {said}"
    );
    before.assert_unchanged("tetherd refusing the damaged store");

    let checked = damage::check(sb);
    checked.assert_code(65);
    let found = error_line(&checked);
    assert!(
        found.starts_with(expected),
        "tetherd check should report\n  {expected}...\nit said\n  {found}"
    );
    assert_eq!(checked.stdout, "", "tetherd check printed a summary");
    before.assert_unchanged("tetherd check");
    said
}

/// `tetherd: error: the store is damaged: FILE at byte N: `.
fn damaged_at(file: &Path, at: u64) -> String {
    format!(
        "tetherd: error: the store is damaged: {} at byte {at}: ",
        file.display()
    )
}

/// `tetherd: error: store FILE is corrupt or unreadable: `.
fn corrupt(file: &Path) -> String {
    format!(
        "tetherd: error: store {} is corrupt or unreadable: ",
        file.display()
    )
}

/// The log's records, at least `at_least` of them.
fn log_records(sb: &Sandbox, at_least: usize) -> Vec<Record> {
    let records = damage::records(&log_file(sb));
    assert!(
        records.len() >= at_least,
        "the log should hold at least {at_least} records: {records:?}"
    );
    records
}

#[test]
fn a_record_failing_its_check_before_valid_ones_after_a_crash_is_damage() {
    let sb = Sandbox::new();
    let socket = sb.socket();
    let mut d = sb.start_daemon();
    // The stream is in the store file itself (an idle daemon commits its
    // store durably within a second), so that the refusal can name it.
    sb.publish(STREAM, &line(1));
    std::thread::sleep(Duration::from_millis(2500));
    let mut publisher = sb.spawn("publisher", &["publish", STREAM]);
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(lines(2..=200_000));
    tether_tests::wait::wait_until(Duration::from_secs(120), "heavy publishing", || {
        raw::last_seq(&socket, STREAM) >= 50_000
    });
    d.kill9();
    drop(publisher);
    drop(feeder);

    // Two records after it pass their checks, whatever the crash cut.
    let records = log_records(&sb, 10);
    let victim = records[records.len() - 3].clone();
    damage::flip_byte(&log_file(&sb), victim.body_offset() + victim.body_len / 2);
    let said = assert_refused(&sb, &damaged_at(&log_file(&sb), victim.offset));
    // The replay applies it (the commits since the last durable commit), or the
    // store reads its chunks from the log (before that): either way its
    // failure is found.
    let replayed = format!(
        "record {} fails its check, and the record after it passes",
        victim.number
    );
    let kept = "a record whose chunks the store reads from the log fails its check";
    assert!(
        said.contains(&replayed) || said.contains(kept),
        "the refusal should name record {}: {said}",
        victim.number
    );
    let affected = said.split("; affected: ").nth(1).unwrap_or_default();
    assert!(
        affected.contains(STREAM),
        "the refusal should name the stream affected: {said}"
    );
}

#[test]
fn a_record_whose_chunks_the_store_reads_from_the_log_failing_is_damage_naming_its_seqs() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=50_000));
    assert!(d.terminate().success());

    let records = log_records(&sb, 5);
    let victim = records[records.len() / 2].clone();
    let (first, last) = damage::line_numbers(&damage::body(&log_file(&sb), &victim));
    damage::flip_byte(&log_file(&sb), victim.body_offset() + victim.body_len / 2);
    let expected = format!(
        "{}a record whose chunks the store reads from the log fails its check; affected: \
         stream \"{STREAM}\" seqs {first}..={last}",
        damaged_at(&log_file(&sb), victim.offset)
    );
    assert_refused(&sb, &expected);
}

#[test]
fn the_first_records_header_damaged_is_damage_at_byte_0() {
    let sb = small_store();
    let records = log_records(&sb, 4);
    assert_eq!(records[0].offset, 0);
    // Byte 2: the body's length, which hides where the next record starts.
    damage::flip_byte(&log_file(&sb), 2);
    let said = assert_refused(&sb, &damaged_at(&log_file(&sb), 0));
    assert!(said.contains("fails its check"), "{said}");
}

#[test]
fn a_log_cut_to_nothing_is_damage() {
    let sb = small_store();
    let log = log_file(&sb);
    let capacity = std::fs::metadata(&log).unwrap().len();
    damage::truncate(&log, 0);
    assert_refused(
        &sb,
        &format!(
            "{}the log is 0 bytes, but the store says it fills {capacity}: it was cut short",
            damaged_at(&log, 0)
        ),
    );
}

#[test]
fn a_missing_log_beside_the_store_is_damage() {
    let sb = small_store();
    std::fs::remove_file(log_file(&sb)).unwrap();
    assert_refused(
        &sb,
        &format!(
            "tetherd: error: the store is damaged: {}: the log is missing while the store {} \
             exists",
            log_file(&sb).display(),
            store_file(&sb).display()
        ),
    );
}

#[test]
fn a_missing_store_file_beside_a_log_with_records_is_damage() {
    let sb = small_store();
    std::fs::remove_file(store_file(&sb)).unwrap();
    assert_refused(
        &sb,
        &format!(
            "tetherd: error: the store is damaged: {}: the store file is missing (or empty) \
             while the log {} holds records",
            store_file(&sb).display(),
            log_file(&sb).display()
        ),
    );
}

#[test]
fn a_store_file_with_damaged_pages_is_refused() {
    let sb = small_store();
    let store = store_file(&sb);
    let len = std::fs::metadata(&store).unwrap().len();
    for at in (0..len).step_by(64 * 1024) {
        damage::flip_byte(&store, at);
    }
    assert_refused(&sb, &corrupt(&store));
}

#[test]
fn a_store_file_cut_short_is_refused() {
    let sb = small_store();
    let store = store_file(&sb);
    assert!(std::fs::metadata(&store).unwrap().len() > 100_000);
    damage::truncate(&store, 100_000);
    assert_refused(&sb, &corrupt(&store));
}

#[test]
fn check_reports_a_stream_whose_seqs_do_not_follow() {
    // Three publishes, three chunks: seqs 1 to 3, 4, and 5 to 6.
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    for part in [1..=3, 4..=4, 5..=6] {
        sb.publish(STREAM, &lines(part));
    }
    raw::assert_stored(&sb.socket(), STREAM, 6);
    assert!(d.terminate().success());
    let store = store_file(&sb);
    tetherd::store::remove_chunk_for_tests(&store, STREAM, 4).unwrap();

    let before = StateSnapshot::take(&sb.state_dir());
    let checked = damage::check(&sb);
    checked.assert_code(65);
    assert_eq!(
        error_line(&checked),
        format!(
            "tetherd: error: the store is damaged: {}: stream \"{STREAM}\" goes from seq 3 to \
             seq 5; affected: stream \"{STREAM}\" seqs 4..=4. Nothing was changed",
            store.display()
        )
    );
    assert_eq!(checked.stdout, "", "tetherd check printed a summary");
    before.assert_unchanged("tetherd check");
}

/// How long the last commits of the torn-tail test may take: under this,
/// the daemon cannot have committed them durably (it does so for an idle
/// store 1 s after its first commit that is in the log only).
const NOT_DURABLE_WITHIN: Duration = Duration::from_millis(800);

/// Commits `earlier` lines, one `tether publish` each, waits until the
/// store committed them durably, then commits `last` more one at a time
/// and crashes the daemon at once: the log holds those last commits only. `None` when
/// they took too long to be sure of that.
fn crash_after_commits_not_yet_durable(earlier: u64, last: u64) -> Option<Sandbox> {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    for n in 1..=earlier {
        sb.publish(STREAM, &line(n));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let started = Instant::now();
    for n in earlier + 1..=earlier + last {
        sb.publish(STREAM, &line(n));
    }
    d.kill9();
    (started.elapsed() < NOT_DURABLE_WITHIN).then_some(sb)
}

#[test]
fn a_torn_tail_after_a_crash_is_dropped_and_every_commit_before_it_kept() {
    const EARLIER: u64 = 20;
    const LAST: u64 = 3;
    let sb = (0..3)
        .find_map(|_| crash_after_commits_not_yet_durable(EARLIER, LAST))
        .expect("three publishes took over 800 ms three times: too slow to test a torn tail");
    let all = EARLIER + LAST;
    let kept = all - 1;
    let log = log_file(&sb);
    let records = log_records(&sb, 2);
    let torn = records.last().unwrap().clone();
    let before_it = &records[records.len() - 2];
    assert_eq!(
        damage::line_numbers(&damage::body(&log, &torn)),
        (all, all),
        "the last record should be the last commit"
    );
    assert_eq!(
        damage::line_numbers(&damage::body(&log, before_it)),
        (kept, kept)
    );
    // What a crash in the middle of writing it over the log's zeros
    // leaves: its second half never reached the disk.
    damage::zero(&log, torn.body_offset() + torn.body_len / 2, torn.end());

    let before = StateSnapshot::take(&sb.state_dir());
    let checked = damage::check(&sb);
    before.assert_unchanged("tetherd check");
    let bytes: u64 = (1..=kept).map(payload_len).sum();
    let summary = format!("ok: 1 streams, {kept} frames, {bytes} bytes\n");

    let mut d = sb.start_daemon();
    assert!(
        d.logs()
            .contains("was cut short by a crash before it was synced"),
        "the start should say it dropped a torn tail:\n{}",
        d.logs()
    );
    raw::assert_stored(&sb.socket(), STREAM, kept);
    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=kept));
    // The stream goes on.
    sb.publish(STREAM, &line(all));
    raw::assert_stored(&sb.socket(), STREAM, all);
    assert!(d.terminate().success());
    let after = damage::check(&sb);
    after.assert_success();
    let bytes_all = bytes + payload_len(all);
    assert_eq!(
        after.stdout,
        format!("ok: 1 streams, {all} frames, {bytes_all} bytes\n")
    );

    // Checked before the start, with the crash's log not yet applied: a
    // torn tail is not damage, and the store holds every commit before
    // it, those the log alone held included.
    checked.assert_success();
    assert_eq!(
        checked.stdout, summary,
        "tetherd check on the crashed store should count what the daemon then served"
    );
}

#[test]
fn check_counts_the_frames_only_the_log_holds_after_a_crash() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=SMALL));
    // Within the second before an idle daemon commits its store durably.
    d.kill9();
    let before = StateSnapshot::take(&sb.state_dir());
    let out = damage::check(&sb);
    before.assert_unchanged("tetherd check");
    out.assert_success();
    let bytes: u64 = (1..=SMALL).map(payload_len).sum();
    assert_eq!(
        out.stdout,
        format!("ok: 1 streams, {SMALL} frames, {bytes} bytes\n")
    );
    d.restart();
    raw::assert_stored(&sb.socket(), STREAM, SMALL);
}

#[test]
fn check_sums_up_a_whole_store_from_its_files_or_from_the_daemon_running_on_them() {
    let sb = small_store();
    let bytes: u64 = (1..=SMALL).map(payload_len).sum();
    let summary = format!("ok: 1 streams, {SMALL} frames, {bytes} bytes\n");
    let before = StateSnapshot::take(&sb.state_dir());
    let out = damage::check(&sb);
    out.assert_success();
    assert_eq!(out.stdout, summary);
    before.assert_unchanged("tetherd check");

    // Beside a running daemon, check asks it to verify its store.
    let mut d = sb.start_daemon();
    let pid = d.pid();
    let out = damage::check(&sb);
    out.assert_success();
    assert_eq!(out.stdout, summary);
    assert_eq!(
        raw::status(&sb.socket()).unwrap().pid,
        pid,
        "the daemon should run on"
    );
    assert!(d.terminate().success());
}

#[test]
fn check_beside_a_running_daemon_reports_damage_it_finds() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=SMALL));
    let log = log_file(&sb);
    let records = log_records(&sb, 1);
    let record = records.last().unwrap();
    // The store reads the frames of this commit from the log (which
    // wraps): damage them under the running daemon.
    damage::flip_byte(&log, record.body_offset() + record.body_len / 2);
    let out = damage::check(&sb);
    out.assert_code(65);
    assert!(
        error_line(&out).contains(&log.display().to_string()),
        "tetherd check should name {}:\n{}",
        log.display(),
        out.stderr
    );
    assert_eq!(out.stdout, "", "tetherd check printed a summary");
    d.kill9();
}

#[test]
fn the_shipped_units_do_not_restart_a_damaged_store() {
    let systemd = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd");
    for unit in ["tetherd.service", "user/tetherd.service"] {
        let path = systemd.join(unit);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert!(
            text.lines()
                .any(|l| l.trim() == "RestartPreventExitStatus=65"),
            "{} should set RestartPreventExitStatus=65",
            path.display()
        );
    }
}
