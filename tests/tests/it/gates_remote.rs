//! Questions and inboxes over `--host ssh://`: a person on another machine
//! lists the open questions, answers one (recorded as the ssh login's
//! user), and sends a message to a worker.

use std::process::Command;
use std::time::Duration;

use tether_tests::remote::Sshd;
use tether_tests::supervise::Supervised;
use tether_tests::{bins, cli, Output};

use crate::gates_support::{
    answer_payload, assert_answered, assert_output, grid, json_frames, qid, row, row_all,
    run_worker, table_of, wait_open, ALL_HEADER, OPEN_HEADER, TIMEOUT,
};

/// `tether --host URL ARGS...` through the test's sshd.
fn remote(sshd: &Sshd, sup: &Supervised, args: &[&str]) -> Output {
    let mut cmd = Command::new(bins::tether());
    cmd.arg("--host")
        .arg(sshd.url(&sup.sb().socket()))
        .arg("--connect-timeout")
        .arg("20s")
        .args(args)
        .env("TETHER_SSH", sshd.ssh_command())
        .env_remove("TETHER_SOCKET")
        .env_remove("TETHER_HOST");
    cli::run(cmd, b"", Duration::from_secs(120))
}

#[test]
fn questions_answer_and_send_work_over_ssh() {
    let sup = Supervised::start();
    let Some(sshd) = Sshd::start(sup.sb().path()) else {
        return;
    };
    let id = run_worker(
        &sup,
        r#"a=$("$TETHER" ask --choices yes,no Deploy?) || exit 9; echo "got $a""#,
    );
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));

    assert_eq!(
        table_of(&remote(&sshd, &sup, &["questions"])),
        grid(&OPEN_HEADER, &[row(&id, q, "yes,no", "Deploy?")])
    );
    assert_answered(&remote(&sshd, &sup, &["answer", &id, "yes"]), &id, q, "yes");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got yes"]);
    // sshd logs the session in as root, and root answers on the remote end.
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(
            q,
            Some("yes"),
            serde_json::json!({"uid": 0, "user": "root"})
        )]
    );
    assert_eq!(
        table_of(&remote(&sshd, &sup, &["questions", "--all"])),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "yes")])
    );

    let listener = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&listener, TIMEOUT);
    assert_output(
        &remote(&sshd, &sup, &["send", &listener, "hello", "from", "afar"]),
        0,
        "",
        "",
    );
    assert_output(
        &sup.sb().run(&["recv", "--execution", &listener]),
        0,
        "hello from afar\n",
        "",
    );
}
