//! Helpers shared by the question and inbox tests: workers that reach
//! `tether` through `$TETHER`, `tether questions` as a grid of cells with
//! the ages set aside, open questions waited for, and the JSON payloads of
//! the `ask` and `answer` frames.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tether_tests::cli::Output;
use tether_tests::supervise::Supervised;
use tether_tests::{bins, procs, Sandbox};

/// How long a test waits for a worker, a question or a message.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// The table header of `tether questions`, and of `--all`.
pub const OPEN_HEADER: [&str; 5] = ["EXECUTION", "QUESTION", "ASKED", "CHOICES", "TEXT"];
pub const ALL_HEADER: [&str; 6] = [
    "EXECUTION",
    "QUESTION",
    "ASKED",
    "CHOICES",
    "TEXT",
    "ANSWER",
];

/// What an age cell of the ASKED column becomes in [`cells`]: ages move
/// with the clock, so tests compare everything but them.
pub const AGE: &str = "<age>";

/// `TETHER=<the tether under test>`, for `run --env`: worker scripts call
/// `"$TETHER"`, so the binary under test is the one they run.
pub fn tether_env() -> String {
    format!("TETHER={}", bins::tether().display())
}

/// `run --restart never --env TETHER=...` of `script`, working in the
/// sandbox; returns the execution id.
pub fn run_worker(sup: &Supervised, script: &str) -> String {
    let env = tether_env();
    sup.run_sh(&["--restart", "never", "--env", &env], script)
}

/// The uid of this test and its name as the name services give it: what
/// the daemon records as the answerer of the answers the test gives.
pub fn me() -> (u32, String) {
    let uid = tether_protocol::paths::current_uid();
    let out = Command::new("id")
        .arg("-un")
        .output()
        .unwrap_or_else(|e| panic!("cannot run `id -un`: {e}"));
    (uid, String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `{"uid":N,"user":NAME}`: the `by` of an `answer` frame given by the test.
pub fn by_me() -> Value {
    let (uid, name) = me();
    json!({"uid": uid, "user": name})
}

/// `tether questions ARGS...` printed as a table, split into cells by the
/// header's column starts (columns are left-aligned), with every ASKED
/// cell checked to be an age (`5s`, `3m`, `2h`, `1d`) and replaced by
/// [`AGE`]. Asserts exit 0 and an empty stderr.
pub fn questions_table(sb: &Sandbox, args: &[&str]) -> Vec<Vec<String>> {
    let mut full = vec!["questions"];
    full.extend_from_slice(args);
    table_of(&sb.run(&full))
}

/// [`questions_table`] of an output obtained some other way (as another
/// user, over ssh).
pub fn table_of(out: &Output) -> Vec<Vec<String>> {
    out.assert_success();
    assert_eq!(out.stderr, "", "`{}` wrote to stderr", out.command);
    cells(&out.stdout).unwrap_or_else(|why| {
        panic!(
            "`{}` printed a table that {why}:\n{}",
            out.command, out.stdout
        )
    })
}

/// Splits a left-aligned table into cells (see [`questions_table`]).
pub fn cells(table: &str) -> Result<Vec<Vec<String>>, String> {
    let mut lines = table.lines();
    let header = lines.next().ok_or("is empty")?;
    let header_chars: Vec<char> = header.chars().collect();
    // A column starts where a header word starts.
    let starts: Vec<usize> = (0..header_chars.len())
        .filter(|&i| header_chars[i] != ' ' && (i == 0 || header_chars[i - 1] == ' '))
        .collect();
    let asked = header
        .split_whitespace()
        .position(|w| w == "ASKED")
        .ok_or("has no ASKED column")?;
    let mut rows = Vec::new();
    for line in std::iter::once(header).chain(lines) {
        let chars: Vec<char> = line.chars().collect();
        let mut row = Vec::with_capacity(starts.len());
        for (n, &start) in starts.iter().enumerate() {
            let end = starts
                .get(n + 1)
                .copied()
                .unwrap_or(chars.len())
                .min(chars.len());
            let cell: String = chars
                .get(start.min(end)..end)
                .unwrap_or(&[])
                .iter()
                .collect();
            // A cell that runs into the next column is misaligned; a line
            // that ends inside this cell (its later cells empty) is not.
            let runs_on = starts.get(n + 1).is_some_and(|&next| chars.len() > next);
            if runs_on && end > start && chars.get(end - 1).is_some_and(|c| *c != ' ') {
                return Err(format!("is misaligned at line {line:?}"));
            }
            row.push(cell.trim_end().to_owned());
        }
        rows.push(row);
    }
    for row in rows.iter_mut().skip(1) {
        let age = &row[asked];
        if !is_age(age) {
            return Err(format!("has {age:?} in the ASKED column, not an age"));
        }
        row[asked] = AGE.to_owned();
    }
    Ok(rows)
}

/// `5s`, `3m`, `2h`, `1d`: digits and one unit.
fn is_age(cell: &str) -> bool {
    let Some(digits) = cell.strip_suffix(['s', 'm', 'h', 'd']) else {
        return false;
    };
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
}

/// The expected grid: `header` and then `rows`.
pub fn grid(header: &[&str], rows: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut all = vec![header.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()];
    all.extend(rows.iter().cloned());
    all
}

/// One expected row of `tether questions`: execution, question id, the
/// age placeholder, choices, text (and, for `--all`, the answer).
pub fn row(execution: &str, question: u64, choices: &str, text: &str) -> Vec<String> {
    vec![
        execution.to_owned(),
        question.to_string(),
        AGE.to_owned(),
        choices.to_owned(),
        text.to_owned(),
    ]
}

/// [`row`] with the ANSWER column of `--all`.
pub fn row_all(
    execution: &str,
    question: u64,
    choices: &str,
    text: &str,
    answer: &str,
) -> Vec<String> {
    let mut r = row(execution, question, choices, text);
    r.push(answer.to_owned());
    r
}

/// `tether questions --json ARGS...`, one object per line.
pub fn questions_json(sb: &Sandbox, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["questions", "--json"];
    full.extend_from_slice(args);
    let out = sb.run(&full);
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("`questions --json`: {l:?}: {e}"))
        })
        .collect()
}

/// Every question (`--all`) of execution `id`, from `--json`.
pub fn questions_of(sb: &Sandbox, id: &str) -> Vec<Value> {
    questions_json(sb, &["--all"])
        .into_iter()
        .filter(|q| q["execution"] == id)
        .collect()
}

/// The id of a JSON question.
pub fn qid(q: &Value) -> u64 {
    q["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no numeric id in {q}"))
}

/// Waits until execution `id` has an open question with `text` (one not
/// in `seen`) and returns it as `questions --json` shows it.
pub fn wait_open(sup: &Supervised, id: &str, text: &str, seen: &[u64]) -> Value {
    let start = Instant::now();
    loop {
        let open = questions_json(sup.sb(), &[])
            .into_iter()
            .find(|q| q["execution"] == id && q["text"] == text && !seen.contains(&qid(q)));
        if let Some(q) = open {
            assert_eq!(q["state"], "open", "{q}");
            return q;
        }
        let info = sup.info(id);
        let ended = ["completed", "failed", "cancelled", "lost"]
            .iter()
            .any(|s| info["state"] == *s);
        if ended {
            panic!(
                "{id} ended before asking {text:?}: {info}\nstream:\n{}",
                sup.describe(id)
            );
        }
        if start.elapsed() > TIMEOUT {
            panic!(
                "timed out after {TIMEOUT:?} waiting for {id} to ask {text:?}; \
                 questions --all:\n{:#?}\nps: {}\nstream:\n{}",
                questions_json(sup.sb(), &["--all"]),
                sup.info(id),
                sup.describe(id)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tether answer ID [--question QID] WORDS...`.
pub fn answer(sb: &Sandbox, id: &str, question: Option<u64>, words: &[&str]) -> Output {
    let question = question.map(|q| q.to_string());
    let mut args = vec!["answer", id];
    if let Some(q) = &question {
        args.extend(["--question", q.as_str()]);
    }
    args.extend_from_slice(words);
    sb.run(&args)
}

/// Asserts exit 0 and `answered question QID of ID: ANSWER` on stdout.
pub fn assert_answered(out: &Output, id: &str, question: u64, answer: &str) {
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (
            Some(0),
            format!("answered question {question} of {id}: {answer}\n").as_str(),
            ""
        ),
        "`{}`",
        out.command
    );
}

/// Asserts the exit code and the exact stdout and stderr.
pub fn assert_output(out: &Output, code: i32, stdout: &str, stderr: &str) {
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(code), stdout, stderr),
        "`{}`",
        out.command
    );
}

/// Kills attempt 1 of execution `id`: its shell `pid` first, so that it
/// starts no other `tether` command, then whatever `tether` command it had
/// started (found by their environment, as they may be orphans by now).
pub fn kill_attempt_1(id: &str, pid: u32) {
    procs::kill9(pid).unwrap();
    let marks = [
        format!("TETHER_EXECUTION_ID={id}"),
        "TETHER_ATTEMPT=1".to_owned(),
    ];
    for p in procs::all_pids() {
        let is_shim = procs::stat(p).is_some_and(|s| s.comm == "tether-shim");
        if p == std::process::id() || is_shim {
            continue;
        }
        let env = procs::environ(p);
        if marks.iter().all(|m| env.contains(m)) {
            procs::kill9(p).unwrap();
        }
    }
}

/// The payloads of the stream's frames of `kind` (`ask`, `answer`),
/// parsed as JSON.
pub fn json_frames(sup: &Supervised, id: &str, kind: &str) -> Vec<Value> {
    sup.frames(id)
        .into_iter()
        .filter(|f| f.kind == kind)
        .map(|f| {
            serde_json::from_str(&f.payload).unwrap_or_else(|e| {
                panic!(
                    "the payload of a {kind} frame is not JSON ({e}): {:?}",
                    f.payload
                )
            })
        })
        .collect()
}

/// The payload an `ask` frame should carry.
pub fn ask_payload(
    question: u64,
    text: &str,
    choices: &[&str],
    key: &str,
    default: Option<&str>,
    timeout_ms: Option<u64>,
) -> Value {
    json!({
        "question": question,
        "text": text,
        "choices": choices,
        "key": key,
        "default": default,
        "timeout_ms": timeout_ms,
    })
}

/// The payload an `answer` frame should carry.
pub fn answer_payload(question: u64, answer: Option<&str>, by: Value) -> Value {
    json!({"question": question, "answer": answer, "by": by})
}

#[test]
fn question_tables_split_into_cells_with_ages_set_aside() {
    let table = "EXECUTION   QUESTION  ASKED  CHOICES  TEXT     ANSWER\n\
                 sh-abcdef   3         5s     yes,no   Deploy?  yes\n\
                 sh-abcdef   12        13m             Why?     \n";
    assert_eq!(
        cells(table),
        Ok(grid(
            &ALL_HEADER,
            &[
                row_all("sh-abcdef", 3, "yes,no", "Deploy?", "yes"),
                row_all("sh-abcdef", 12, "", "Why?", ""),
            ]
        ))
    );
    let not_an_age =
        "EXECUTION  QUESTION  ASKED  CHOICES  TEXT\nx          1         soon   a,b      T\n";
    assert!(cells(not_an_age).unwrap_err().contains("\"soon\""));
    let misaligned = "EXECUTION  QUESTION  ASKED  CHOICES  TEXT\nlong-execution-id 1 5s a,b T\n";
    assert!(cells(misaligned).unwrap_err().contains("misaligned"));
}
