//! Nothing kept forever: `tether rm` removes an ended execution with its
//! stream, checkpoints, steps and manifest (a live one only with
//! `--force`); `tether prune --older-than` and `[executions] keep_ended`
//! remove old ended ones; `tether streams rm` removes streams. A removed
//! stream leaves a tombstone: made again, it continues above its last seq,
//! across `kill -9` and `tetherd repair`. A removal cut by `kill -9` leaves
//! all or nothing, and the space it frees is used again.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_tests::cli::Output;
use tether_tests::damage;
use tether_tests::sandbox::Sandbox;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

fn assert_output(out: &Output, code: i32, stdout: &str) {
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(code), stdout),
        "{}\nstderr: {}",
        out.command,
        out.stderr
    );
}

/// An execution that ended (`true`, never restarted).
fn ended(sup: &Supervised) -> String {
    let id = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&id, "completed", TIMEOUT);
    id
}

/// The seqs `tether tail --json STREAM` prints.
fn seqs(sb: &Sandbox, stream: &str) -> Vec<u64> {
    let out = sb.run(&["tail", "--json", stream]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            row["seq"].as_u64().unwrap()
        })
        .collect()
}

/// The ids `tether ps --all --json` lists.
fn listed(sb: &Sandbox) -> Vec<String> {
    let out = sb.run(&["ps", "--all", "--json"]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            row["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn rm_removes_an_ended_execution_with_everything_it_kept() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&id, TIMEOUT);
    sb.run_with_stdin(&["checkpoint", "save", "--execution", &id], b"state")
        .assert_success();
    sb.run_with_stdin(&["step", "put", "fetch", "--execution", &id], b"42")
        .assert_success();

    let live = sb.run(&["rm", &id]);
    assert_output(&live, 1, "");
    assert!(live.stderr.contains("has not ended"), "{}", live.stderr);
    assert_eq!(
        listed(sb),
        std::slice::from_ref(&id),
        "a refused rm removes nothing"
    );

    assert_output(&sb.run(&["rm", "--force", &id]), 0, &format!("{id}\n"));
    for args in [
        vec!["tail", id.as_str()],
        vec!["checkpoint", "list", id.as_str()],
        vec!["checkpoint", "load", "--execution", id.as_str()],
        vec!["step", "list", id.as_str()],
        vec!["stop", id.as_str()],
        vec!["rm", id.as_str()],
    ] {
        assert_output(&sb.run(&args), 3, "");
    }
    assert!(listed(sb).is_empty());
    let streams = sb.run(&["streams"]);
    assert!(!streams.stdout.contains(&id), "{}", streams.stdout);
}

#[test]
fn prune_removes_executions_that_ended_longer_ago_than_asked() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let old = ended(&sup);
    assert_output(&sb.run(&["prune", "--older-than", "1h"]), 0, "");
    assert_eq!(listed(sb), std::slice::from_ref(&old));
    let live = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&live, TIMEOUT);
    assert_output(
        &sb.run(&["prune", "--older-than", "0s"]),
        0,
        &format!("{old}\n"),
    );
    assert_eq!(listed(sb), [live], "a live execution is never pruned");
    assert_output(&sb.run(&["tail", &old]), 3, "");
}

#[test]
fn prune_keeps_the_children_of_a_live_parent() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let parent = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&parent, TIMEOUT);
    let child = sup.run(&["--restart", "never", "--parent", &parent, "--", "true"]);
    sup.wait_state(&child, "completed", TIMEOUT);
    assert_output(&sb.run(&["prune", "--older-than", "0s"]), 0, "");
    assert_output(&sb.run(&["stop", &parent]), 0, "cancelled\n");
    let mut both = [child, parent];
    both.sort();
    assert_output(
        &sb.run(&["prune", "--older-than", "0s"]),
        0,
        &format!("{}\n{}\n", both[0], both[1]),
    );
}

#[test]
fn keep_ended_removes_ended_executions_by_itself() {
    let sb = Sandbox::new();
    let config = sb.file("tetherd.toml");
    std::fs::write(&config, "[executions]\nkeep_ended = \"2s\"\n").unwrap();
    let config = config.display().to_string();
    let daemon = sb.start_daemon_with_env(&[("TETHER_CONFIG", config.as_str())]);
    let mut sup = Supervised::with(sb, daemon);
    let id = ended(&sup);
    let deadline = Instant::now() + TIMEOUT;
    while listed(sup.sb()).contains(&id) {
        assert!(Instant::now() < deadline, "{id} was never removed");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_output(&sup.sb().run(&["tail", &id]), 3, "");
    let logs = sup.daemon().logs();
    assert!(
        logs.contains("removed execution and its stream") && logs.contains(&id),
        "{logs}"
    );
}

#[test]
fn streams_rm_removes_streams_but_not_a_live_executions() {
    let sup = Supervised::start();
    let sb = sup.sb();
    sb.publish("logs", "a\nb\n");
    assert_output(&sb.run(&["streams", "rm", "logs"]), 0, "logs\n");
    assert_output(&sb.run(&["tail", "logs"]), 3, "");
    assert_output(&sb.run(&["streams", "rm", "logs"]), 3, "");
    let live = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&live, TIMEOUT);
    let refused = sb.run(&["streams", "rm", &live]);
    assert_output(&refused, 1, "");
    assert!(
        refused.stderr.contains("has not ended"),
        "{}",
        refused.stderr
    );
    assert!(!seqs(sb, &live).is_empty(), "the refused stream is kept");
}

#[test]
fn a_stream_made_again_continues_above_its_tombstone_across_kill_9_and_repair() {
    let mut sup = Supervised::start();
    sup.sb().publish("s", "1\n2\n3\n");
    assert_output(&sup.sb().run(&["streams", "rm", "s"]), 0, "s\n");
    sup.sb().publish("s", "4\n");
    assert_eq!(seqs(sup.sb(), "s"), [4]);

    assert_output(&sup.sb().run(&["streams", "rm", "s"]), 0, "s\n");
    sup.daemon().kill9();
    sup.daemon().restart();
    sup.sb().publish("s", "5\n");
    assert_eq!(seqs(sup.sb(), "s"), [5], "after kill -9");

    assert_output(&sup.sb().run(&["streams", "rm", "s"]), 0, "s\n");
    sup.daemon().terminate();
    let checked = damage::check(sup.sb());
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    let repaired = damage::repair(sup.sb());
    assert_eq!(repaired.code, Some(0), "{}", repaired.stderr);
    sup.daemon().restart();
    sup.sb().publish("s", "6\n");
    assert_eq!(seqs(sup.sb(), "s"), [6], "after tetherd repair");
}

#[test]
fn an_execution_stream_made_again_continues_above_its_tombstone() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = ended(&sup);
    let before = seqs(sb, &id);
    let last = *before.last().unwrap();
    assert_output(&sb.run(&["rm", &id]), 0, &format!("{id}\n"));
    sb.publish(&id, "again\n");
    assert_eq!(seqs(sb, &id), [last + 1]);
}

#[test]
fn a_kill_9_during_rm_leaves_all_or_nothing() {
    let mut sup = Supervised::start();
    let ids: Vec<String> = (0..20).map(|_| ended(&sup)).collect();
    for id in &ids {
        sup.sb().publish(id, &"line of output\n".repeat(2000));
    }
    let mut args = vec!["rm"];
    args.extend(ids.iter().map(String::as_str));
    let before: Vec<usize> = ids.iter().map(|id| seqs(sup.sb(), id).len()).collect();
    let mut rm = sup.sb().spawn("rm", &args);
    // Killed once the daemon has the request: the removal is one commit,
    // and wherever this lands, during or after it, the store holds all of
    // them or none.
    let deadline = Instant::now() + TIMEOUT;
    while !sup.daemon().logs().contains("request=\"Remove\"") {
        assert!(Instant::now() < deadline, "the daemon never got the rm");
        std::thread::sleep(Duration::from_millis(5));
    }
    sup.daemon().kill9();
    rm.wait(TIMEOUT);
    sup.daemon().restart();
    let left = listed(sup.sb());
    let streams = sup.sb().run(&["streams"]).stdout;
    if left.is_empty() {
        for id in &ids {
            assert!(!streams.contains(id.as_str()), "{id}'s stream is left");
        }
    } else {
        let mut left = left;
        left.sort();
        let mut all = ids.clone();
        all.sort();
        assert_eq!(left, all, "some executions were removed, some not");
        for (id, frames) in ids.iter().zip(before) {
            assert_eq!(seqs(sup.sb(), id).len(), frames, "{id}'s stream");
        }
    }
}

/// The bytes of the store's files.
fn store_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap())
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum()
}

#[test]
fn space_freed_by_rm_is_used_again() {
    let sb = Sandbox::new();
    // A small log, so that the frames are copied into the store's file.
    let daemon = sb.start_daemon_with_env(&[("TETHER_LOG_CAPACITY", "1048576")]);
    let sup = Supervised::with(sb, daemon);
    let sb = sup.sb();
    let payload = format!("{}\n", "x".repeat(1000)).repeat(4000);
    let mut sizes = Vec::new();
    for _ in 0..8 {
        sb.publish("bulk", &payload);
        assert_output(&sb.run(&["streams", "rm", "bulk"]), 0, "bulk\n");
        sizes.push(store_bytes(&sb.state_dir()));
    }
    // Eight rounds wrote eight times the first one's bytes; with the space
    // of each removal used again, the files never hold much more than
    // after the first. redb frees pages a commit or two later and keeps
    // room reserved ahead, so a round may find the last one's pages not
    // yet free: the bound allows two rounds' worth, a quarter of what
    // eight rounds would take without reuse.
    let most = sizes.iter().copied().max().unwrap();
    assert!(
        most <= sizes[0] + 2 * payload.len() as u64,
        "the store grew while writing the same again: {sizes:?}"
    );
}
