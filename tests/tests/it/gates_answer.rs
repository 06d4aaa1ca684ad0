//! `tether answer` and `tether questions`: the first answer wins and a
//! later one exits 1 naming it; an answer outside the choices exits 2;
//! without `--question` while two are open, exit 2 listing both; no open
//! question, or no such one, exits 3; `questions` and `questions --all`
//! print exactly the questions, their choices and answers, and `--follow`
//! each new one as it is asked; `rm` of an ended execution takes its
//! questions with it; and `ask`'s own usage errors exit 2.

use tether_tests::supervise::Supervised;
use tether_tests::wait::wait_until;

use crate::gates_support::{
    answer, assert_answered, assert_output, by_me, grid, me, qid, questions_json, questions_of,
    questions_table, row, row_all, run_worker, wait_open, AGE, ALL_HEADER, OPEN_HEADER, TIMEOUT,
};

/// Asks one yes/no question, prints the answer and ends.
const DEPLOY: &str = r#"a=$("$TETHER" ask --choices yes,no Deploy?) || exit 9
echo "got $a""#;

#[test]
fn a_second_answer_exits_1_naming_the_first() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = run_worker(&sup, DEPLOY);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    assert_answered(&answer(sb, &id, Some(q), &["yes"]), &id, q, "yes");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got yes"]);

    let (uid, name) = me();
    assert_output(
        &answer(sb, &id, Some(q), &["no"]),
        1,
        "",
        &format!(
            "tether: question {q} of {id} was already answered: \"yes\" by uid {uid} ({name}) \
             (already_answered)\n"
        ),
    );
    // No open question is left to answer, and there is no question 999.
    let none_open = answer(sb, &id, None, &["no"]);
    none_open.assert_code(3);
    assert_eq!(none_open.stdout, "");
    let no_such = answer(sb, &id, Some(q + 999), &["no"]);
    no_such.assert_code(3);
    assert_eq!(no_such.stdout, "");

    // The standing answer is the first.
    let all = questions_of(sb, &id);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["answer"], "yes", "{}", all[0]);
    assert_eq!(all[0]["answered_by"], by_me(), "{}", all[0]);
    assert_eq!(all[0]["state"], "answered", "{}", all[0]);
}

#[test]
fn an_answer_outside_the_choices_exits_2_and_leaves_the_question_open() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = run_worker(&sup, DEPLOY);
    let q = qid(&wait_open(&sup, &id, "Deploy?", &[]));

    let out = answer(sb, &id, None, &["maybe"]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.starts_with("tether: ")
            && out.stderr.contains("yes")
            && out.stderr.contains("no"),
        "the refusal lists the choices: {:?}",
        out.stderr
    );
    assert_eq!(
        questions_table(sb, &[]),
        grid(&OPEN_HEADER, &[row(&id, q, "yes,no", "Deploy?")])
    );
    assert_eq!(sup.info(&id)["state"], "waiting");

    assert_answered(&answer(sb, &id, None, &["no"]), &id, q, "no");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got no"]);
}

/// Asks "Deploy?" in the background, waits for the test to create `go`,
/// then asks "Region?" too: the two are open at once, in a known order.
const TWO_OPEN: &str = r#"
"$TETHER" ask --choices yes,no Deploy? > deploy.txt &
while [ ! -f go ]; do sleep 0.1; done
r=$("$TETHER" ask --choices eu,us Region?) || exit 9
wait $! || exit 8
echo "got $(cat deploy.txt) $r"
"#;

#[test]
fn two_open_questions_need_an_id_and_are_listed_exactly() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = run_worker(&sup, TWO_OPEN);
    let q1 = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    std::fs::write(sb.file("go"), "").unwrap();
    let q2 = qid(&wait_open(&sup, &id, "Region?", &[q1]));
    assert!(q2 > q1, "question ids rise: {q1} then {q2}");

    let out = answer(sb, &id, None, &["yes"]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
    for part in [
        q1.to_string(),
        q2.to_string(),
        "Deploy?".into(),
        "Region?".into(),
    ] {
        assert!(
            out.stderr.contains(&part),
            "the refusal lists both open questions; no {part:?} in {:?}",
            out.stderr
        );
    }

    assert_eq!(
        questions_table(sb, &[]),
        grid(
            &OPEN_HEADER,
            &[
                row(&id, q1, "yes,no", "Deploy?"),
                row(&id, q2, "eu,us", "Region?"),
            ]
        )
    );

    assert_answered(&answer(sb, &id, Some(q2), &["eu"]), &id, q2, "eu");
    // One open question is left: it needs no id.
    assert_eq!(
        questions_table(sb, &[]),
        grid(&OPEN_HEADER, &[row(&id, q1, "yes,no", "Deploy?")])
    );
    assert_eq!(
        questions_table(sb, &["--all"]),
        grid(
            &ALL_HEADER,
            &[
                row_all(&id, q1, "yes,no", "Deploy?", ""),
                row_all(&id, q2, "eu,us", "Region?", "eu"),
            ]
        )
    );
    assert_eq!(
        sup.info(&id)["state"],
        "waiting",
        "one question is still open"
    );

    assert_answered(&answer(sb, &id, None, &["yes"]), &id, q1, "yes");
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(
        sup.stdout_lines(&id),
        ["got yes eu"],
        "{}",
        sup.describe(&id)
    );
    assert_eq!(questions_table(sb, &[]), grid(&OPEN_HEADER, &[]));
    assert_eq!(
        questions_table(sb, &["--all"]),
        grid(
            &ALL_HEADER,
            &[
                row_all(&id, q1, "yes,no", "Deploy?", "yes"),
                row_all(&id, q2, "eu,us", "Region?", "eu"),
            ]
        )
    );

    let json = questions_of(sb, &id);
    let (ids, states): (Vec<u64>, Vec<&str>) = json
        .iter()
        .map(|q| (qid(q), q["state"].as_str().unwrap_or("?")))
        .unzip();
    assert_eq!((ids, states), (vec![q1, q2], vec!["answered", "answered"]));
}

/// The words of each line of `questions --follow` so far, ages set aside.
fn followed(follow: &tether_tests::Background) -> Vec<Vec<String>> {
    follow
        .stdout()
        .lines()
        .enumerate()
        .map(|(n, line)| {
            let mut words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            if n > 0 && words.len() > 2 {
                words[2] = AGE.to_owned();
            }
            words
        })
        .collect()
}

#[test]
fn questions_follow_prints_each_new_question_as_it_is_asked() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = run_worker(&sup, TWO_OPEN);
    let q1 = qid(&wait_open(&sup, &id, "Deploy?", &[]));
    let mut follow = sb.spawn("follow", &["questions", "--follow"]);
    let first = grid(&OPEN_HEADER, &[row(&id, q1, "yes,no", "Deploy?")]);
    wait_until(
        TIMEOUT,
        "`questions --follow` to list the open question",
        || followed(&follow).len() >= 2,
    );
    assert_eq!(followed(&follow), first, "{}", follow.stdout());

    std::fs::write(sb.file("go"), "").unwrap();
    let q2 = qid(&wait_open(&sup, &id, "Region?", &[q1]));
    wait_until(
        TIMEOUT,
        "`questions --follow` to print the new question",
        || followed(&follow).len() >= 3,
    );
    assert_eq!(
        followed(&follow),
        grid(
            &OPEN_HEADER,
            &[
                row(&id, q1, "yes,no", "Deploy?"),
                row(&id, q2, "eu,us", "Region?"),
            ]
        ),
        "{}",
        follow.stdout()
    );
    assert!(follow.is_running(), "--follow goes on until killed");
    follow.signal(tether_tests::Signal::Term);
    follow.wait(TIMEOUT);
}

#[test]
fn a_free_text_answer_is_the_words_joined_by_spaces() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = run_worker(
        &sup,
        r#"a=$("$TETHER" ask Which release name?) || exit 9; echo "got $a""#,
    );
    let q = wait_open(&sup, &id, "Which release name?", &[]);
    assert_eq!(q["choices"], serde_json::json!([]), "{q}");
    assert_eq!(q["key"], "Which release name?#0", "{q}");
    let q = qid(&q);
    assert_answered(
        &answer(sb, &id, None, &["Blue", "Harbour"]),
        &id,
        q,
        "Blue Harbour",
    );
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["got Blue Harbour"]);
}

#[test]
fn rm_of_an_ended_execution_removes_its_questions() {
    let mut sup = Supervised::start();
    let ended = run_worker(&sup, DEPLOY);
    let q1 = qid(&wait_open(&sup, &ended, "Deploy?", &[]));
    assert_answered(&answer(sup.sb(), &ended, None, &["yes"]), &ended, q1, "yes");
    sup.wait_state(&ended, "completed", TIMEOUT);
    let live = run_worker(&sup, DEPLOY);
    let q2 = qid(&wait_open(&sup, &live, "Deploy?", &[]));

    assert_output(&sup.sb().run(&["rm", &ended]), 0, &format!("{ended}\n"), "");
    let want = grid(&ALL_HEADER, &[row_all(&live, q2, "yes,no", "Deploy?", "")]);
    assert_eq!(questions_table(sup.sb(), &["--all"]), want);
    let listed: Vec<u64> = questions_json(sup.sb(), &["--all"])
        .iter()
        .map(qid)
        .collect();
    assert_eq!(listed, [q2]);
    // Answering a removed execution's question finds nothing.
    answer(sup.sb(), &ended, Some(q1), &["no"]).assert_code(3);

    // The removal is durable.
    sup.daemon().kill9();
    sup.daemon().restart();
    assert_eq!(questions_table(sup.sb(), &["--all"]), want);
}

#[test]
fn ask_outside_a_worker_or_with_a_default_outside_the_choices_exits_2() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let mut cmd = sb.tether(&["ask", "Deploy?"]);
    cmd.env_remove("TETHER_EXECUTION_ID");
    let out = tether_tests::cli::run(cmd, b"", tether_tests::sandbox::RUN_TIMEOUT);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains("--execution") && out.stderr.contains("TETHER_EXECUTION_ID"),
        "the error names both ways to say which execution: {:?}",
        out.stderr
    );

    let id = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&id, TIMEOUT);
    let out = sb.run(&[
        "ask",
        "--execution",
        &id,
        "--choices",
        "yes,no",
        "--default",
        "maybe",
        "Deploy?",
    ]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("maybe"), "{:?}", out.stderr);
    // Nothing was asked.
    assert_eq!(questions_of(sb, &id), Vec::<serde_json::Value>::new());
    assert_eq!(sup.info(&id)["state"], "running");
}
