//! Checkpoints are durable before `checkpoint save` exits 0: ten saves,
//! with the daemon `kill -9`'d and restarted after each one, all load after
//! the restart that follows them, and retention keeps the newest N.

use std::time::Duration;

use tether_tests::supervise::Supervised;
use tether_tests::Sandbox;

use crate::checkpoint_support::{list, load, save, FlaggedDaemon};

const KEEP: usize = 5;
const SAVES: u64 = 10;

#[test]
fn every_acknowledged_checkpoint_survives_kill_9_and_the_newest_n_are_kept() {
    let sb = Sandbox::new();
    let keep = KEEP.to_string();
    let mut daemon = FlaggedDaemon::start(&sb, &["--checkpoint-keep", &keep]);
    // A worker that ends at once: its execution stays known, and nothing
    // is left running to clean up.
    let out = sb.run(&["run", "--json", "--restart", "never", "--", "true"]);
    out.assert_success();
    let run: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let id = run["id"].as_str().unwrap().to_owned();

    for n in 1..=SAVES {
        let data = format!("checkpoint {n}");
        let saved = save(&sb, &id, &data);
        daemon.kill9();
        daemon.restart();
        assert_eq!(
            load(&sb, &id),
            (Some(0), data),
            "checkpoint {n} (acknowledged as {saved}) did not survive kill -9"
        );
        let kept = list(&sb, &id);
        let expected = usize::try_from(n).unwrap().min(KEEP);
        assert_eq!(kept.len(), expected, "after save {n}: {kept:?}");
    }

    let kept = list(&sb, &id);
    let ids: Vec<u64> = kept.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    let newest = ids[0];
    assert_eq!(
        ids,
        (newest - 4..=newest).rev().collect::<Vec<_>>(),
        "the newest {KEEP}, newest first"
    );
    assert!(kept.iter().all(|c| c["valid"] == true), "{kept:?}");
    let seqs: Vec<u64> = kept.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] >= w[1]), "seqs {seqs:?}");
}

#[test]
fn ps_shows_the_newest_checkpoint() {
    let sup = Supervised::start();
    let id = sup.run(&["--restart", "never", "--", "sh", "-c", "echo one; echo two"]);
    sup.wait_state(&id, "completed", Duration::from_secs(60));
    assert!(sup.info(&id)["last_checkpoint"].is_null());
    let saved = save(sup.sb(), &id, "state");
    let info = sup.info(&id);
    assert_eq!(info["last_checkpoint"]["seq"], saved["seq"]);
    assert_eq!(
        saved["seq"], info["stream_last_seq"],
        "a checkpoint's seq is the stream's last seq when it was saved"
    );
}
