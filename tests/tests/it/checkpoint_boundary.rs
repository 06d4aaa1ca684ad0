//! The exact resume boundary: a checkpoint's seq is at least the seq of
//! every line its worker wrote before saving it, even when the worker
//! prints thousands of lines just before the save, so `tail --from-seq
//! SEQ+1` shows exactly what came after.
//!
//! Guards against the shim forwarding output independently of the save:
//! lines still in the pipe, or in the shim's window, got seqs above the
//! checkpoint's.

use std::time::Duration;

use serde_json::Value;
use tether_tests::bins;
use tether_tests::supervise::{payloads, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);
const ROUNDS: u32 = 2;

#[test]
fn a_checkpoint_saved_after_a_burst_of_output_has_a_seq_above_all_of_it() {
    let sup = Supervised::start();
    let env = format!("TETHER={}", bins::tether().display());
    // The worker first waits until its shim's output reaches the stream,
    // so that the shim is attached. Then each round: it stops its shim
    // (its parent), prints 3,000 lines (which the pipe holds), saves a
    // checkpoint and prints one more line. The shim goes on only a moment
    // after the save was sent, so without the flush every line would land
    // above the checkpoint.
    let script = format!(
        "echo ready; \
         until \"$TETHER\" tail \"$TETHER_EXECUTION_ID\" | grep -qx ready; do sleep 0.05; done; \
         for r in $(seq 1 {ROUNDS}); do kill -STOP $PPID; seq -f \"before $r %g\" 1 3000; \
         (sleep 0.3; kill -CONT $PPID) & \
         printf \"$r\" | \"$TETHER\" checkpoint save --meta round=$r; wait; \
         echo \"after $r\"; done"
    );
    let id = sup.run_sh(&["--restart", "never", "--env", &env], &script);
    sup.wait_state(&id, "completed", TIMEOUT);

    let out = sup.sb().run(&["checkpoint", "list", "--json", &id]);
    out.assert_success();
    let list: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(list.len(), ROUNDS as usize, "{list:?}");
    for checkpoint in &list {
        let round = checkpoint["meta"]["round"]
            .as_str()
            .unwrap_or_else(|| panic!("no round in {checkpoint}"))
            .to_owned();
        let seq = checkpoint["seq"].as_u64().unwrap();
        let from = (seq + 1).to_string();
        let out = sup.sb().run(&["tail", "--json", &id, "--from-seq", &from]);
        out.assert_success();
        let frames: Vec<_> = out
            .stdout
            .lines()
            .map(tether_tests::supervise::parse_frame)
            .collect();
        let stdout = payloads(&frames, "stdout");
        let first_after = stdout.first().map(String::as_str);
        assert_eq!(
            first_after,
            Some(format!("after {round}").as_str()),
            "checkpoint {checkpoint}: the first line after seq {seq} is not the one \
             printed after the save"
        );
        let before = format!("before {round} ");
        assert!(
            !stdout.iter().any(|l| l.starts_with(&before)),
            "checkpoint {checkpoint}: lines printed before the save come after seq {seq}"
        );
    }
}
