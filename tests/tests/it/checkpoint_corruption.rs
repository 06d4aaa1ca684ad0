//! A checkpoint whose checksum fails is skipped in favour of the previous
//! valid one (and listed as invalid); with none valid, `checkpoint load`
//! exits 3 and the next attempt starts fresh, saying so in its stream.

use std::time::Duration;

use tether_tests::supervise::{assert_event_order, pid_of, Supervised};

use crate::checkpoint_support::{list, load, save, store_file};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Damages checkpoint `cp` of `id` while the daemon is down.
fn corrupt(sup: &mut Supervised, id: &str, checkpoints: &[u64]) {
    sup.daemon().kill9();
    for cp in checkpoints {
        tetherd::store::corrupt_checkpoint_for_tests(&store_file(sup.sb()), id, *cp)
            .unwrap_or_else(|e| panic!("cannot corrupt checkpoint {cp} of {id}: {e}"));
    }
    sup.daemon().restart();
}

/// Kills the running worker and waits for the next attempt to run.
fn crash_worker(sup: &Supervised, id: &str) {
    let before = sup.info(id);
    let attempt = before["attempt"].as_u64().unwrap();
    tether_tests::procs::kill9(pid_of(&before)).unwrap();
    sup.wait_for(id, "running its next attempt", TIMEOUT, |v| {
        v["state"] == "running" && v["attempt"].as_u64() > Some(attempt) && v["pid"].is_u64()
    });
}

#[test]
fn a_corrupt_checkpoint_is_skipped_and_with_none_valid_the_worker_starts_fresh() {
    let mut sup = Supervised::start();
    let id = sup.run(&[
        "--restart",
        "on-failure",
        "--",
        "sh",
        "-c",
        "echo \"resumed=${TETHER_RESUMED:-0}\"; exec sleep 120",
    ]);
    sup.wait_running(&id, TIMEOUT);
    sup.wait_line(&id, "resumed=0", TIMEOUT);
    let ids: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|data| save(sup.sb(), &id, data)["id"].as_u64().unwrap())
        .collect();

    // The newest is damaged: the one before it is used.
    corrupt(&mut sup, &id, &ids[2..]);
    assert_eq!(load(sup.sb(), &id), (Some(0), "b".to_owned()));
    let listed = list(sup.sb(), &id);
    let valid: Vec<(u64, bool)> = listed
        .iter()
        .map(|c| (c["id"].as_u64().unwrap(), c["valid"] == true))
        .collect();
    assert_eq!(valid, [(ids[2], false), (ids[1], true), (ids[0], true)]);
    let b_seq = listed[1]["seq"].as_u64().unwrap();
    assert_eq!(sup.info(&id)["last_checkpoint"]["seq"], b_seq);

    crash_worker(&sup, &id);
    sup.wait_line(&id, "resumed=1", TIMEOUT);
    let frames = sup.frames(&id);
    let resumed = assert_event_order(
        &frames,
        &[&format!(
            "resumed from checkpoint {} (seq {b_seq});",
            ids[1]
        )],
    );
    assert!(
        resumed[0]
            .payload
            .contains(&format!("frames {}..", b_seq + 1)),
        "{}",
        resumed[0].payload
    );

    // Now every checkpoint is damaged: nothing loads, and the next attempt
    // starts fresh and says so.
    corrupt(&mut sup, &id, &ids[..2]);
    assert_eq!(load(sup.sb(), &id).0, Some(3));
    assert!(sup.info(&id)["last_checkpoint"].is_null());
    assert!(list(sup.sb(), &id).iter().all(|c| c["valid"] == false));
    crash_worker(&sup, &id);
    sup.wait_for(&id, "printing after the fresh start", TIMEOUT, |_| {
        sup.stdout_lines(&id).last().map(String::as_str) == Some("resumed=0")
    });
    let frames = sup.frames(&id);
    let fresh = assert_event_order(
        &frames,
        &[
            "resumed from checkpoint",
            "no valid checkpoint; starting fresh",
        ],
    );
    let stdout_after: Vec<&str> = frames
        .iter()
        .filter(|f| f.seq > fresh[1].seq && f.kind == "stdout")
        .map(|f| f.payload.as_str())
        .collect();
    assert_eq!(stdout_after, ["resumed=0"]);
}
