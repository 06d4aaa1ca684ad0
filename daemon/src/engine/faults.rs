//! Failed writes and degraded mode (see [`crate::degraded`]) on the
//! writer. After a failed write the writer reloads its caches from what is
//! stored. When the store itself failed (a full disk, a failed sync), it
//! enters degraded mode: writes are refused with the fault, valid acks are
//! held and answered, background work rests, and the store is retried on a
//! timer; once it can be written again, the held acks are recorded.

use std::time::Instant;

use tether_protocol::validate_name;
use tokio::sync::OwnedSemaphorePermit;

use super::commands::{Outcome, Reply, Request};
use super::writer::Writer;
use crate::degraded::{Degradation, Fault};
use crate::syncer::Durable;
use crate::{Error, Result};

impl Writer {
    /// Enters degraded mode for `fault`, unless already in it.
    pub(super) fn degrade(&mut self, fault: Fault) {
        self.healthy = false;
        if self.degraded.is_none() {
            let cleared = self.cleared_at.as_ref().map(|(at, fault)| (*at, fault));
            let began = Degradation::begin(fault, &self.health, Instant::now(), cleared);
            self.degraded = Some(began);
        }
    }

    /// Tries the store again while degraded: reopens it if redb failed,
    /// makes the log trustworthy again after a failed sync, checks that
    /// the write that failed would now find room, and commits durably. If
    /// that works, writing resumes and the acks held meanwhile are
    /// recorded; otherwise the next try is scheduled.
    pub(super) fn retry_storage(&mut self) {
        let Some(mut degraded) = self.degraded.take() else {
            return;
        };
        match self.try_storage() {
            Ok(()) => {
                let now = Instant::now();
                self.cleared_at = Some((now, degraded.clear(&self.health, now)));
                self.record_held_acks();
            }
            Err(e) => {
                degraded.retry_failed(Fault::of(&e), &self.health, Instant::now());
                self.degraded = Some(degraded);
            }
        }
    }

    fn try_storage(&mut self) -> Result<()> {
        self.store.recover()?;
        if self.syncer.failure().is_some() {
            // After a failed sync nothing appended since the last good one
            // can be trusted to be on disk: what this process wrote is
            // written again, from its own view of the log, and synced. A
            // failure here is the cause now (the newest, shown alone).
            self.store.rewrite_log()?;
        }
        // Room for the batch that failed, checked as its commit does, so
        // that the store is not called writable only for that batch to be
        // refused again at once; and nothing is committed durably (which may free
        // the log's file) while there is none, so that a full disk stays
        // one fault rather than a series of short ones.
        let batch = self.opts.max_batch_bytes as u64;
        self.store.room_again(batch)?;
        self.store.commit_durably()?;
        // Not wrapping, the durable commit may have emptied the log's file.
        self.store.room_again(batch)?;
        // The durable commit ends the failed sync's effect; the writer
        // must see that before its next commit.
        self.syncer.after(Durable::Committed, Box::new(|_| {}));
        self.syncer.wait_for_jobs();
        let snapshot = self.store.load()?;
        self.install(snapshot);
        self.healthy = true;
        Ok(())
    }

    /// Records the acks held while degraded, in one commit of their own.
    fn record_held_acks(&mut self) {
        if self.held_acks.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held_acks);
        let store = self.store.clone();
        let committed = store.write_logged(
            |txn| {
                for ((stream, consumer), through) in &held {
                    // Checked when held; a stream removed since is skipped.
                    let _refused = self.apply_ack(txn, stream, consumer, *through)?;
                }
                Ok(())
            },
            |_| {},
        );
        match committed {
            Ok(((), durable)) => self.syncer.after_sharing(durable, Box::new(|_| {})),
            Err(e) => {
                tracing::debug!("recording the acks held while degraded failed: {e}");
                self.held_acks = held;
                self.after_failure("recording held acks", &e);
            }
        }
    }

    /// Answers a batch while degraded, without touching the store: acks
    /// that are valid are held (and answered), a consumer already known
    /// is answered from the caches, and every other request is refused
    /// with the fault, so that its sender keeps what it sent and retries.
    pub(super) fn refuse_while_degraded(
        &mut self,
        requests: Vec<Request>,
        replies: Vec<Reply>,
        in_flight: Vec<OwnedSemaphorePermit>,
    ) {
        let Some(fault) = self.degraded.as_ref().map(|d| d.fault().clone()) else {
            return;
        };
        let answers = requests
            .into_iter()
            .zip(replies)
            .map(|(request, reply)| {
                let result = match request {
                    Request::Ack {
                        stream,
                        consumer,
                        through_seq,
                    } => self.hold_ack(stream, consumer, through_seq),
                    Request::OpenConsumer { stream, consumer } => self
                        .state
                        .streams
                        .get(&stream)
                        .and_then(|s| s.consumers.get(&consumer))
                        .map(|&acked| {
                            let held = self.held_acks.get(&(stream.clone(), consumer.clone()));
                            Outcome::Consumer(held.copied().unwrap_or(acked).max(acked))
                        })
                        .ok_or_else(|| fault.refusal()),
                    _ => Err(fault.refusal()),
                };
                (reply, result)
            })
            .collect();
        self.answer(Durable::Nothing, None, answers, in_flight);
    }

    /// Holds a consumer's ack while degraded, after the checks
    /// `apply_ack` makes.
    fn hold_ack(&mut self, stream: String, consumer: String, through_seq: u64) -> Result<Outcome> {
        validate_name("consumer", &consumer)?;
        let Some(s) = self.state.streams.get(&stream) else {
            return Err(Error::StreamNotFound(stream));
        };
        if through_seq > s.meta.last_seq {
            return Err(Error::InvalidRequest(format!(
                "ack through seq {through_seq} is beyond the last seq {} of stream {stream}",
                s.meta.last_seq
            )));
        }
        let held = self.held_acks.entry((stream, consumer)).or_insert(0);
        *held = (*held).max(through_seq);
        Ok(Outcome::Done)
    }

    /// Reopens the store and reloads the caches after a failed commit.
    pub(super) fn recover(&mut self) -> Result<()> {
        self.store.recover()?;
        let snapshot = self.store.load()?;
        self.install(snapshot);
        self.healthy = true;
        Ok(())
    }

    /// After a failed write: a fault of the store's enters degraded mode
    /// (logged there, once); the caches are reloaded from what is stored
    /// when the store can still be read, and otherwise at the next retry.
    pub(super) fn after_failure(&mut self, what: &str, e: &Error) {
        self.healthy = false;
        match Fault::of(e) {
            Some(fault) => {
                tracing::debug!("{what} failed: {e}");
                self.degrade(fault);
                if let Ok(snapshot) = self.store.load() {
                    self.install(snapshot);
                }
            }
            None => {
                tracing::warn!("{what} failed: {e}");
                if let Err(e) = self.recover() {
                    tracing::warn!("reloading the store after a failed {what} failed: {e}");
                }
            }
        }
    }
}
