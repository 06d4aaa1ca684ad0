//! A waiting execution lives as a running one does: `stop` cancels it; a
//! worker killed while it waits follows the restart policy (failed under
//! `--restart never`); and an attempt started after such a death that asks
//! again finds the question still open and gets the answer given to it.

use tether_tests::supervise::{pid_of, Supervised};

use crate::gates_support::{
    answer, assert_answered, assert_output, grid, kill_attempt_1, qid, questions_table, row_all,
    run_worker, tether_env, wait_open, ALL_HEADER, TIMEOUT,
};

/// Asks, then prints what it was told with its attempt number.
const DEPLOY: &str = r#"a=$("$TETHER" ask --choices yes,no Deploy?) || exit 9
echo "attempt $TETHER_ATTEMPT got $a""#;

#[test]
fn stop_cancels_a_waiting_execution() {
    let sup = Supervised::start();
    let id = run_worker(&sup, DEPLOY);
    wait_open(&sup, &id, "Deploy?", &[]);
    sup.wait_state(&id, "waiting", TIMEOUT);
    assert_output(&sup.sb().run(&["stop", &id]), 0, "cancelled\n", "");
    assert_eq!(sup.info(&id)["state"], "cancelled");
}

#[test]
fn a_worker_killed_while_waiting_fails_under_restart_never() {
    let sup = Supervised::start();
    let id = run_worker(&sup, DEPLOY);
    wait_open(&sup, &id, "Deploy?", &[]);
    let info = sup.wait_state(&id, "waiting", TIMEOUT);
    kill_attempt_1(&id, pid_of(&info));
    let info = sup.wait_state(&id, "failed", TIMEOUT);
    assert_eq!(info["attempt"], 1, "{info}");
    assert_eq!(info["last_exit"]["signal"], 9, "{info}");
}

#[test]
fn the_next_attempt_after_a_killed_one_gets_the_answer_to_the_open_question() {
    let sup = Supervised::start();
    let env = tether_env();
    let id = sup.run_sh(&["--restart", "on-failure", "--env", &env], DEPLOY);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    let info = sup.wait_state(&id, "waiting", TIMEOUT);
    kill_attempt_1(&id, pid_of(&info));
    sup.wait_for(&id, "at attempt 2", TIMEOUT, |v| v["attempt"] == 2);

    // Whether attempt 2 has asked yet or not, the answer is the one it gets.
    assert_answered(&answer(sup.sb(), &id, None, &["yes"]), &id, q, "yes");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["attempt 2 got yes"],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "yes")]),
        "one question for one decision"
    );
}
