//! `tether status` counts every file of the store in its size: redb's file
//! and the write-ahead log (`tether.wal`).

use std::time::Duration;

use tether_tests::wait::wait_until;
use tether_tests::Sandbox;

fn file_len(sb: &Sandbox, name: &str) -> u64 {
    std::fs::metadata(sb.state_dir().join(name)).unwrap().len()
}

#[test]
fn status_counts_the_log_in_the_store_size() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish("s", "one\ntwo\n");
    // The files may grow between reads; compare when they held still.
    wait_until(
        Duration::from_secs(60),
        "a size read between equal sizes",
        || {
            let before = file_len(&sb, "tether.redb") + file_len(&sb, "tether.wal");
            let out = sb.run(&["status", "--json"]);
            out.assert_success();
            let status: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
            let after = file_len(&sb, "tether.redb") + file_len(&sb, "tether.wal");
            before == after && status["store_bytes"].as_u64() == Some(after)
        },
    );
    assert!(file_len(&sb, "tether.wal") > 0);
}
