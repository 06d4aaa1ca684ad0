//! `Ask`, `AwaitAnswer`, `Answer` and `ListQuestions`, and closing a
//! question (by an answer or its timeout). See [`crate::gates`] for how
//! changes are made one at a time and adopted once durable.

use std::time::Duration;

use tether_protocol::{
    AnswerSpec, Answerer, AskSpec, FrameKind, QuestionInfo, QuestionOutcome, MAX_CHOICES,
    MAX_QUESTION_TEXT,
};
use tokio::time::Instant;

use tether_protocol::time::now_micros;

use super::{frames, FindAsk, QuestionRecord, MAX_WAIT};
use crate::engine::{GateChange, GateOutcome, Queue};
use crate::supervisor::{state, Supervisor};
use crate::{Error, Result};

/// Records a question, or finds the one recorded for the same nonce or
/// under the same key (see [`AskSpec`]).
pub async fn ask(queue: &Queue, supervisor: &Supervisor, spec: AskSpec) -> Result<QuestionInfo> {
    validate_ask(&spec)?;
    let gates = queue.gates();
    let _turn = gates.changing.lock().await;
    let execution = supervisor.get(&spec.execution)?;
    let attempt = execution.attempt;
    let key = match &spec.key {
        Some(key) => key.clone(),
        None => {
            let n = gates.asked_before(&execution.id, attempt, &spec.text);
            format!("{}#{n}", spec.text)
        }
    };
    match gates.find(&execution.id, spec.nonce, Some(&key)) {
        FindAsk::Nonce(record) => return Ok(record.info),
        FindAsk::Key(mut record) => {
            // Noted, so that the default key counts this ask too.
            record.asks.push((attempt, spec.nonce));
            let change = GateChange::Question {
                record: Box::new(record),
                frame: None,
                next_id: None,
            };
            return commit(queue, change).await;
        }
        FindAsk::None => {}
    }
    if state::is_final(execution.state) {
        return Err(Error::InvalidRequest(format!(
            "execution {} has ended ({}): it cannot ask a question",
            execution.id,
            execution.state.as_str()
        )));
    }
    let id = gates.take_question_id();
    let asked = now_micros();
    let record = QuestionRecord {
        info: QuestionInfo {
            id,
            execution: execution.id.clone(),
            key,
            text: spec.text,
            choices: spec.choices,
            default: spec.default,
            asked_micros: asked,
            deadline_micros: spec
                .timeout_ms
                .map(|ms| asked.saturating_add(ms.saturating_mul(1000))),
            attempt,
            seq: 0,
            outcome: None,
        },
        timeout_ms: spec.timeout_ms,
        asks: vec![(attempt, spec.nonce)],
    };
    let payload = frames::ask(&record);
    let change = GateChange::Question {
        record: Box::new(record),
        frame: Some((FrameKind::Ask, payload)),
        next_id: Some(id + 1),
    };
    let info = commit(queue, change).await?;
    tracing::info!(execution = %info.execution, question = id, "question asked");
    Ok(info)
}

/// Answers a question; the first answer wins.
pub async fn answer(queue: &Queue, spec: AnswerSpec, by: Answerer) -> Result<QuestionInfo> {
    check_len("the answer", &spec.answer)?;
    let gates = queue.gates();
    let _turn = gates.changing.lock().await;
    let execution = &spec.execution;
    let record = match spec.question {
        Some(id) => gates
            .record(id)
            .filter(|r| r.info.execution == *execution)
            .ok_or_else(|| {
                Error::QuestionNotFound(format!("execution {execution} has no question {id}"))
            })?,
        None => {
            let mut open = gates.open_of(execution);
            match open.len() {
                0 => {
                    return Err(Error::QuestionNotFound(format!(
                        "execution {execution} has no open question"
                    )))
                }
                1 => open.remove(0),
                n => {
                    let listed: Vec<String> = open
                        .iter()
                        .map(|r| format!("{} ({:?})", r.info.id, r.info.text))
                        .collect();
                    return Err(Error::InvalidAnswer(format!(
                        "execution {execution} has {n} open questions; say which one with \
                         --question: {}",
                        listed.join(", ")
                    )));
                }
            }
        }
    };
    if let Some(outcome) = &record.info.outcome {
        return Err(already_answered(&record.info, outcome));
    }
    let choices = &record.info.choices;
    if !choices.is_empty() && !choices.contains(&spec.answer) {
        return Err(Error::InvalidAnswer(format!(
            "{:?} is not one of the choices of question {} of {execution}: {}",
            spec.answer,
            record.info.id,
            choices.join(", ")
        )));
    }
    let info = close(queue, record, Some(spec.answer), by).await?;
    tracing::info!(execution = %info.execution, question = info.id, "question answered");
    Ok(info)
}

/// Closes an open question with `answer` (the caller holds
/// [`super::Gates::changing`] and checked that it is open).
pub(super) async fn close(
    queue: &Queue,
    mut record: QuestionRecord,
    answer: Option<String>,
    by: Answerer,
) -> Result<QuestionInfo> {
    let outcome = QuestionOutcome {
        answer,
        by,
        answered_micros: now_micros(),
        seq: 0,
    };
    let payload = frames::answer(record.info.id, &outcome);
    record.info.outcome = Some(outcome);
    let change = GateChange::Question {
        record: Box::new(record),
        frame: Some((FrameKind::Answer, payload)),
        next_id: None,
    };
    commit(queue, change).await
}

/// Commits a question and adopts it in memory once durable.
async fn commit(queue: &Queue, change: GateChange) -> Result<QuestionInfo> {
    match queue.gate(change).await? {
        GateOutcome::Question(record) => {
            let info = record.info.clone();
            queue.gates().adopt(*record);
            Ok(info)
        }
        _ => Err(Error::Invariant(
            "internal error: a question's commit answered with something else".into(),
        )),
    }
}

/// The question as it stands once it is closed, or once `wait_ms` (at
/// most [`MAX_WAIT`]) has passed.
pub async fn await_answer(queue: &Queue, question: u64, wait_ms: u64) -> Result<QuestionInfo> {
    let gates = queue.gates();
    let mut changed = gates.watch_questions();
    let deadline = deadline_after(wait_ms);
    loop {
        changed.borrow_and_update();
        let record = gates
            .record(question)
            .ok_or_else(|| Error::QuestionNotFound(format!("no question {question}")))?;
        if !record.is_open() || Instant::now() >= deadline {
            return Ok(record.info);
        }
        tokio::select! {
            result = changed.changed() => if result.is_err() { return Ok(record.info) },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// Questions as [`super::Gates::list`] finds them; when there are none
/// and `wait_ms` is not 0, waits that long (at most [`MAX_WAIT`]) for one.
pub async fn list(
    queue: &Queue,
    all: bool,
    execution: Option<&str>,
    after: u64,
    wait_ms: u64,
) -> Vec<QuestionInfo> {
    let gates = queue.gates();
    let mut changed = gates.watch_questions();
    let deadline = deadline_after(wait_ms);
    loop {
        changed.borrow_and_update();
        let found = gates.list(all, execution, after);
        if !found.is_empty() || wait_ms == 0 || Instant::now() >= deadline {
            return found;
        }
        tokio::select! {
            result = changed.changed() => if result.is_err() { return found },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// When a wait of `wait_ms` ends, capped at [`MAX_WAIT`].
pub(super) fn deadline_after(wait_ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(wait_ms).min(MAX_WAIT)
}

/// The refusal of an answer to a closed question, naming its outcome.
fn already_answered(info: &QuestionInfo, outcome: &QuestionOutcome) -> Error {
    let (id, execution) = (info.id, &info.execution);
    Error::AlreadyAnswered(match (&outcome.by, &outcome.answer) {
        (Answerer::User { uid, name }, answer) => {
            let answer = answer.as_deref().unwrap_or("");
            let who = match name {
                Some(name) => format!("uid {uid} ({name})"),
                None => format!("uid {uid}"),
            };
            format!("question {id} of {execution} was already answered: {answer:?} by {who}")
        }
        (Answerer::Timeout, Some(answer)) => {
            format!("question {id} of {execution} already timed out, with its default {answer:?}")
        }
        (Answerer::Timeout, None) => {
            format!("question {id} of {execution} already timed out with no answer")
        }
    })
}

fn check_len(what: &str, value: &str) -> Result<()> {
    if value.len() > MAX_QUESTION_TEXT {
        return Err(Error::InvalidRequest(format!(
            "{what} takes {} bytes, more than the limit of {MAX_QUESTION_TEXT}",
            value.len()
        )));
    }
    Ok(())
}

/// Checks an ask's text, choices, default and key.
fn validate_ask(spec: &AskSpec) -> Result<()> {
    if spec.text.trim().is_empty() {
        return Err(Error::InvalidRequest("a question needs some text".into()));
    }
    check_len("the question", &spec.text)?;
    if spec.choices.len() > MAX_CHOICES {
        return Err(Error::InvalidRequest(format!(
            "a question offers at most {MAX_CHOICES} choices, not {}",
            spec.choices.len()
        )));
    }
    for choice in &spec.choices {
        if choice.is_empty() {
            return Err(Error::InvalidRequest("a choice cannot be empty".into()));
        }
        check_len("a choice", choice)?;
    }
    if let Some(key) = &spec.key {
        if key.is_empty() {
            return Err(Error::InvalidRequest(
                "a question's key cannot be empty".into(),
            ));
        }
        check_len("the key", key)?;
    }
    if let Some(default) = &spec.default {
        check_len("the default", default)?;
        if !spec.choices.is_empty() && !spec.choices.contains(default) {
            return Err(Error::InvalidRequest(format!(
                "the default {default:?} is not one of the choices: {}",
                spec.choices.join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn spec() -> AskSpec {
        AskSpec {
            execution: "e".into(),
            text: "Deploy?".into(),
            choices: vec!["yes".into(), "no".into()],
            timeout_ms: None,
            default: None,
            key: None,
            nonce: 1,
        }
    }

    #[test]
    fn a_default_outside_the_choices_is_refused_naming_them() {
        let mut ask = spec();
        ask.default = Some("maybe".into());
        assert_eq!(
            validate_ask(&ask).unwrap_err().to_string(),
            "the default \"maybe\" is not one of the choices: yes, no"
        );
        ask.default = Some("no".into());
        assert!(validate_ask(&ask).is_ok());
    }

    #[test]
    fn too_long_or_too_many_is_refused() {
        let mut ask = spec();
        ask.text = "x".repeat(MAX_QUESTION_TEXT + 1);
        assert!(validate_ask(&ask).is_err());
        let mut ask = spec();
        ask.choices = (0..=MAX_CHOICES).map(|i| i.to_string()).collect();
        assert!(validate_ask(&ask).is_err());
    }
}
