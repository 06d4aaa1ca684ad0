//! Questions with a timeout: the daemon closes them at their deadline,
//! with the default as the answer (`ask` prints it, exit 0) or with none
//! (`ask` exits 1 saying so), records who closed them (`timeout`), and
//! closes one whose deadline passed while it was down as soon as it is
//! back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tether_tests::supervise::{payloads, Supervised};

use crate::gates_support::{
    answer_payload, ask_payload, grid, json_frames, qid, questions_of, questions_table, row_all,
    run_worker, wait_open, ALL_HEADER, TIMEOUT,
};

#[test]
fn a_timeout_with_a_default_prints_the_default_and_records_it() {
    let sup = Supervised::start();
    let id = run_worker(
        &sup,
        r#"a=$("$TETHER" ask --choices yes,no --timeout 1s --default no Deploy?); rc=$?
echo "got $a exit $rc""#,
    );
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["got no exit 0"],
        "{}",
        sup.describe(&id)
    );

    let all = questions_of(sup.sb(), &id);
    assert_eq!(all.len(), 1, "{all:#?}");
    let q = &all[0];
    let id_q = qid(q);
    assert_eq!(q["answer"], "no", "{q}");
    assert_eq!(q["answered_by"], "timeout", "{q}");
    assert_eq!(q["default"], "no", "{q}");
    assert_closed_at_its_deadline(q, 1_000);
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(
            &ALL_HEADER,
            &[row_all(&id, id_q, "yes,no", "Deploy?", "no")]
        )
    );
    assert_eq!(
        json_frames(&sup, &id, "ask"),
        [ask_payload(
            id_q,
            "Deploy?",
            &["yes", "no"],
            "Deploy?#0",
            Some("no"),
            Some(1_000)
        )]
    );
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(id_q, Some("no"), json!("timeout"))]
    );
}

#[test]
fn a_timeout_without_a_default_exits_1_with_the_message() {
    let sup = Supervised::start();
    let id = run_worker(
        &sup,
        r#""$TETHER" ask --choices go,stop --timeout 1s Proceed?; echo "exit $?""#,
    );
    sup.wait_state(&id, "completed", TIMEOUT);
    let all = questions_of(sup.sb(), &id);
    assert_eq!(all.len(), 1, "{all:#?}");
    let q = &all[0];
    let id_q = qid(q);
    assert_eq!(sup.stdout_lines(&id), ["exit 1"], "{}", sup.describe(&id));
    assert_eq!(
        payloads(&sup.frames(&id), "stderr"),
        [format!("tether: question {id_q} timed out with no answer")],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(q["state"], "timed out", "{q}");
    assert_eq!(q["answer"], serde_json::Value::Null, "{q}");
    assert_eq!(q["answered_by"], "timeout", "{q}");
    assert_closed_at_its_deadline(q, 1_000);
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(
            &ALL_HEADER,
            &[row_all(&id, id_q, "go,stop", "Proceed?", "(timed out)")]
        )
    );
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(id_q, None, json!("timeout"))]
    );
}

#[test]
fn a_deadline_passed_while_the_daemon_was_down_is_applied_when_it_is_back() {
    let mut sup = Supervised::start();
    // The ask waits out the daemon's absence: its retry window is longer.
    let id = run_worker(
        &sup,
        r#"a=$("$TETHER" --connect-timeout 5m ask --timeout 8s --default later Deploy?) || exit 9
echo "got $a""#,
    );
    let q = wait_open(&sup, &id, "Deploy?", &[]);
    let deadline = q["deadline_micros"]
        .as_u64()
        .unwrap_or_else(|| panic!("no deadline_micros in {q}"));
    sup.daemon().kill9();
    // The crash must come before the deadline for this test to mean
    // anything; with 8 s to spare it does unless the machine stalls.
    assert!(
        now_micros() < deadline,
        "the daemon was killed only after the deadline had passed: {q}"
    );
    // Down until well past the deadline.
    while now_micros() < deadline + 1_000_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    sup.daemon().restart();

    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["got later"],
        "{}",
        sup.describe(&id)
    );
    let all = questions_of(sup.sb(), &id);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["answer"], "later", "{}", all[0]);
    assert_eq!(all[0]["answered_by"], "timeout", "{}", all[0]);
    assert_closed_at_its_deadline(&all[0], 8_000);
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(
            qid(&all[0]),
            Some("later"),
            json!("timeout")
        )]
    );
}

/// The question's deadline is its ask time plus `timeout_ms`, and it was
/// closed no earlier than that (give or take a millisecond: timers wake
/// on the millisecond, the record is in microseconds).
fn assert_closed_at_its_deadline(q: &serde_json::Value, timeout_ms: u64) {
    let field = |name: &str| {
        q[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no number {name:?} in {q}"))
    };
    let asked = field("asked_micros");
    let deadline = field("deadline_micros");
    assert_eq!(deadline, asked + timeout_ms * 1_000, "{q}");
    assert!(
        field("answered_micros") + 1_000 >= deadline,
        "closed before its deadline: {q}"
    );
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
