//! What a worker sees and what becomes of its output: its environment
//! (`TETHER_EXECUTION_ID`, `TETHER_SOCKET`, `--env`, `--cwd`), stdout and
//! stderr as frames of their own kinds, a line longer than the limit
//! split (never dropped) and a last line without a newline kept.

use std::time::Duration;

use tether_tests::supervise::{payloads, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn the_worker_sees_its_execution_id_socket_attempt_env_and_cwd() {
    let sup = Supervised::start();
    let dir = sup.sb().path().to_str().unwrap().to_owned();
    let id = sup.run_sh(
        &["--env", "GREETING=hello there"],
        "echo \"id=$TETHER_EXECUTION_ID\"; echo \"socket=$TETHER_SOCKET\"; \
         echo \"resumed=${TETHER_RESUMED:-unset}\"; echo \"attempt=$TETHER_ATTEMPT\"; \
         echo \"greeting=$GREETING\"; \
         echo \"cwd=$(pwd)\"; echo oops >&2",
    );
    sup.wait_state(&id, "completed", TIMEOUT);

    let frames = sup.frames(&id);
    let socket = sup.sb().socket();
    assert_eq!(
        payloads(&frames, "stdout"),
        [
            format!("id={id}"),
            format!("socket={}", socket.display()),
            "resumed=unset".to_owned(),
            "attempt=1".to_owned(),
            "greeting=hello there".to_owned(),
            format!("cwd={dir}"),
        ]
    );
    assert_eq!(payloads(&frames, "stderr"), ["oops"]);
}

#[test]
fn a_long_line_is_split_and_a_last_partial_line_is_kept() {
    const LONG: usize = 200_000;
    let sup = Supervised::start();
    // One 200,000-byte line (over the 64 KiB line limit), then a short line
    // without its newline.
    let script =
        format!("head -c {LONG} /dev/zero | tr '\\0' x; echo; printf tail-without-newline");
    let id = sup.run(&["--", "sh", "-c", &script]);
    sup.wait_state(&id, "completed", TIMEOUT);

    let stdout = payloads(&sup.frames(&id), "stdout");
    let (last, pieces) = stdout.split_last().unwrap();
    assert_eq!(last, "tail-without-newline");
    assert!(
        pieces.len() >= 2,
        "a {LONG}-byte line should come as several frames, got {}",
        pieces.len()
    );
    let joined = pieces.concat();
    assert_eq!(
        joined.len(),
        LONG,
        "bytes of the long line were lost or added"
    );
    assert!(joined.bytes().all(|b| b == b'x'));
}
