//! `tether ask`, `tether answer` and `tether questions`: human gates.
//!
//! * `ask [--execution ID] [--choices a,b] [--timeout DUR] [--default X]
//!   [--key K] QUESTION...`: asks (the words joined by spaces) and blocks
//!   until the question closes, then prints the answer and a newline. A
//!   question that timed out with no default exits 1 naming it. Asking
//!   again after a reconnect never opens a second question (see
//!   [`tether::gates::ask`]).
//! * `answer ID [--question QID] ANSWER...`: prints `answered question QID
//!   of ID: ANSWER`. Exit 1 when already answered, 2 for an answer outside
//!   the choices (or no QID while several are open), 3 when there is no
//!   such open question.
//! * `questions [--all] [--follow]`: EXECUTION, QUESTION, ASKED (an age),
//!   CHOICES (`-` for any text), TEXT and, with `--all`, ANSWER (the
//!   answer, `(timed out)`, or empty while open). `--follow` prints each
//!   new question as it is asked, until killed. `--json`: one object per
//!   question, as [`tether::json::question`] renders it.
//!
//! `--execution` defaults to `$TETHER_EXECUTION_ID`.

use std::time::Duration;

use clap::Args;
use tether::error::EXIT_OK;
use tether::gates::{self, Follow, Question, QuestionFilter};
use tether::time::{age, now_micros};
use tether::worker::ENV_EXECUTION;
use tether::{Error, Result};
use tether_protocol::QuestionInfo;

use super::checkpoint::execution;
use super::{duration, table, write_stdout, Context};

/// Arguments of `tether ask`.
#[derive(Debug, Args)]
pub struct AskArgs {
    /// The execution asking [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,

    /// The answers allowed, separated by commas [default: any text]
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    choices: Vec<String>,

    /// Close the question after this long (e.g. 90s, 30m, 2h): the
    /// default becomes the answer, or without one `ask` exits 1.
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    timeout: Option<Duration>,

    /// The answer recorded when the timeout passes (one of the choices).
    #[arg(long, value_name = "X")]
    default: Option<String>,

    /// Names the decision, so that asking again with the same key gets its
    /// recorded answer. [default: the text and how many times this attempt
    /// asked it before]
    #[arg(long, value_name = "K")]
    key: Option<String>,

    /// The question (the words are joined by spaces).
    #[arg(value_name = "QUESTION", required = true, num_args = 1..)]
    words: Vec<String>,
}

/// Arguments of `tether answer`.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The execution that asked (its id or name).
    #[arg(value_name = "ID")]
    execution: String,

    /// The question's id [default: the execution's one open question]
    #[arg(long, value_name = "QID")]
    question: Option<u64>,

    /// The answer (the words are joined by spaces).
    #[arg(value_name = "ANSWER", required = true, num_args = 1..)]
    words: Vec<String>,
}

/// Arguments of `tether questions`.
#[derive(Debug, Args)]
pub struct QuestionsArgs {
    /// Also list answered and timed-out questions, with their answers.
    #[arg(long)]
    all: bool,

    /// Keep printing each new question as it is asked, until killed.
    #[arg(long, short = 'f')]
    follow: bool,
}

/// Runs `tether ask`; prints the answer.
pub async fn ask(ctx: &Context, args: AskArgs) -> Result<u8> {
    let env = std::env::var(ENV_EXECUTION).ok();
    let question = Question {
        execution: execution(args.execution, env)?,
        text: args.words.join(" "),
        choices: args.choices,
        timeout: args.timeout,
        default: args.default,
        key: args.key,
    };
    // Checked before connecting, so that a wrong command line is told at
    // once even when no daemon runs.
    question.check()?;
    let closed = gates::ask(&ctx.connector("ask"), &question).await?;
    write_stdout(answer_line(&closed)?.as_bytes())?;
    Ok(EXIT_OK)
}

/// The line `ask` prints for a closed question: its answer.
fn answer_line(q: &QuestionInfo) -> Result<String> {
    match q.outcome.as_ref().and_then(|o| o.answer.as_deref()) {
        Some(answer) => Ok(format!("{answer}\n")),
        None => Err(Error::Unanswered { question: q.id }),
    }
}

/// Runs `tether answer`.
pub async fn answer(ctx: &Context, args: AnswerArgs) -> Result<u8> {
    let text = args.words.join(" ");
    let closed = gates::answer(
        &ctx.connector("answer"),
        &args.execution,
        args.question,
        &text,
    )
    .await?;
    let answer = closed
        .outcome
        .as_ref()
        .and_then(|o| o.answer.clone())
        .unwrap_or(text);
    let line = format!(
        "answered question {} of {}: {answer}\n",
        closed.id, args.execution
    );
    write_stdout(line.as_bytes())?;
    Ok(EXIT_OK)
}

/// Runs `tether questions`.
pub async fn questions(ctx: &Context, args: QuestionsArgs) -> Result<u8> {
    let connector = ctx.connector("questions");
    let filter = QuestionFilter {
        all: args.all,
        execution: None,
    };
    // The existing ones first, as one aligned table (its header even
    // when there are none, so that a follower sees what the columns are).
    let found = gates::questions(&connector, &filter).await?;
    let printed = |found: &[QuestionInfo], header: bool| {
        let text = if ctx.json {
            json_lines(found)
        } else {
            render(found, args.all, now_micros(), header)
        };
        write_stdout(text.as_bytes())
    };
    // `false`: the reader went away, and nothing more is wanted.
    if !printed(&found, true)? || !args.follow {
        return Ok(EXIT_OK);
    }
    let after = found.last().map_or(0, |q| q.id);
    let mut follow = Follow::after(connector, filter, after);
    loop {
        let found = follow.next().await?;
        if !printed(&found, false)? {
            return Ok(EXIT_OK);
        }
    }
}

/// One JSON object per question, each on its own line.
fn json_lines(found: &[QuestionInfo]) -> String {
    found
        .iter()
        .map(|q| tether::json::question(q).to_string() + "\n")
        .collect()
}

/// The table of `questions`, with the header first when `header`.
fn render(found: &[QuestionInfo], all: bool, now: u64, header: bool) -> String {
    let mut rows = Vec::new();
    if header {
        let mut names = vec!["EXECUTION", "QUESTION", "ASKED", "CHOICES", "TEXT"];
        if all {
            names.push("ANSWER");
        }
        rows.push(names.into_iter().map(String::from).collect());
    }
    for q in found {
        let choices = if q.choices.is_empty() {
            "-".to_owned()
        } else {
            q.choices.join(",")
        };
        let mut row = vec![
            q.execution.clone(),
            q.id.to_string(),
            age(now, q.asked_micros),
            choices,
            q.text.clone(),
        ];
        if all {
            row.push(match &q.outcome {
                None => String::new(),
                Some(o) => o.answer.clone().unwrap_or_else(|| "(timed out)".into()),
            });
        }
        rows.push(row);
    }
    // An open question's ANSWER is empty: its row must still end without
    // trailing blanks.
    table::render(&rows)
        .lines()
        .map(|line| line.trim_end().to_owned() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::{Answerer, QuestionOutcome};

    const S: u64 = 1_000_000;
    const NOW: u64 = 1_700_000_000 * S;

    fn question(id: u64, text: &str, outcome: Option<QuestionOutcome>) -> QuestionInfo {
        QuestionInfo {
            id,
            execution: "job-1".into(),
            key: format!("{text}#0"),
            text: text.into(),
            choices: vec!["yes".into(), "no".into()],
            default: None,
            asked_micros: NOW - 180 * S,
            deadline_micros: None,
            attempt: 1,
            seq: 4,
            outcome,
        }
    }

    fn closed(answer: Option<&str>, by: Answerer) -> Option<QuestionOutcome> {
        Some(QuestionOutcome {
            answer: answer.map(String::from),
            by,
            answered_micros: NOW,
            seq: 5,
        })
    }

    #[test]
    fn the_table_shows_age_choices_and_text() {
        let mut free = question(3, "Which branch?", None);
        free.choices.clear();
        free.asked_micros = NOW - 5 * S;
        let text = render(&[question(2, "Deploy?", None), free], false, NOW, true);
        assert_eq!(
            text,
            "EXECUTION  QUESTION  ASKED  CHOICES  TEXT\n\
             job-1      2         3m     yes,no   Deploy?\n\
             job-1      3         5s     -        Which branch?\n"
        );
    }

    #[test]
    fn with_all_the_answer_column_tells_answered_timed_out_and_open() {
        let alice = Answerer::User {
            uid: 1000,
            name: Some("alice".into()),
        };
        let rows = [
            question(1, "Deploy?", closed(Some("yes"), alice)),
            question(2, "Again?", closed(None, Answerer::Timeout)),
            question(3, "Now?", None),
        ];
        let text = render(&rows, true, NOW, true);
        assert_eq!(
            text,
            "EXECUTION  QUESTION  ASKED  CHOICES  TEXT     ANSWER\n\
             job-1      1         3m     yes,no   Deploy?  yes\n\
             job-1      2         3m     yes,no   Again?   (timed out)\n\
             job-1      3         3m     yes,no   Now?\n"
        );
        let no_header = render(&rows[2..], false, NOW, false);
        assert_eq!(no_header, "job-1  3  3m  yes,no  Now?\n");
    }

    #[test]
    fn ask_prints_the_answer_or_names_the_question_that_timed_out() {
        let yes = question(1, "Deploy?", closed(Some("yes"), Answerer::Timeout));
        assert_eq!(answer_line(&yes).unwrap(), "yes\n");
        let none = question(7, "Deploy?", closed(None, Answerer::Timeout));
        let e = answer_line(&none).unwrap_err();
        assert_eq!(e.to_string(), "question 7 timed out with no answer");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn json_lines_carry_the_state_and_who_answered() {
        let alice = Answerer::User {
            uid: 1000,
            name: Some("alice".into()),
        };
        let text = json_lines(&[
            question(1, "Deploy?", closed(Some("yes"), alice)),
            question(2, "Again?", closed(Some("no"), Answerer::Timeout)),
            question(3, "Now?", None),
        ]);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["state"], "answered");
        assert_eq!(
            lines[0]["answered_by"],
            serde_json::json!({"uid": 1000, "user": "alice"})
        );
        assert_eq!(lines[0]["key"], "Deploy?#0");
        assert_eq!(lines[1]["state"], "timed out");
        assert_eq!(lines[1]["answered_by"], "timeout");
        assert_eq!(lines[1]["answer"], "no");
        assert_eq!(lines[2]["state"], "open");
        assert!(lines[2]["answer"].is_null());
        assert!(lines[2]["answered_by"].is_null());
        assert_eq!(lines[2]["asked_micros"], NOW - 180 * S);
    }
}
