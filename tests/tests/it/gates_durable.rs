//! A question outlives a daemon `kill -9`: the asking worker is `waiting`
//! before and after the crash, its `tether ask` rides the restart out
//! without asking twice, and the answer given afterwards reaches it; the
//! `ask` and `answer` frames on its stream say what happened.

use serde_json::{json, Value};
use tether_tests::supervise::Supervised;

use crate::gates_support::{
    answer, answer_payload, ask_payload, assert_answered, by_me, grid, json_frames, qid,
    questions_json, questions_table, row, row_all, run_worker, wait_open, ALL_HEADER, OPEN_HEADER,
    TIMEOUT,
};

/// Asks, then prints what it was told. The ask may take minutes to get
/// back to a crashed daemon: its own retry window is made long enough.
const DEPLOY: &str = r#"a=$("$TETHER" --connect-timeout 5m ask --choices yes,no Deploy?) || exit 9
echo "got $a""#;

#[test]
fn a_waiting_worker_survives_a_daemon_kill_and_gets_its_answer() {
    let mut sup = Supervised::start();
    let id = run_worker(&sup, DEPLOY);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    let info = sup.wait_state(&id, "waiting", TIMEOUT);
    assert_waiting(&sup, &id, q, &info);

    sup.daemon().kill9();
    sup.daemon().restart();
    // Straight after the restart, not eventually: the state is stored.
    let info = sup.info(&id);
    assert_eq!(info["state"], "waiting", "after the restart: {info}");
    assert_waiting(&sup, &id, q, &info);
    assert_eq!(
        questions_table(sup.sb(), &[]),
        grid(&OPEN_HEADER, &[row(&id, q, "yes,no", "Deploy?")]),
        "the question is still open after the restart"
    );

    assert_answered(&answer(sup.sb(), &id, None, &["yes"]), &id, q, "yes");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got yes"], "{}", sup.describe(&id));

    // One ask frame: the ask that reconnected after the crash did not ask
    // again. Then the answer, then the worker's output.
    assert_eq!(
        json_frames(&sup, &id, "ask"),
        [ask_payload(
            q,
            "Deploy?",
            &["yes", "no"],
            "Deploy?#0",
            None,
            None
        )],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(
        json_frames(&sup, &id, "answer"),
        [answer_payload(q, Some("yes"), by_me())],
        "{}",
        sup.describe(&id)
    );
    let kinds: Vec<String> = sup
        .frames(&id)
        .into_iter()
        // Lifecycle events, and anything the ask said on stderr while the
        // daemon was down, are not what this checks.
        .filter(|f| ["ask", "answer", "stdout"].contains(&f.kind.as_str()))
        .map(|f| f.kind)
        .collect();
    assert_eq!(kinds, ["ask", "answer", "stdout"], "{}", sup.describe(&id));

    // Plain `tail` prints them on stdout among the worker's lines.
    let tail = sup.sb().run(&["tail", &id]);
    tail.assert_success();
    let lines: Vec<&str> = tail.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "`tether tail {id}`:\n{}", tail.stdout);
    let parsed = |line: &str| -> Value {
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    };
    assert_eq!(
        parsed(lines[0]),
        ask_payload(q, "Deploy?", &["yes", "no"], "Deploy?#0", None, None)
    );
    assert_eq!(parsed(lines[1]), answer_payload(q, Some("yes"), by_me()));
    assert_eq!(lines[2], "got yes");

    assert_json_record(&sup, &id, q);
    assert_eq!(questions_table(sup.sb(), &[]), grid(&OPEN_HEADER, &[]));
    assert_eq!(
        questions_table(sup.sb(), &["--all"]),
        grid(&ALL_HEADER, &[row_all(&id, q, "yes,no", "Deploy?", "yes")])
    );
}

/// What `ps` shows of an execution waiting on question `q`: the state,
/// the question's text as the reason (`--json`) and in the table's row.
fn assert_waiting(sup: &Supervised, id: &str, q: u64, info: &serde_json::Value) {
    assert_eq!(info["state"], "waiting", "{info}");
    assert_eq!(info["reason"], "Deploy?", "{info}");
    assert_eq!(info["question"]["id"], q, "{info}");
    assert_eq!(info["question"]["text"], "Deploy?", "{info}");
    assert_eq!(
        info["question"]["choices"],
        serde_json::json!(["yes", "no"]),
        "{info}"
    );
    let out = sup.sb().run(&["ps"]);
    out.assert_success();
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("`tether ps` has no row for {id}:\n{}", out.stdout));
    assert!(
        line.contains(" waiting ") && line.contains("Deploy?"),
        "`tether ps` shows no waiting state and question for {id}:\n{}",
        out.stdout
    );
}

/// `questions --all --json` of the answered question: every field, the
/// seq that of its `ask` frame.
fn assert_json_record(sup: &Supervised, id: &str, q: u64) {
    let all = questions_json(sup.sb(), &["--all"]);
    assert_eq!(all.len(), 1, "{all:#?}");
    let record = &all[0];
    for field in [
        "id",
        "execution",
        "key",
        "text",
        "choices",
        "default",
        "asked_micros",
        "deadline_micros",
        "attempt",
        "seq",
        "answer",
        "answered_by",
        "answered_micros",
        "state",
    ] {
        assert!(record.get(field).is_some(), "no {field:?} in {record}");
    }
    let ask_seq = sup
        .frames(id)
        .into_iter()
        .find(|f| f.kind == "ask")
        .map(|f| f.seq);
    let want = [
        ("id", json!(q)),
        ("execution", json!(id)),
        ("key", json!("Deploy?#0")),
        ("text", json!("Deploy?")),
        ("choices", json!(["yes", "no"])),
        ("default", Value::Null),
        ("deadline_micros", Value::Null),
        ("attempt", json!(1)),
        ("seq", json!(ask_seq)),
        ("answer", json!("yes")),
        ("answered_by", by_me()),
        ("state", json!("answered")),
    ];
    for (field, value) in want {
        assert_eq!(record[field], value, "{field} in {record}");
    }
    let asked = record["asked_micros"].as_u64().unwrap_or(0);
    let answered = record["answered_micros"].as_u64().unwrap_or(0);
    assert!(0 < asked && asked <= answered, "{record}");
}
