//! Who may do what with questions and inboxes: a reader may list
//! questions but is refused `answer` and `send`; a member of `[access]
//! answerers` may answer (recorded under its uid and name) and list, but
//! not `send` or `ask`; a user in neither group may not even list. Each
//! refusal is `permission denied` and exit 1.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use tether_tests::remote::{
    answerer_user, test_users, TestUser, ANSWERER, ANSWERERS_GROUP, READERS_GROUP,
};
use tether_tests::supervise::Supervised;
use tether_tests::{cli, Daemon, Output, Sandbox};

use crate::gates_support::{
    answer_payload, assert_answered, grid, json_frames, qid, questions_table, row, row_all,
    run_worker, table_of, wait_open, ALL_HEADER, OPEN_HEADER, TIMEOUT,
};

const DEPLOY: &str = r#"a=$("$TETHER" ask --choices yes,no Deploy?) || exit 9
echo "got $a""#;

/// A daemon whose config names the readers and answerers groups, on a
/// socket every local user can reach, so that the daemon (not the file
/// mode) decides; and a worker waiting on "Deploy?".
fn open_daemon_with_a_question() -> (Supervised, String, u64) {
    let sb = Sandbox::new();
    let config = sb.file("tetherd.toml");
    std::fs::write(
        &config,
        format!("[access]\nreaders = \"{READERS_GROUP}\"\nanswerers = [\"{ANSWERERS_GROUP}\"]\n"),
    )
    .unwrap();
    let config = config.display().to_string();
    let daemon = Daemon::start_with_env(
        &sb.socket(),
        &sb.state_dir(),
        sb.path(),
        &[("TETHER_CONFIG", &config), ("TETHER_SOCKET_MODE", "666")],
    );
    // Other users must be able to reach the socket inside the sandbox.
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let sup = Supervised::with(sb, daemon);
    let id = run_worker(&sup, DEPLOY);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    (sup, id, q)
}

/// `tether ARGS...` run as `user`.
fn run_as(sb: &Sandbox, user: TestUser, args: &[&str]) -> Output {
    let mut cmd = sb.tether_with_timeout("5s", args);
    cmd.uid(user.uid).gid(user.gid).current_dir("/");
    cli::run(cmd, b"", Duration::from_secs(60))
}

/// Asserts exit 1, nothing on stdout, and `permission denied` on stderr.
fn assert_denied(out: &Output) {
    out.assert_code(1);
    assert_eq!(out.stdout, "", "`{}`", out.command);
    assert!(
        out.stderr.contains("permission denied"),
        "`{}`: {:?}",
        out.command,
        out.stderr
    );
}

#[test]
fn a_reader_may_list_questions_but_not_answer_or_send() {
    // Both groups must exist: the daemon checks the groups it is given.
    let (Some((reader, stranger)), Some(_)) = (test_users(), answerer_user()) else {
        return;
    };
    let (sup, id, q) = open_daemon_with_a_question();
    let sb = sup.sb();

    let open = grid(&OPEN_HEADER, &[row(&id, q, "yes,no", "Deploy?")]);
    assert_eq!(table_of(&run_as(sb, reader, &["questions"])), open);
    assert_eq!(
        table_of(&run_as(sb, reader, &["questions", "--all"])),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "")])
    );
    assert_denied(&run_as(sb, reader, &["answer", &id, "yes"]));
    assert_denied(&run_as(sb, reader, &["send", &id, "hello"]));
    assert_denied(&run_as(sb, stranger, &["questions"]));
    assert_denied(&run_as(sb, stranger, &["answer", &id, "yes"]));

    // Nothing they tried changed anything.
    assert_eq!(questions_table(sb, &[]), open);
    assert_eq!(sup.info(&id)["state"], "waiting");
    let empty = sb.run(&["recv", "--execution", &id, "--timeout", "1s"]);
    empty.assert_code(1);
}

#[test]
fn an_answerer_may_answer_and_list_but_not_send_or_ask() {
    let (Some(_), Some(answerer)) = (test_users(), answerer_user()) else {
        return;
    };
    let (sup, id, q) = open_daemon_with_a_question();
    let sb = sup.sb();

    assert_eq!(
        table_of(&run_as(sb, answerer, &["questions"])),
        grid(&OPEN_HEADER, &[row(&id, q, "yes,no", "Deploy?")])
    );
    assert_denied(&run_as(sb, answerer, &["send", &id, "hello"]));
    assert_denied(&run_as(
        sb,
        answerer,
        &["ask", "--execution", &id, "Another?"],
    ));

    assert_answered(
        &run_as(sb, answerer, &["answer", &id, "yes"]),
        &id,
        q,
        "yes",
    );
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got yes"]);
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(
            q,
            Some("yes"),
            serde_json::json!({"uid": answerer.uid, "user": ANSWERER})
        )]
    );
    assert_eq!(
        table_of(&run_as(sb, answerer, &["questions", "--all"])),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "yes")])
    );
}
