//! One mirrored stream: its committed frames published to JetStream in
//! seq order, the acknowledged position stored as the mirror's consumer
//! ack.
//!
//! A round starts by asking JetStream where the stream's subject ends
//! (the `Tether-Seq` of its last message) and goes on after the later of
//! that and the stored ack, so a resend after `kill -9` starts exactly
//! where JetStream stopped, however long the daemon was down. The first
//! publish of a round carries the subject's expected last sequence; the
//! rest carry `Nats-Msg-Id`, which JetStream's duplicate window drops
//! when a failed round is sent again. A round publishes on one
//! connection, which JetStream reads in order, so what it holds of a
//! round is a leading part of it. Any failure ends the round; the next
//! one starts from JetStream's end again.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::HeaderMap;
use tokio::sync::mpsc;

use super::nats::{failed, Nats, NatsError};
use super::{CONSUMER, HEADER_KIND, HEADER_SEQ, HEADER_TS};
use crate::engine::Queue;
use crate::subscription::SubEvent;
use crate::Error;

/// Publishes awaiting their acknowledgement, per stream. Enough to keep
/// NATS busy across a round trip; few enough that a round's resend is
/// small.
const WINDOW: usize = 1024;

/// How often, at most, the acknowledged position is stored while frames
/// flow: each store is a commit of the writer, which producers share.
const STORE_EVERY: Duration = Duration::from_millis(50);

/// The pause before a failed round is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Why a round ended.
enum Stop {
    /// The stream is gone or the daemon is stopping: the task ends.
    Ended,
    /// NATS failed: wait for it.
    Nats(NatsError),
    /// JetStream refused in a way a fresh start resolves (another
    /// publisher on the subject, a lost acknowledgement).
    Resync(String),
    /// The store failed (degraded mode, for one).
    Store(Error),
    /// A publish failed but a later one of the same round was stored
    /// (JetStream refused that one message). JetStream's end is past a
    /// hole, so the next round resends from the seq after this one
    /// instead; the duplicate window drops what is there already.
    Hole(NatsError, u64),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        match e {
            Error::StreamNotFound(_) | Error::ShuttingDown => Stop::Ended,
            e => Stop::Store(e),
        }
    }
}

/// What the publishing half hands the acknowledging half, in seq order.
enum Sent {
    /// A publish of `seq`, to be acknowledged.
    Frame(u64, PublishAckFuture),
    /// Seqs through this one are gone from the store or cannot be
    /// mirrored; nothing waits for them.
    Skip(u64),
}

/// What a stream's task needs.
pub(super) struct Mirrored {
    pub queue: Queue,
    pub nats: Arc<Nats>,
    pub source: String,
    pub stream: String,
    pub subject: String,
    /// The highest seq JetStream has acknowledged (or that was skipped).
    pub position: Arc<AtomicU64>,
}

/// Mirrors the stream until it is removed or the daemon stops.
pub(super) async fn run(m: Mirrored) {
    let mut resend_after = None;
    loop {
        match round(&m, resend_after.take()).await {
            Stop::Ended => return,
            Stop::Nats(e) => m.nats.failed(&e),
            Stop::Hole(e, confirmed) => {
                m.nats.failed(&e);
                resend_after = Some(confirmed);
            }
            Stop::Resync(why) => {
                tracing::debug!(stream = %m.stream, "mirror: starting again: {why}");
                continue;
            }
            Stop::Store(e) => {
                tracing::warn!(stream = %m.stream, "mirror: the store failed: {e}; trying again")
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// One round: resynchronise with JetStream (or start after
/// `resend_after`, see [`Stop::Hole`]), then publish until something
/// fails.
async fn round(m: &Mirrored, resend_after: Option<u64>) -> Stop {
    let stored = match m.queue.open_consumer(&m.stream, CONSUMER).await {
        Ok(ack) => ack,
        Err(e) => return e.into(),
    };
    let end = match m.nats.subject_end(&m.subject).await {
        Ok(end) => end,
        Err(e) => return Stop::Nats(e),
    };
    // One connection for the whole round (see `Nats`).
    let js = match m.nats.context().await {
        Ok(js) => js,
        Err(e) => return Stop::Nats(e),
    };
    m.nats.succeeded();
    let Some((_, last)) = m.queue.stream_range(&m.stream) else {
        return Stop::Ended;
    };
    if end.tether_seq > last {
        tracing::warn!(
            stream = %m.stream,
            "mirror: JetStream holds seq {} of {} but the store ends at {last}; \
             mirroring what follows {last}",
            end.tether_seq,
            m.subject
        );
    }
    let after = match resend_after {
        Some(confirmed) => confirmed.max(stored),
        None => stored.max(end.tether_seq.min(last)),
    };
    if after > stored {
        // JetStream had frames the stored ack did not say (the daemon
        // stopped before storing it): store it now, so compaction may go.
        if let Err(e) = m.queue.ack(&m.stream, CONSUMER, after).await {
            return e.into();
        }
    }
    m.position.store(after, Ordering::Relaxed);
    // The first publish checks that nobody else wrote the subject since
    // it was read; only right after JetStream's own last frame.
    let expect = (resend_after.is_none() && after == end.tether_seq).then_some(end.stream_seq);
    let (tx, rx) = mpsc::channel(WINDOW);
    let publishing = publish(m, &js, after, expect, tx);
    let acknowledging = acknowledge(m, after, rx);
    match tokio::try_join!(publishing, acknowledging) {
        Ok(((), ())) => Stop::Ended,
        Err(stop) => stop,
    }
}

/// Publishes every frame after `after`, in seq order, handing each
/// publish's acknowledgement to [`acknowledge`].
async fn publish(
    m: &Mirrored,
    js: &async_nats::jetstream::Context,
    after: u64,
    mut expect: Option<u64>,
    tx: mpsc::Sender<Sent>,
) -> Result<(), Stop> {
    let mut sub = m.queue.subscribe(&m.stream, after, true)?;
    loop {
        match sub.next().await? {
            SubEvent::Frames(frames) => {
                for (seq, frame) in frames {
                    let mut headers = HeaderMap::new();
                    headers.insert(HEADER_SEQ, seq.to_string().as_str());
                    headers.insert(HEADER_KIND, frame.kind.as_str());
                    headers.insert(HEADER_TS, frame.ts_micros.to_string().as_str());
                    let mut message = PublishMessage::build()
                        .payload(frame.payload)
                        .headers(headers)
                        .message_id(format!("{}:{}:{seq}", m.source, m.stream));
                    if let Some(stream_seq) = expect.take() {
                        message = message.expected_last_subject_sequence(stream_seq);
                    }
                    let sent = match js.send_publish(m.subject.clone(), message).await {
                        Ok(ack) => Sent::Frame(seq, ack),
                        Err(e) if matches!(e.kind(), PublishErrorKind::MaxPayloadExceeded) => {
                            tracing::warn!(
                                stream = %m.stream,
                                "mirror: frame {seq} is larger than NATS accepts; not mirrored"
                            );
                            Sent::Skip(seq)
                        }
                        Err(e) => return Err(Stop::Nats(failed("cannot publish")(&e))),
                    };
                    if tx.send(sent).await.is_err() {
                        // The acknowledging half failed; its error ends
                        // the round.
                        return Ok(());
                    }
                }
            }
            SubEvent::Gap(gap) => {
                let through = gap.first_available.saturating_sub(1);
                tracing::warn!(
                    stream = %m.stream,
                    "mirror: frames {} to {through} were removed before they were mirrored",
                    gap.requested
                );
                expect = None;
                if tx.send(Sent::Skip(through)).await.is_err() {
                    return Ok(());
                }
            }
            // A following subscription ends only by an error, and this
            // one was not asked for encoded frames.
            SubEvent::End { .. } | SubEvent::Encoded { .. } => return Err(Stop::Ended),
        }
    }
}

/// Awaits the acknowledgements in seq order, moving the position and
/// storing it now and then (and whenever publishing pauses).
async fn acknowledge(m: &Mirrored, after: u64, mut rx: mpsc::Receiver<Sent>) -> Result<(), Stop> {
    let mut confirmed = after;
    let mut stored = after;
    let mut last_store = Instant::now();
    loop {
        let next = if confirmed > stored {
            match tokio::time::timeout(STORE_EVERY, rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    m.queue.ack(&m.stream, CONSUMER, confirmed).await?;
                    stored = confirmed;
                    last_store = Instant::now();
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(sent) = next else {
            return Ok(());
        };
        confirmed = match sent {
            Sent::Skip(seq) => seq,
            Sent::Frame(seq, ack) => match ack.await {
                Ok(_) => seq,
                Err(e) if matches!(e.kind(), PublishErrorKind::WrongLastSequence) => {
                    return Err(Stop::Resync(format!("frame {seq}: {e}")));
                }
                Err(e) => {
                    let e = failed("a publish was not acknowledged")(&e);
                    return Err(if later_landed(&mut rx).await {
                        Stop::Hole(e, confirmed)
                    } else {
                        Stop::Nats(e)
                    });
                }
            },
        };
        m.position.store(confirmed, Ordering::Relaxed);
        if last_store.elapsed() >= STORE_EVERY {
            m.queue.ack(&m.stream, CONSUMER, confirmed).await?;
            stored = confirmed;
            last_store = Instant::now();
        }
    }
}

/// Whether any publish still in flight is acknowledged: awaited together,
/// so that a dead connection costs one acknowledgement timeout, not one
/// per publish.
async fn later_landed(rx: &mut mpsc::Receiver<Sent>) -> bool {
    // Closed first, so that nothing is published behind the ones looked at.
    rx.close();
    let mut acks = Vec::new();
    while let Ok(sent) = rx.try_recv() {
        if let Sent::Frame(_, ack) = sent {
            acks.push(ack.into_future());
        }
    }
    futures_util::future::join_all(acks)
        .await
        .iter()
        .any(Result::is_ok)
}
