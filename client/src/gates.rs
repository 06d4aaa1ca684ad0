//! Human gates and inboxes from the client's side: asking a question and
//! waiting for its answer, answering, listing questions, and the inbox's
//! send, receive and dequeue.
//!
//! * [`ask`]: picks a nonce once, sends `Ask`, then `AwaitAnswer` in a
//!   loop until the question closes. After a lost session it sends the
//!   same `Ask` again (same nonce): the daemon hands back the question it
//!   recorded for that nonce, so a reconnect never opens a second question
//!   nor counts twice towards the default key.
//! * [`answer`], [`send`]: sent once, never retried, as `resume` is: after
//!   a lost session the answer or message may have been recorded, and a
//!   second try would be refused (or queue the message twice).
//! * [`questions`], [`Follow`]: `ListQuestions`, retried after a lost
//!   session (it only reads), with its parts joined.
//! * [`recv`], [`dequeue`]: the oldest messages, read without removing
//!   them, and then their removal once the caller has handed them over;
//!   both retried after a lost session (reading again and removing again
//!   through the same id are harmless).

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_protocol::{
    AnswerSpec, AskSpec, ExecState, ExecutionInfo, InboxMessage, QuestionInfo, Request, Response,
};

use crate::conn::{unexpected, Connector, Link};
use crate::error::{Error, Result};

/// How long one `AwaitAnswer`, `Recv` or `ListQuestions` waits in the
/// daemon before it answers anyway. Short enough that a half-open session
/// is noticed, long enough that an idle wait costs almost nothing.
pub const WAIT_SLICE: Duration = Duration::from_secs(30);

/// A question to ask; see [`ask`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Question {
    /// The execution asking (its id or name).
    pub execution: String,
    pub text: String,
    /// The answers allowed; empty means any text.
    pub choices: Vec<String>,
    /// How long the question stays open; `None` is forever.
    pub timeout: Option<Duration>,
    /// Recorded as the answer when the timeout passes.
    pub default: Option<String>,
    /// The decision's name; `None` lets the daemon form the default key.
    pub key: Option<String>,
}

impl Question {
    /// Refuses what the daemon would refuse, before anything is sent: a
    /// default that is not one of the choices.
    pub fn check(&self) -> Result<()> {
        match &self.default {
            Some(default) if !self.choices.is_empty() && !self.choices.contains(default) => {
                Err(Error::Usage(format!(
                    "the default {default:?} is not one of the choices ({})",
                    self.choices.join(", ")
                )))
            }
            _ => Ok(()),
        }
    }

    /// The `Ask` request, with `nonce`.
    pub fn spec(&self, nonce: u64) -> AskSpec {
        AskSpec {
            execution: self.execution.clone(),
            text: self.text.clone(),
            choices: self.choices.clone(),
            timeout_ms: self.timeout.map(crate::time::millis),
            default: self.default.clone(),
            key: self.key.clone(),
            nonce,
        }
    }
}

/// A nonce for one ask: random, from the standard library's per-process
/// random hash keys, mixed with the time and the pid so that two asks in
/// one process differ too.
pub fn new_nonce() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(crate::time::now_micros());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Asks `question` and waits until it closes; returns it closed (its
/// `outcome` is `Some`: the answer, or `None` as the answer when it timed
/// out with no default). A question already recorded under the same key
/// is not asked again: its answer comes back at once.
pub async fn ask(connector: &Connector, question: &Question) -> Result<QuestionInfo> {
    question.check()?;
    let spec = question.spec(new_nonce());
    let mut link = Link::new(connector.clone());
    let mut open: Option<u64> = None;
    loop {
        let fresh = link.establish().await?;
        let Some(conn) = link.connection() else {
            continue;
        };
        let request = next_ask_request(&spec, open, fresh);
        match conn.request(&request).await {
            Ok(Response::Question(info)) => {
                link.progressed();
                if info.outcome.is_some() {
                    return Ok(info);
                }
                open = Some(info.id);
            }
            Ok(other) => return Err(unexpected("Question", &other)),
            Err(e) => link.lose(e)?,
        }
    }
}

/// What [`ask`] sends next: `Ask` first and on every new session (the
/// question may be gone, or the session may have been lost before the
/// first answer), else `AwaitAnswer` on the open question.
fn next_ask_request(spec: &AskSpec, open: Option<u64>, fresh: bool) -> Request {
    match open {
        Some(question) if !fresh => Request::AwaitAnswer {
            question,
            wait_ms: crate::time::millis(WAIT_SLICE),
        },
        _ => Request::Ask(spec.clone()),
    }
}

/// Answers a question of `execution` (its one open question when
/// `question` is `None`) and returns it closed. Sent once; see the module
/// docs.
pub async fn answer(
    connector: &Connector,
    execution: &str,
    question: Option<u64>,
    answer: &str,
) -> Result<QuestionInfo> {
    let request = Request::Answer(AnswerSpec {
        execution: execution.to_owned(),
        question,
        answer: answer.to_owned(),
    });
    let mut conn = connector.connect().await?;
    match conn.request(&request).await? {
        Response::Question(info) => Ok(info),
        other => Err(unexpected("Question", &other)),
    }
}

/// Which questions to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuestionFilter {
    /// Answered and timed-out ones too.
    pub all: bool,
    /// Only this execution's (its id or name).
    pub execution: Option<String>,
}

/// The questions with ids above `after`, in id order, waiting up to `wait`
/// for one when there are none.
pub async fn questions_after(
    connector: &Connector,
    filter: &QuestionFilter,
    after: u64,
    wait: Duration,
) -> Result<Vec<QuestionInfo>> {
    let request = Request::ListQuestions {
        all: filter.all,
        execution: filter.execution.clone(),
        after,
        wait_ms: crate::time::millis(wait),
    };
    let mut link = Link::new(connector.clone());
    loop {
        link.establish().await?;
        let Some(conn) = link.connection() else {
            continue;
        };
        let mut gathered = Vec::new();
        let outcome = async {
            let mut response = conn.request(&request).await?;
            // A long list comes in parts, each followed by the next,
            // until the last as `Questions`.
            loop {
                match response {
                    Response::QuestionsPart(part) => gathered.extend(part),
                    Response::Questions(rest) => {
                        gathered.extend(rest);
                        return Ok(());
                    }
                    other => return Err(unexpected("Questions", &other)),
                }
                response = conn.recv().await?;
            }
        }
        .await;
        match outcome {
            Ok(()) => return Ok(gathered),
            Err(e) => link.lose(e)?,
        }
    }
}

/// The questions, open ones only unless `filter.all`, in id order.
pub async fn questions(
    connector: &Connector,
    filter: &QuestionFilter,
) -> Result<Vec<QuestionInfo>> {
    questions_after(connector, filter, 0, Duration::ZERO).await
}

/// The open questions, asked for only when one of `executions` is
/// `waiting` (so that listing executions costs no more otherwise). A
/// daemon that refuses the list leaves none: what an execution waits on is
/// then told by its `reason` alone.
pub async fn open_questions_of_waiting<'a>(
    connector: &Connector,
    mut executions: impl Iterator<Item = &'a ExecutionInfo>,
) -> Result<Vec<QuestionInfo>> {
    if !executions.any(|e| e.state == ExecState::Waiting) {
        return Ok(Vec::new());
    }
    match questions(connector, &QuestionFilter::default()).await {
        Ok(open) => Ok(open),
        Err(e @ Error::Daemon { .. }) => {
            tracing::debug!("open questions not listed: {e}");
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// The open question a waiting execution waits on: its oldest one asked
/// by the current attempt, else its oldest one; `None` for one not
/// waiting.
pub fn waiting_on<'a>(open: &'a [QuestionInfo], e: &ExecutionInfo) -> Option<&'a QuestionInfo> {
    if e.state != ExecState::Waiting {
        return None;
    }
    let mine = || {
        open.iter()
            .filter(|q| q.execution == e.id && q.outcome.is_none())
    };
    mine()
        .filter(|q| q.attempt == e.attempt)
        .min_by_key(|q| q.id)
        .or_else(|| mine().min_by_key(|q| q.id))
}

/// The questions as they are asked: those there are, then each new one.
/// See [`Follow::next`].
#[derive(Debug)]
pub struct Follow {
    connector: Connector,
    filter: QuestionFilter,
    after: u64,
}

impl Follow {
    /// Follows the questions `filter` picks, from the first.
    pub fn new(connector: Connector, filter: QuestionFilter) -> Self {
        Self::after(connector, filter, 0)
    }

    /// Follows the questions `filter` picks with ids above `after`.
    pub fn after(connector: Connector, filter: QuestionFilter, after: u64) -> Self {
        Self {
            connector,
            filter,
            after,
        }
    }

    /// The next questions (at least one), waiting for as long as it takes
    /// for one to be asked.
    pub async fn next(&mut self) -> Result<Vec<QuestionInfo>> {
        loop {
            let found =
                questions_after(&self.connector, &self.filter, self.after, WAIT_SLICE).await?;
            if let Some(last) = found.last() {
                self.after = last.id;
                return Ok(found);
            }
        }
    }
}

/// Queues `message` in the inbox of `execution`; returns its id once it
/// is durable. Sent once; see the module docs.
pub async fn send(connector: &Connector, execution: &str, message: Bytes) -> Result<u64> {
    let request = Request::Send {
        execution: execution.to_owned(),
        message,
    };
    let mut conn = connector.connect().await?;
    match conn.request(&request).await? {
        Response::Queued { id } => Ok(id),
        other => Err(unexpected("Queued", &other)),
    }
}

/// The oldest messages in the inbox of `execution` (at most `max`),
/// without removing them, waiting for one up to `timeout` (`None`:
/// forever). Empty when the timeout passed with the inbox empty.
pub async fn recv(
    connector: &Connector,
    execution: &str,
    max: u32,
    timeout: Option<Duration>,
) -> Result<Vec<InboxMessage>> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let wait = match deadline {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()),
            None => WAIT_SLICE,
        }
        .min(WAIT_SLICE);
        let request = Request::Recv {
            execution: execution.to_owned(),
            max,
            wait_ms: crate::time::millis(wait),
        };
        let messages = match connector.request(&request).await? {
            Response::Messages(messages) => messages,
            other => return Err(unexpected("Messages", &other)),
        };
        let over = deadline.is_some_and(|deadline| Instant::now() >= deadline);
        if !messages.is_empty() || over {
            return Ok(messages);
        }
    }
}

/// Removes the messages of the inbox of `execution` up to and including
/// id `through`, once the caller has handed them over; returns how many
/// were removed.
pub async fn dequeue(connector: &Connector, execution: &str, through: u64) -> Result<u64> {
    let request = Request::Dequeue {
        execution: execution.to_owned(),
        through,
    };
    match connector.request(&request).await? {
        Response::Dequeued(count) => Ok(count),
        other => Err(unexpected("Dequeued", &other)),
    }
}

impl crate::Worker {
    /// Asks `question` for this worker's execution (its `execution` is
    /// replaced) and waits until it closes; returns the answer, or `None`
    /// when it timed out with no default. See [`ask`].
    pub async fn ask(&self, mut question: Question) -> Result<Option<String>> {
        question.execution = self.execution().to_owned();
        let closed = ask(self.connector(), &question).await?;
        Ok(closed.outcome.and_then(|o| o.answer))
    }

    /// The next message of this worker's inbox, waiting up to `timeout`
    /// (`None`: forever); `None` when the timeout passed with none.
    ///
    /// At least once: the message handed over by the previous call is
    /// removed from the inbox first, so one that a worker was handling when
    /// it died is handed over again to its next attempt (its id tells
    /// whether it was handled).
    pub async fn recv(&self, timeout: Option<Duration>) -> Result<Option<InboxMessage>> {
        let mut handed = self.handed.lock().await;
        if let Some(through) = *handed {
            dequeue(self.connector(), self.execution(), through).await?;
            *handed = None;
        }
        let mut messages = recv(self.connector(), self.execution(), 1, timeout).await?;
        if messages.is_empty() {
            return Ok(None);
        }
        let message = messages.swap_remove(0);
        *handed = Some(message.id);
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn deploy() -> Question {
        Question {
            execution: "job".into(),
            text: "Deploy?".into(),
            choices: vec!["yes".into(), "no".into()],
            ..Question::default()
        }
    }

    #[test]
    fn a_default_outside_the_choices_is_refused_before_asking() {
        let mut q = deploy();
        q.default = Some("maybe".into());
        let e = q.check().unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "the default \"maybe\" is not one of the choices (yes, no)"
        );
        q.default = Some("no".into());
        q.check().unwrap();
        q.choices.clear();
        q.default = Some("anything".into());
        q.check().unwrap();
    }

    #[test]
    fn the_spec_carries_the_question_and_the_nonce() {
        let mut q = deploy();
        q.timeout = Some(Duration::from_secs(90));
        let spec = q.spec(7);
        assert_eq!(spec.timeout_ms, Some(90_000));
        assert_eq!(spec.nonce, 7);
        assert_eq!(spec.key, None);
        assert_eq!(spec.choices, ["yes", "no"]);
    }

    #[test]
    fn asks_again_on_every_new_session_and_awaits_otherwise() {
        let spec = deploy().spec(9);
        let ask = Request::Ask(spec.clone());
        assert_eq!(next_ask_request(&spec, None, true), ask);
        assert_eq!(next_ask_request(&spec, Some(4), true), ask);
        assert_eq!(
            next_ask_request(&spec, Some(4), false),
            Request::AwaitAnswer {
                question: 4,
                wait_ms: 30_000
            }
        );
    }

    #[test]
    fn nonces_differ_from_one_ask_to_the_next() {
        assert_ne!(new_nonce(), new_nonce());
    }
}
