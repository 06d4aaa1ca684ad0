//! A human is never asked twice for one decision: a restarted attempt that
//! asks the same text again gets the recorded answer at once (one
//! question, no new open one), the same text asked twice in one attempt is
//! two questions (`TEXT#0`, `TEXT#1`, counted durably across a daemon
//! `kill -9`), and `--key` names the decision outright.

use tether_tests::supervise::Supervised;

use crate::gates_support::{
    answer, answer_payload, ask_payload, assert_answered, by_me, grid, json_frames, qid,
    questions_of, questions_table, row_all, tether_env, wait_open, ALL_HEADER, TIMEOUT,
};

/// Asks, prints the answer with the attempt number, and fails on the
/// first attempt.
const ASK_THEN_FAIL: &str = r#"a=$("$TETHER" ask --choices yes,no Deploy?) || exit 9
echo "attempt $TETHER_ATTEMPT got $a"
[ "$TETHER_ATTEMPT" = 1 ] && exit 1
exit 0"#;

/// `run --restart on-failure` of `script` with `$TETHER` set.
fn run_restarting(sup: &Supervised, script: &str) -> String {
    let env = tether_env();
    sup.run_sh(&["--restart", "on-failure", "--env", &env], script)
}

/// The keys of the execution's questions, in id order.
fn keys(sup: &Supervised, id: &str) -> Vec<String> {
    questions_of(sup.sb(), id)
        .iter()
        .map(|q| q["key"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn a_restarted_attempt_asking_again_gets_the_recorded_answer_at_once() {
    let sup = Supervised::start();
    let id = run_restarting(&sup, ASK_THEN_FAIL);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    assert_answered(&answer(sup.sb(), &id, None, &["yes"]), &id, q, "yes");

    // Nobody answers again: attempt 2 can only complete if its ask is
    // answered from the record.
    let info = sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(info["attempt"], 2, "{info}");
    assert_eq!(
        sup.stdout_lines(&id),
        ["attempt 1 got yes", "attempt 2 got yes"],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "yes")]),
        "one question for one decision"
    );
    let all = questions_of(sup.sb(), &id);
    assert_eq!(all[0]["attempt"], 1, "{}", all[0]);
    assert_eq!(all[0]["key"], "Deploy?#0", "{}", all[0]);
    assert_eq!(
        json_frames(&sup, &id, "ask"),
        [ask_payload(
            q,
            "Deploy?",
            &["yes", "no"],
            "Deploy?#0",
            None,
            None
        )]
    );
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(q, Some("yes"), by_me())]
    );
}

/// Asks "Continue?" twice, with a pause between the two until the test
/// creates `go-N` (N the attempt); fails after the first attempt.
const CONTINUE_TWICE: &str = r#"a=$("$TETHER" --connect-timeout 5m ask --choices yes,no Continue?) || exit 9
echo "attempt $TETHER_ATTEMPT first $a"
while [ ! -f "go-$TETHER_ATTEMPT" ]; do sleep 0.1; done
b=$("$TETHER" --connect-timeout 5m ask --choices yes,no Continue?) || exit 9
echo "attempt $TETHER_ATTEMPT second $b"
[ "$TETHER_ATTEMPT" = 1 ] && exit 1
exit 0"#;

#[test]
fn the_same_text_twice_in_one_attempt_is_two_questions_counted_durably() {
    let mut sup = Supervised::start();
    let id = run_restarting(&sup, CONTINUE_TWICE);
    let q1 = qid(&wait_open(&sup, &id, "Continue?", &[]));
    assert_answered(&answer(sup.sb(), &id, None, &["yes"]), &id, q1, "yes");
    sup.wait_line(&id, "attempt 1 first yes", TIMEOUT);

    // The count of asks of this text in this attempt is stored: after a
    // crash the next ask is still the second.
    sup.daemon().kill9();
    sup.daemon().restart();
    std::fs::write(sup.sb().file("go-1"), "").unwrap();
    let q2 = wait_open(&sup, &id, "Continue?", &[q1]);
    assert_eq!(q2["key"], "Continue?#1", "{q2}");
    let q2 = qid(&q2);
    assert_answered(&answer(sup.sb(), &id, None, &["no"]), &id, q2, "no");

    // Attempt 2 asks both again and gets both answers from the record.
    sup.wait_line(&id, "attempt 2 first yes", TIMEOUT);
    std::fs::write(sup.sb().file("go-2"), "").unwrap();
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        [
            "attempt 1 first yes",
            "attempt 1 second no",
            "attempt 2 first yes",
            "attempt 2 second no"
        ],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(keys(&sup, &id), ["Continue?#0", "Continue?#1"]);
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(
            &ALL_HEADER,
            &[
                row_all(&id, q1, "yes,no", "Continue?", "yes"),
                row_all(&id, q2, "yes,no", "Continue?", "no"),
            ]
        )
    );
    assert_eq!(
        json_frames(&sup, &id, "ask").len(),
        2,
        "{}",
        sup.describe(&id)
    );
}

/// Two decisions with the same text told apart by `--key`, then the first
/// key asked again under other words.
const KEYED: &str = r#"a=$("$TETHER" ask --key deploy-v1 --choices yes,no Deploy?) || exit 9
b=$("$TETHER" ask --key deploy-v2 --choices yes,no Deploy?) || exit 9
c=$("$TETHER" ask --key deploy-v1 --choices yes,no Deploy v1 now?) || exit 9
echo "v1 $a v2 $b again $c""#;

#[test]
fn an_explicit_key_names_the_decision() {
    let sup = Supervised::start();
    let env = tether_env();
    let id = sup.run_sh(&["--restart", "never", "--env", &env], KEYED);
    let q1 = wait_open(&sup, &id, "Deploy?", &[]);
    assert_eq!(q1["key"], "deploy-v1", "{q1}");
    let q1 = qid(&q1);
    assert_answered(&answer(sup.sb(), &id, None, &["yes"]), &id, q1, "yes");
    let q2 = wait_open(&sup, &id, "Deploy?", &[q1]);
    assert_eq!(q2["key"], "deploy-v2", "{q2}");
    let q2 = qid(&q2);
    assert_answered(&answer(sup.sb(), &id, None, &["no"]), &id, q2, "no");

    // The third ask reuses key deploy-v1: answered from the record.
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["v1 yes v2 no again yes"]);
    assert_eq!(keys(&sup, &id), ["deploy-v1", "deploy-v2"]);
}
