//! Human gates and inboxes: questions a worker asks (`tether ask`) and
//! people answer, and messages people send to a running worker.
//!
//! The store keeps every question (`QUESTIONS`) and message (`INBOX`);
//! [`Gates`] keeps every question in memory as well, with an index of the
//! open ones by execution (so that `ps` of thousands of executions asks
//! nothing of the store), and how many messages wait per execution.
//!
//! Changes are made one at a time: a handler takes [`Gates::changing`],
//! decides from memory, commits through the writer (a question with its
//! `ask` or `answer` frame in one commit), and adopts the change in memory
//! only once it is durable. So the first answer wins, and a nonce or key
//! is never recorded twice. Waiters (`AwaitAnswer`, `ListQuestions`,
//! `Recv`) are woken through `watch` channels, never by polling.
//!
//! An execution is shown `waiting` while it is running and an open
//! question was asked by its current attempt; that is derived from the
//! questions, not stored in the manifest, so after a crash it comes back
//! with them.
//!
//! * `questions`: `Ask`, `AwaitAnswer`, `Answer`, `ListQuestions`.
//! * `inbox`: `Send`, `Recv`, `Dequeue`.
//! * `frames`: the JSON payloads of `ask` and `answer` frames.
//! * `timeouts`: closing questions at their deadline.

mod frames;
pub mod inbox;
pub mod questions;
pub mod timeouts;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tether_protocol::QuestionInfo;
use tokio::sync::watch;

use crate::store::GatesSnapshot;
use crate::Result;

/// The longest a waiting request (`AwaitAnswer`, `ListQuestions`, `Recv`)
/// is held before it is answered as it stands; the client asks again.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// A question as stored: what clients see, and what the daemon needs to
/// find it again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuestionRecord {
    pub info: QuestionInfo,
    /// As asked, for its `ask` frame.
    pub timeout_ms: Option<u64>,
    /// (attempt, nonce) of every ask it answered: a repeated nonce finds
    /// it again, and the default key counts asks per attempt.
    pub asks: Vec<(u32, u64)>,
}

impl QuestionRecord {
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_allocvec(self).map_err(|e| {
            crate::Error::storage(format!("cannot encode question {}", self.info.id), e)
        })
    }

    pub fn is_open(&self) -> bool {
        self.info.outcome.is_none()
    }
}

/// Questions and inbox counts in memory, and their wake-ups.
#[derive(Debug)]
pub struct Gates {
    state: Mutex<Registry>,
    /// Bumped whenever a question is recorded or closed.
    questions_changed: watch::Sender<u64>,
    /// Bumped whenever a message is queued.
    inbox_changed: watch::Sender<u64>,
    /// Held by the one change being made (decided, committed, adopted).
    pub(crate) changing: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Registry {
    questions: BTreeMap<u64, QuestionRecord>,
    /// The open questions of each execution that has one.
    open: HashMap<String, BTreeSet<u64>>,
    /// (execution, key) to the question recorded under it.
    keys: HashMap<(String, String), u64>,
    /// (execution, nonce) to the question it asked.
    nonces: HashMap<(String, u64), u64>,
    /// (deadline, id) of every open question that has a deadline, so that
    /// the timeout task finds the soonest without a scan.
    deadlines: BTreeSet<(u64, u64)>,
    /// (execution, attempt, text) to how many asks that attempt made of
    /// that text under default keys: the `N` of its next `TEXT#N`, kept
    /// so that an ask does not scan every question.
    default_asks: HashMap<(String, u32, String), usize>,
    /// Messages waiting, per execution that has any.
    inbox: HashMap<String, u64>,
    next_question_id: u64,
    next_message_id: u64,
}

fn lock(m: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // Every change of the registry is made whole under the lock, with no
    // call that can panic halfway; the state is sound after a panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    fn adopt(&mut self, record: QuestionRecord) {
        if let Some(old) = self.questions.remove(&record.info.id) {
            self.unindex(&old);
        }
        self.index(&record);
        let info = &record.info;
        let execution = info.execution.clone();
        self.next_question_id = self.next_question_id.max(info.id + 1);
        self.keys
            .insert((execution.clone(), info.key.clone()), info.id);
        for &(_, nonce) in &record.asks {
            self.nonces.insert((execution.clone(), nonce), info.id);
        }
        if record.is_open() {
            self.open.entry(execution).or_default().insert(info.id);
        } else if let Some(open) = self.open.get_mut(&execution) {
            open.remove(&info.id);
            if open.is_empty() {
                self.open.remove(&execution);
            }
        }
        self.questions.insert(info.id, record);
    }

    /// Adds `record` to the deadline and default-key indexes.
    fn index(&mut self, record: &QuestionRecord) {
        let info = &record.info;
        if let (true, Some(deadline)) = (record.is_open(), info.deadline_micros) {
            self.deadlines.insert((deadline, info.id));
        }
        if is_default_key(info) {
            for &(attempt, _) in &record.asks {
                *self
                    .default_asks
                    .entry((info.execution.clone(), attempt, info.text.clone()))
                    .or_insert(0) += 1;
            }
        }
    }

    /// Takes `record` out of the indexes [`Registry::index`] adds it to.
    fn unindex(&mut self, record: &QuestionRecord) {
        let info = &record.info;
        if let Some(deadline) = info.deadline_micros {
            self.deadlines.remove(&(deadline, info.id));
        }
        if is_default_key(info) {
            for &(attempt, _) in &record.asks {
                let key = (info.execution.clone(), attempt, info.text.clone());
                if let Some(n) = self.default_asks.get_mut(&key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.default_asks.remove(&key);
                    }
                }
            }
        }
    }
}

/// True when a question's key is a default one, `TEXT#N`.
fn is_default_key(info: &QuestionInfo) -> bool {
    info.key
        .strip_prefix(info.text.as_str())
        .is_some_and(|rest| rest.starts_with('#'))
}

impl Gates {
    /// The registry of what the store holds. A record that does not
    /// decode is logged and left out (the rest of the daemon goes on).
    pub fn load(snapshot: GatesSnapshot) -> Gates {
        let mut registry = Registry {
            next_question_id: snapshot.next_question_id.max(1),
            next_message_id: snapshot.next_message_id.max(1),
            inbox: snapshot.inbox_counts.into_iter().collect(),
            ..Registry::default()
        };
        for (execution, id, bytes) in snapshot.questions {
            match postcard::from_bytes::<QuestionRecord>(&bytes) {
                Ok(record) => registry.adopt(record),
                Err(e) => {
                    tracing::error!("question {id} of execution {execution} does not decode: {e}")
                }
            }
        }
        Gates {
            state: Mutex::new(registry),
            questions_changed: watch::Sender::new(0),
            inbox_changed: watch::Sender::new(0),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// Takes in a question as committed, and wakes its waiters.
    pub(crate) fn adopt(&self, record: QuestionRecord) {
        lock(&self.state).adopt(record);
        self.questions_changed.send_modify(|n| *n += 1);
    }

    /// A question by id.
    pub fn record(&self, id: u64) -> Option<QuestionRecord> {
        lock(&self.state).questions.get(&id).cloned()
    }

    /// The question recorded for `nonce`, or else under `key`, of an execution.
    pub(crate) fn find(&self, execution: &str, nonce: u64, key: Option<&str>) -> FindAsk {
        let state = lock(&self.state);
        if let Some(id) = state.nonces.get(&(execution.to_owned(), nonce)) {
            if let Some(record) = state.questions.get(id) {
                return FindAsk::Nonce(record.clone());
            }
        }
        let key = key.map(str::to_owned);
        match key.and_then(|key| state.keys.get(&(execution.to_owned(), key))) {
            Some(id) => state
                .questions
                .get(id)
                .cloned()
                .map_or(FindAsk::None, FindAsk::Key),
            None => FindAsk::None,
        }
    }

    /// How many asks attempt `attempt` of an execution made of `text`
    /// under default keys: the `N` of its next default key `TEXT#N`.
    pub(crate) fn asked_before(&self, execution: &str, attempt: u32, text: &str) -> usize {
        let key = (execution.to_owned(), attempt, text.to_owned());
        lock(&self.state)
            .default_asks
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    /// The next question id, taken (never given twice, even when the
    /// commit that was to record it fails).
    pub(crate) fn take_question_id(&self) -> u64 {
        let mut state = lock(&self.state);
        let id = state.next_question_id;
        state.next_question_id += 1;
        id
    }

    /// The next message id, taken as [`Gates::take_question_id`] is.
    pub(crate) fn take_message_id(&self) -> u64 {
        let mut state = lock(&self.state);
        let id = state.next_message_id;
        state.next_message_id += 1;
        id
    }

    /// The open questions of an execution, oldest first.
    pub fn open_of(&self, execution: &str) -> Vec<QuestionRecord> {
        let state = lock(&self.state);
        let Some(ids) = state.open.get(execution) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|id| state.questions.get(id).cloned())
            .collect()
    }

    /// The text of the oldest open question attempt `attempt` of an
    /// execution asked: while there is one, a running execution is shown
    /// `waiting`, with this as its reason.
    pub fn waiting_on(&self, execution: &str, attempt: u32) -> Option<String> {
        let state = lock(&self.state);
        let ids = state.open.get(execution)?;
        ids.iter()
            .filter_map(|id| state.questions.get(id))
            .find(|r| r.asks.iter().any(|(a, _)| *a == attempt))
            .map(|r| r.info.text.clone())
    }

    /// Questions with ids above `after` (of one execution, if given),
    /// open ones only unless `all`, in id order.
    pub fn list(&self, all: bool, execution: Option<&str>, after: u64) -> Vec<QuestionInfo> {
        let state = lock(&self.state);
        let mine = |r: &&QuestionRecord| execution.is_none_or(|e| r.info.execution == e);
        if all {
            return state
                .questions
                .range(after.saturating_add(1)..)
                .map(|(_, r)| r)
                .filter(mine)
                .map(|r| r.info.clone())
                .collect();
        }
        let mut ids: Vec<u64> = match execution {
            Some(e) => state.open.get(e).into_iter().flatten().copied().collect(),
            None => state.open.values().flatten().copied().collect(),
        };
        ids.retain(|&id| id > after);
        ids.sort_unstable();
        ids.iter()
            .filter_map(|id| state.questions.get(id))
            .map(|r| r.info.clone())
            .collect()
    }

    /// The open questions whose deadline is at or before `now`, soonest
    /// first, and the first deadline after `now`, if any.
    pub(crate) fn deadlines(&self, now: u64) -> (Vec<u64>, Option<u64>) {
        let state = lock(&self.state);
        let overdue = state
            .deadlines
            .range(..=(now, u64::MAX))
            .map(|&(_, id)| id)
            .collect();
        let next = state
            .deadlines
            .range((now.saturating_add(1), 0)..)
            .next()
            .map(|&(deadline, _)| deadline);
        (overdue, next)
    }

    /// How many questions are open, across every execution.
    pub fn open_count(&self) -> u64 {
        lock(&self.state)
            .open
            .values()
            .map(|s| s.len() as u64)
            .sum()
    }

    /// How many messages wait in an execution's inbox.
    pub fn inbox_count(&self, execution: &str) -> u64 {
        lock(&self.state).inbox.get(execution).copied().unwrap_or(0)
    }

    /// How many messages wait, across every inbox.
    pub fn inbox_total(&self) -> u64 {
        lock(&self.state).inbox.values().sum()
    }

    /// Counts a message queued (committed), and wakes receivers.
    pub(crate) fn queued(&self, execution: &str) {
        *lock(&self.state)
            .inbox
            .entry(execution.to_owned())
            .or_insert(0) += 1;
        self.inbox_changed.send_modify(|n| *n += 1);
    }

    /// Counts `removed` messages dequeued (committed).
    pub(crate) fn dequeued(&self, execution: &str, removed: u64) {
        let mut state = lock(&self.state);
        if let Some(n) = state.inbox.get_mut(execution) {
            *n = n.saturating_sub(removed);
            if *n == 0 {
                state.inbox.remove(execution);
            }
        }
    }

    /// Forgets removed executions' questions and inboxes (committed).
    pub(crate) fn forget(&self, executions: &[String]) {
        let mut state = lock(&self.state);
        for execution in executions {
            state.open.remove(execution);
            state.inbox.remove(execution);
            let gone: Vec<u64> = state
                .questions
                .values()
                .filter(|r| r.info.execution == *execution)
                .map(|r| r.info.id)
                .collect();
            for id in gone {
                if let Some(record) = state.questions.remove(&id) {
                    state.unindex(&record);
                }
            }
            state.keys.retain(|(e, _), _| e != execution);
            state.nonces.retain(|(e, _), _| e != execution);
        }
        drop(state);
        self.questions_changed.send_modify(|n| *n += 1);
    }

    /// Wakes on every question recorded or closed.
    pub fn watch_questions(&self) -> watch::Receiver<u64> {
        self.questions_changed.subscribe()
    }

    /// Wakes on every message queued.
    pub fn watch_inbox(&self) -> watch::Receiver<u64> {
        self.inbox_changed.subscribe()
    }
}

/// What [`Gates::find`] found for an ask.
#[derive(Debug)]
pub(crate) enum FindAsk {
    /// The question this very ask (its nonce) recorded or found before.
    Nonce(QuestionRecord),
    /// The question recorded under the ask's key, by another ask.
    Key(QuestionRecord),
    None,
}
