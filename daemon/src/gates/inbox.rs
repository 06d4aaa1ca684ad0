//! `Send`, `Recv` and `Dequeue`: an execution's inbox. Messages stay
//! until the receiver says it has shown them (`Dequeue`), so a receiver
//! that dies in between gets them again.

use bytes::Bytes;
use tether_protocol::InboxMessage;
use tokio::time::Instant;

use super::questions::deadline_after;
use crate::engine::{GateChange, GateOutcome, Queue};
use crate::supervisor::{state, Supervisor};
use crate::{Error, Result};
use tether_protocol::time::now_micros;

/// What bounds an inbox.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Messages one execution's inbox holds at most.
    pub max_messages: u64,
    /// The largest message, in bytes (one must fit in an answer).
    pub max_bytes: usize,
}

/// Queues a message; its id once it is durable.
pub async fn send(
    queue: &Queue,
    supervisor: &Supervisor,
    execution: &str,
    data: Bytes,
    sender_uid: u32,
    limits: Limits,
) -> Result<u64> {
    if data.len() > limits.max_bytes {
        return Err(Error::InvalidRequest(format!(
            "a message of {} bytes is more than the limit of {} bytes",
            data.len(),
            limits.max_bytes
        )));
    }
    let gates = queue.gates();
    let _turn = gates.changing.lock().await;
    let info = supervisor.get(execution)?;
    if state::is_final(info.state) {
        return Err(Error::InvalidRequest(format!(
            "execution {execution} has ended ({}): its inbox takes no messages",
            info.state.as_str()
        )));
    }
    let waiting = gates.inbox_count(execution);
    if waiting >= limits.max_messages {
        return Err(Error::InvalidRequest(format!(
            "the inbox of execution {execution} is full: {waiting} messages wait \
             ([inbox] max_messages)"
        )));
    }
    let id = gates.take_message_id();
    let message = InboxMessage {
        id,
        sent_micros: now_micros(),
        sender_uid,
        data,
    };
    let change = GateChange::Send {
        execution: execution.to_owned(),
        message,
        next_id: id + 1,
    };
    queue.gate(change).await?;
    gates.queued(execution);
    Ok(id)
}

/// The oldest messages (at most `max`, and no more than `max_bytes`
/// together but always one), waiting up to `wait_ms` (capped) for one.
pub async fn recv(
    queue: &Queue,
    execution: &str,
    max: u32,
    wait_ms: u64,
    max_bytes: usize,
) -> Result<Vec<InboxMessage>> {
    let gates = queue.gates();
    let mut changed = gates.watch_inbox();
    let deadline = deadline_after(wait_ms);
    let max = usize::try_from(max).unwrap_or(usize::MAX).max(1);
    loop {
        changed.borrow_and_update();
        if gates.inbox_count(execution) > 0 {
            let messages = queue.inbox(execution, max, max_bytes).await?;
            if !messages.is_empty() {
                return Ok(messages);
            }
        }
        if wait_ms == 0 || Instant::now() >= deadline {
            return Ok(Vec::new());
        }
        tokio::select! {
            result = changed.changed() => if result.is_err() { return Ok(Vec::new()) },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// Removes the messages up to `through`; how many there were.
pub async fn dequeue(queue: &Queue, execution: &str, through: u64) -> Result<u64> {
    let gates = queue.gates();
    let _turn = gates.changing.lock().await;
    let change = GateChange::Dequeue {
        execution: execution.to_owned(),
        through,
    };
    match queue.gate(change).await? {
        GateOutcome::Dequeued(n) => {
            gates.dequeued(execution, n);
            Ok(n)
        }
        _ => Err(Error::Invariant(
            "internal error: a dequeue answered with something else".into(),
        )),
    }
}
