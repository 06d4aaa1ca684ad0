//! Live fan-out of committed frames to followers.
//!
//! The writer calls [`Hub::publish`] after every commit; a follower
//! [`Hub::register`]s for one stream and receives every batch committed
//! after that moment. Registration and publication take the same mutex, and
//! registration returns the stream's last committed seq at that instant, so
//! a follower that has read the store through that seq and then takes live
//! batches misses nothing in between.
//!
//! Memory is bounded per follower: each one has a byte budget for batches
//! queued to it and not yet received. A publication that would exceed it
//! drops that follower's sender instead of queueing; the follower sees its
//! channel end, reads what it missed from the store and registers again.
//! Nothing is buffered without bound, whatever a reader does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tether_protocol::Frame;
use tokio::sync::mpsc;

use crate::{Error, Result};

/// Bytes of batches that may wait for one follower by default.
pub const DEFAULT_FOLLOWER_BUDGET: usize = 256 * 1024;

/// What a frame costs in the budget beyond its payload: the seq, the frame
/// header and the batch bookkeeping, rounded up. It keeps empty payloads from
/// being free.
pub const FRAME_OVERHEAD: usize = 64;

/// Frames committed together, in seq order, contiguous. Shared by every
/// follower of the stream.
pub type LiveBatch = Arc<[(u64, Frame)]>;

/// What one commit did to one stream.
#[derive(Debug)]
pub struct StreamUpdate {
    pub stream: String,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Frames the commit stored, in seq order; empty when only the range
    /// changed (compaction).
    pub frames: Vec<(u64, Frame)>,
}

/// The fan-out point shared by the writer and every subscription.
#[derive(Debug)]
pub struct Hub {
    state: Mutex<HubState>,
    budget: usize,
}

#[derive(Debug, Default)]
struct HubState {
    closed: bool,
    next_id: u64,
    streams: HashMap<String, LiveStream>,
}

#[derive(Debug)]
struct LiveStream {
    first_seq: u64,
    last_seq: u64,
    followers: Vec<Follower>,
}

#[derive(Debug)]
struct Follower {
    id: u64,
    tx: mpsc::UnboundedSender<(LiveBatch, usize)>,
    queued: Arc<Gauge>,
}

/// Bytes queued to one follower, and the most there ever were.
#[derive(Debug, Default)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Hub {
    /// A hub allowing `budget` queued bytes per follower.
    pub fn new(budget: usize) -> Self {
        Self {
            state: Mutex::new(HubState::default()),
            budget,
        }
    }

    /// The per-follower byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // The state stays consistent across a panic (every update is a
        // single assignment or push), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the committed ranges of all streams (after loading the store).
    pub fn reset(&self, ranges: impl IntoIterator<Item = (String, u64, u64)>) {
        let mut state = self.lock();
        for (name, first_seq, last_seq) in ranges {
            let live = state.streams.entry(name).or_insert_with(|| LiveStream {
                first_seq,
                last_seq,
                followers: Vec::new(),
            });
            live.first_seq = first_seq;
            live.last_seq = last_seq;
        }
    }

    /// Records one commit and hands its frames to every follower of their
    /// streams. Must be called in commit order, after the commit.
    pub fn publish(&self, updates: Vec<StreamUpdate>) {
        let mut state = self.lock();
        for update in updates {
            let live = state
                .streams
                .entry(update.stream)
                .or_insert_with(|| LiveStream {
                    first_seq: update.first_seq,
                    last_seq: update.last_seq,
                    followers: Vec::new(),
                });
            live.first_seq = update.first_seq;
            live.last_seq = update.last_seq;
            if live.followers.is_empty() || update.frames.is_empty() {
                continue;
            }
            for (batch, cost) in split(update.frames, self.budget / 8) {
                live.followers
                    .retain(|f| offer(f, &batch, cost, self.budget));
            }
        }
    }

    /// Starts following `stream`: every batch committed from now on is
    /// delivered to the returned registration, whose `last_seq` is the
    /// stream's last committed seq at this instant.
    pub fn register(self: &Arc<Self>, stream: &str) -> Result<Registration> {
        let mut state = self.lock();
        if state.closed {
            return Err(Error::ShuttingDown);
        }
        let id = state.next_id;
        state.next_id += 1;
        let live = state
            .streams
            .get_mut(stream)
            .ok_or_else(|| Error::StreamNotFound(stream.to_owned()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Gauge::default());
        live.followers.push(Follower {
            id,
            tx,
            queued: queued.clone(),
        });
        Ok(Registration {
            hub: self.clone(),
            stream: stream.to_owned(),
            id,
            first_seq: live.first_seq,
            last_seq: live.last_seq,
            rx,
            queued,
        })
    }

    fn unregister(&self, stream: &str, id: u64) {
        if let Some(live) = self.lock().streams.get_mut(stream) {
            live.followers.retain(|f| f.id != id);
        }
    }

    /// The committed (first_seq, last_seq) of `stream`; `None` if it does
    /// not exist.
    pub fn range(&self, stream: &str) -> Option<(u64, u64)> {
        self.lock()
            .streams
            .get(stream)
            .map(|s| (s.first_seq, s.last_seq))
    }

    /// How many streams exist.
    pub fn stream_count(&self) -> u64 {
        self.lock().streams.len() as u64
    }

    /// How many followers are registered on `stream`.
    pub fn follower_count(&self, stream: &str) -> usize {
        self.lock()
            .streams
            .get(stream)
            .map_or(0, |s| s.followers.len())
    }

    /// Drops every follower and refuses new ones: followers see their
    /// channels end and fall back to the store, which reports the shutdown.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        for live in state.streams.values_mut() {
            live.followers.clear();
        }
    }
}

/// Queues `batch` for one follower if it fits its budget. Returns whether
/// the follower stays registered.
fn offer(follower: &Follower, batch: &LiveBatch, cost: usize, budget: usize) -> bool {
    let queued = follower.queued.now.load(Ordering::Acquire);
    if queued + cost > budget {
        // Over budget: dropping the sender tells the follower to catch up
        // from the store. The batches already queued stay deliverable.
        return false;
    }
    let now = follower.queued.now.fetch_add(cost, Ordering::AcqRel) + cost;
    follower.queued.peak.fetch_max(now, Ordering::AcqRel);
    if follower.tx.send((batch.clone(), cost)).is_err() {
        follower.queued.now.fetch_sub(cost, Ordering::AcqRel);
        return false;
    }
    true
}

/// What a frame costs in a follower's budget.
pub fn frame_cost(frame: &Frame) -> usize {
    frame.payload.len() + FRAME_OVERHEAD
}

/// Cuts a commit's frames into batches of about `max_cost` bytes, so that
/// one large commit does not by itself exceed a follower's budget.
fn split(frames: Vec<(u64, Frame)>, max_cost: usize) -> Vec<(LiveBatch, usize)> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut cost = 0;
    for item in frames {
        let c = frame_cost(&item.1);
        if !current.is_empty() && cost + c > max_cost {
            out.push((LiveBatch::from(std::mem::take(&mut current)), cost));
            cost = 0;
        }
        cost += c;
        current.push(item);
    }
    if !current.is_empty() {
        out.push((LiveBatch::from(current), cost));
    }
    out
}

/// One follower's place in the hub. Dropping it unregisters.
#[derive(Debug)]
pub struct Registration {
    hub: Arc<Hub>,
    stream: String,
    id: u64,
    /// The stream's first retained seq when the registration was made.
    pub first_seq: u64,
    /// The stream's last committed seq when the registration was made:
    /// every later frame arrives through [`Registration::recv`] unless the
    /// follower falls behind its budget.
    pub last_seq: u64,
    rx: mpsc::UnboundedReceiver<(LiveBatch, usize)>,
    queued: Arc<Gauge>,
}

impl Registration {
    /// The next live batch; `None` once the hub has dropped this follower
    /// (it fell behind, or the daemon is shutting down). Cancel safe.
    pub async fn recv(&mut self) -> Option<LiveBatch> {
        let (batch, cost) = self.rx.recv().await?;
        self.queued.now.fetch_sub(cost, Ordering::AcqRel);
        Some(batch)
    }

    /// Bytes queued to this follower now.
    pub fn queued_bytes(&self) -> usize {
        self.queued.now.load(Ordering::Acquire)
    }

    /// The most bytes ever queued to this follower at once.
    pub fn peak_queued_bytes(&self) -> usize {
        self.queued.peak.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.unregister(&self.stream, self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use bytes::Bytes;
    use tether_protocol::FrameKind;

    use super::*;

    fn frames(seqs: std::ops::RangeInclusive<u64>, len: usize) -> Vec<(u64, Frame)> {
        seqs.map(|seq| {
            (
                seq,
                Frame {
                    ts_micros: seq,
                    kind: FrameKind::Data,
                    payload: Bytes::from(vec![b'x'; len]),
                },
            )
        })
        .collect()
    }

    fn update(stream: &str, seqs: std::ops::RangeInclusive<u64>, len: usize) -> StreamUpdate {
        StreamUpdate {
            stream: stream.into(),
            first_seq: 1,
            last_seq: *seqs.end(),
            frames: frames(seqs, len),
        }
    }

    #[tokio::test]
    async fn registration_sees_exactly_the_frames_after_its_last_seq() {
        let hub = Arc::new(Hub::new(DEFAULT_FOLLOWER_BUDGET));
        hub.publish(vec![update("s", 1..=3, 1)]);
        let mut reg = hub.register("s").unwrap();
        assert_eq!(reg.last_seq, 3);
        hub.publish(vec![update("s", 4..=5, 1), update("other", 1..=1, 1)]);
        let batch = reg.recv().await.unwrap();
        let seqs: Vec<u64> = batch.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [4, 5]);
        assert_eq!(reg.queued_bytes(), 0);
        assert_eq!(hub.range("s"), Some((1, 5)));
        assert_eq!(hub.stream_count(), 2);
    }

    #[tokio::test]
    async fn a_follower_over_budget_is_dropped_and_keeps_what_was_queued() {
        let hub = Arc::new(Hub::new(1000));
        hub.publish(vec![update("s", 1..=1, 1)]);
        let mut reg = hub.register("s").unwrap();
        for seq in 2..=40 {
            hub.publish(vec![update("s", seq..=seq, 36)]);
        }
        assert!(reg.peak_queued_bytes() <= 1000);
        assert_eq!(hub.follower_count("s"), 0);
        let mut next = 2;
        while let Some(batch) = reg.recv().await {
            for (seq, _) in batch.iter() {
                assert_eq!(*seq, next);
                next += 1;
            }
        }
        assert_eq!(next, 12, "ten frames of cost 100 fit the budget of 1000");
    }

    #[test]
    fn dropping_a_registration_unregisters_it() {
        let hub = Arc::new(Hub::new(DEFAULT_FOLLOWER_BUDGET));
        hub.publish(vec![update("s", 1..=1, 1)]);
        let reg = hub.register("s").unwrap();
        assert_eq!(hub.follower_count("s"), 1);
        drop(reg);
        assert_eq!(hub.follower_count("s"), 0);
        assert!(matches!(
            hub.register("nope"),
            Err(Error::StreamNotFound(_))
        ));
        hub.close();
        assert!(matches!(hub.register("s"), Err(Error::ShuttingDown)));
    }

    #[test]
    fn large_commits_are_split_below_the_budget() {
        let parts = split(frames(1..=100, 100), 1000);
        assert!(parts.iter().all(|(_, cost)| *cost <= 1000));
        let seqs: Vec<u64> = parts
            .iter()
            .flat_map(|(b, _)| b.iter().map(|(s, _)| *s))
            .collect();
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    }
}
