//! The SDK client's side of human gates and inboxes: sending to an inbox,
//! answering and listing questions, as `tether send`, `answer` and
//! `questions --json` do.

use bytes::Bytes;
use serde_json::Value;

use super::Client;
use crate::error::Result;
use crate::gates::{self, QuestionFilter};
use crate::json;

impl Client {
    /// Queues `message` in the inbox of `execution`; returns its id once
    /// it is durable. Sent once, never retried (see [`gates::send`]).
    pub async fn send(&self, execution: &str, message: Bytes) -> Result<u64> {
        gates::send(self.connector(), execution, message).await
    }

    /// Answers a question of `execution` (its one open question when
    /// `question` is `None`); returns the question, closed, as
    /// [`json::question`] renders it.
    pub async fn answer(
        &self,
        execution: &str,
        answer: &str,
        question: Option<u64>,
    ) -> Result<Value> {
        let closed = gates::answer(self.connector(), execution, question, answer).await?;
        Ok(json::question(&closed))
    }

    /// The open questions (every one with `all`), of `execution` when one
    /// is given, in id order, as [`json::question`] renders them.
    pub async fn questions(&self, all: bool, execution: Option<String>) -> Result<Vec<Value>> {
        let filter = QuestionFilter { all, execution };
        let found = gates::questions(self.connector(), &filter).await?;
        Ok(found.iter().map(json::question).collect())
    }
}
