//! Human gates and inboxes: questions a worker asks and people answer,
//! and messages people send to a running worker (`tether ask`, `answer`,
//! `questions`, `send`, `recv`).

// One module in several files: the message types name each other freely.
use super::*;

/// The longest question, choice, answer or key, in bytes.
pub const MAX_QUESTION_TEXT: usize = 4096;

/// The most choices one question may offer.
pub const MAX_CHOICES: usize = 64;

/// See [`Request::Ask`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AskSpec {
    /// The execution the question belongs to (its id or name).
    pub execution: String,
    /// The question, as people will read it.
    pub text: String,
    /// The answers allowed; empty means any text.
    pub choices: Vec<String>,
    /// How long the question stays open, counted from when it was first
    /// recorded; `None` is forever.
    pub timeout_ms: Option<u64>,
    /// Recorded as the answer when the timeout passes; without one the
    /// question closes unanswered.
    pub default: Option<String>,
    /// Names the decision: a worker that asks again with the same key gets
    /// the recorded answer (or waits on the open question) instead of a new
    /// question. `None`: the text and how many times the execution's
    /// current attempt has asked that same text before.
    pub key: Option<String>,
    /// Chosen at random by the asking process and sent unchanged when it
    /// asks again after a reconnect: a repeat gets the question recorded
    /// for the first, so a lost answer never opens a second question or
    /// counts twice towards the default key.
    pub nonce: u64,
}

/// See [`Request::Answer`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AnswerSpec {
    /// The execution asking (its id or name).
    pub execution: String,
    /// The question's id; `None` answers the execution's one open
    /// question (refused when several are open).
    pub question: Option<u64>,
    pub answer: String,
}

/// A question and, once it has one, its outcome.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuestionInfo {
    /// Unique in the daemon, never reused; rising in the order asked.
    pub id: u64,
    /// The execution's id.
    pub execution: String,
    /// The key it was asked under (the given one, or the default key).
    pub key: String,
    pub text: String,
    pub choices: Vec<String>,
    pub default: Option<String>,
    /// When it was first recorded, microseconds since the Unix epoch.
    pub asked_micros: u64,
    /// When it times out, microseconds since the Unix epoch.
    pub deadline_micros: Option<u64>,
    /// The attempt that asked it first.
    pub attempt: u32,
    /// The seq of its `ask` frame on the execution's stream.
    pub seq: u64,
    /// `None` while the question is open.
    pub outcome: Option<QuestionOutcome>,
}

/// How a question was closed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuestionOutcome {
    /// The answer; `None` when it timed out with no default.
    pub answer: Option<String>,
    pub by: Answerer,
    /// When it was recorded, microseconds since the Unix epoch.
    pub answered_micros: u64,
    /// The seq of the `answer` frame on the execution's stream.
    pub seq: u64,
}

/// Who closed a question.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Answerer {
    /// A person, by the credentials of the connection that answered.
    User { uid: u32, name: Option<String> },
    /// The timeout passed (the answer is the default, if there was one).
    Timeout,
}

/// A message waiting in an execution's inbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct InboxMessage {
    /// Unique in the daemon, never reused; rising in the order sent.
    pub id: u64,
    /// When it was queued, microseconds since the Unix epoch.
    pub sent_micros: u64,
    /// The uid of the connection that sent it.
    pub sender_uid: u32,
    pub data: Bytes,
}
