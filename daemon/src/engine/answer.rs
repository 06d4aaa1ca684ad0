//! Answering a commit: who makes it durable and answers it (the syncer in
//! turn, the syncer with a later commit's sync, or the writer itself), and
//! what it tells the hub and `ps` once it is durable, so that nothing is
//! delivered or acknowledged before.

use std::sync::Arc;
use std::time::Instant;

use tether_protocol::CheckpointRef;
use tokio::sync::OwnedSemaphorePermit;

use super::commands::{Outcome, Reply};
use super::writer::Writer;
use super::{lock, CheckpointRefs};
use crate::hub::{Hub, StreamUpdate};
use crate::metrics::Metrics;
use crate::syncer::{Durable, Then};
use crate::Result;

/// Whether a commit answers consumers' acks alone: nobody waits on those
/// answers closely, so it may share a later commit's sync
/// ([`Syncer::after_sharing`](crate::syncer::Syncer::after_sharing))
/// rather than have one of its own.
fn acks_only<'r>(replies: impl IntoIterator<Item = &'r Reply>) -> bool {
    let mut replies = replies.into_iter().peekable();
    replies.peek().is_some() && replies.all(|r| matches!(r, Reply::Ack(_)))
}

/// Who makes a commit durable and answers it (see [`Writer::answered_by`]).
pub(super) enum AnsweredBy {
    /// The syncer, with the next job's sync
    /// ([`Syncer::after_sharing`](crate::syncer::Syncer::after_sharing)).
    SharedSync,
    /// The writer itself
    /// ([`Syncer::run_here`](crate::syncer::Syncer::run_here)).
    Writer,
    /// The syncer, in turn
    /// ([`Syncer::after`](crate::syncer::Syncer::after)).
    Syncer,
}

/// A committed batch's news for the hub and for `ps`, told once it is
/// durable.
pub(super) struct Publish {
    pub(super) hub: Arc<Hub>,
    pub(super) updates: Vec<StreamUpdate>,
    pub(super) checkpoint_refs: CheckpointRefs,
    pub(super) checkpoints: Vec<(String, CheckpointRef)>,
    pub(super) metrics: Arc<Metrics>,
    /// Streams removed, and executions whose checkpoints were, before
    /// anything this commit created again.
    pub(super) removed_streams: Vec<String>,
    pub(super) removed_executions: Vec<String>,
}

impl Publish {
    /// Makes the commit visible to readers and to `ps`: what must hold
    /// before anyone is answered, so that a reader who was told "appended"
    /// finds the frames.
    fn advance(&mut self) {
        for name in &self.removed_streams {
            self.hub.remove(name);
        }
        if !self.removed_executions.is_empty() {
            let mut refs = lock(&self.checkpoint_refs);
            for execution in &self.removed_executions {
                refs.remove(execution);
            }
        }
        self.hub.advance(&self.updates);
        // Counted here, once durable, and once per commit rather than
        // per frame.
        self.metrics.appended(self.updates.iter().map(|u| {
            let bytes = u.frames.iter().map(|(_, f)| f.payload.len() as u64).sum();
            (u.stream.as_str(), u.frames.len() as u64, bytes)
        }));
        if !self.checkpoints.is_empty() {
            let mut refs = lock(&self.checkpoint_refs);
            for (execution, reference) in self.checkpoints.drain(..) {
                refs.insert(execution, reference);
            }
        }
    }

    /// Hands the commit's frames to the live followers.
    fn deliver(self) {
        self.hub.hand_out(self.updates);
    }
}

impl Writer {
    /// How a commit answering `replies` is made durable and answered
    /// (asked before the commit, for the syncer's head start, and again
    /// after it, when it counts).
    ///
    /// A logged commit of consumers' acks alone shares a later commit's
    /// sync: nobody waits on those answers closely. One command with
    /// nothing queued behind it is a producer waiting on its ack: the
    /// writer has nothing better to do than the syncer's work and is
    /// already awake for it, and with no job waiting on the syncer the
    /// order of answers holds.
    pub(super) fn answered_by<'r>(
        &self,
        logged: bool,
        replies: impl ExactSizeIterator<Item = &'r Reply>,
    ) -> AnsweredBy {
        let commands = replies.len();
        if logged && acks_only(replies) {
            AnsweredBy::SharedSync
        } else if commands == 1 && self.rx.is_empty() && self.syncer.idle() {
            AnsweredBy::Writer
        } else {
            AnsweredBy::Syncer
        }
    }

    /// Once `durable` holds, in order with every commit's: publishes
    /// `publish` and sends `answers`; if it cannot be made to hold, fails
    /// every answer with the reason instead. Gives back `in_flight` either
    /// way. See [`Writer::answered_by`] for who syncs.
    pub(super) fn answer(
        &mut self,
        durable: Durable,
        mut publish: Option<Publish>,
        answers: Vec<(Reply, Result<Outcome>)>,
        in_flight: Vec<OwnedSemaphorePermit>,
    ) {
        let logged = matches!(durable, Durable::Logged(_));
        let answered_by = self.answered_by(logged, answers.iter().map(|(reply, _)| reply));
        let then: Then = Box::new(move |synced| {
            match synced {
                Ok(()) => {
                    // The producers first, the followers after: a
                    // waiting producer sends its next frames sooner, and
                    // followers skip what they already read.
                    if let Some(publish) = &mut publish {
                        publish.advance();
                    }
                    for (reply, result) in answers {
                        reply.send(result);
                    }
                    if let Some(publish) = publish {
                        publish.deliver();
                    }
                }
                Err(e) => {
                    for (reply, _) in answers {
                        reply.fail(e.clone());
                    }
                }
            }
            drop(in_flight);
        });
        match answered_by {
            AnsweredBy::SharedSync => self.syncer.after_sharing(durable, then),
            AnsweredBy::Writer => {
                self.syncer.run_here(durable, then);
                self.answered_alone = Some(Instant::now());
            }
            AnsweredBy::Syncer => self.syncer.after(durable, then),
        }
    }
}
