//! Live fan-out of committed frames to followers.
//!
//! Once a commit is durable its ranges are recorded ([`Hub::advance`]) and
//! then its frames handed out ([`Hub::hand_out`]); a follower
//! [`Hub::register`]s for one stream and receives every batch handed out
//! after that moment. Registration returns the stream's last recorded seq
//! at that instant, under the same mutex, so a follower that has read the
//! store through that seq and then takes live batches misses nothing in
//! between (and skips what it is handed twice).
//!
//! Memory is bounded per follower: each one has a byte budget for batches
//! queued to it and not yet received. A publication that would exceed it
//! drops that follower's sender instead of queueing; the follower sees its
//! channel end, reads what it missed from the store and registers again.
//! Nothing is buffered without bound, whatever a reader does.
//!
//! The budget has two tiers. Every follower may hold its base budget
//! ([`FollowerBudget::base`]); a follower may go on up to
//! [`FollowerBudget::burst`] only while the bytes queued to all followers
//! together stay under [`FollowerBudget::shared`]. A busy follower that is
//! a commit or two behind a producer with a deep window then stays live
//! instead of re-reading from the store what the hub had in memory, while
//! many stalled followers still hold no more than their base each: the
//! hub's worst case is followers × base + shared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tether_protocol::Frame;
use tokio::sync::mpsc;

use crate::{Error, Result};

/// Bytes of batches that may wait for one follower by default, whatever
/// the others hold.
pub const DEFAULT_FOLLOWER_BUDGET: usize = 256 * 1024;

/// How much one follower may hold by default while the hub as a whole is
/// under its shared allowance.
pub const DEFAULT_FOLLOWER_BURST: usize = 1024 * 1024;

/// Bytes queued to all followers together above which no follower goes
/// past its base budget, by default.
pub const DEFAULT_SHARED_QUEUE: usize = 16 * 1024 * 1024;

/// How many queued bytes a follower may hold (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerBudget {
    /// Always allowed.
    pub base: usize,
    /// Allowed while the hub's total is under `shared`.
    pub burst: usize,
    /// The hub-wide total that ends bursting.
    pub shared: usize,
}

impl Default for FollowerBudget {
    fn default() -> Self {
        Self {
            base: DEFAULT_FOLLOWER_BUDGET,
            burst: DEFAULT_FOLLOWER_BURST,
            shared: DEFAULT_SHARED_QUEUE,
        }
    }
}

impl FollowerBudget {
    /// A single tier: every follower may hold `bytes`, no more.
    pub fn flat(bytes: usize) -> Self {
        Self {
            base: bytes,
            burst: bytes,
            shared: 0,
        }
    }

    /// The most one follower can ever hold.
    pub fn max(&self) -> usize {
        self.base.max(self.burst)
    }
}

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
    budget: FollowerBudget,
    /// Bytes queued to all followers together, received or not yet.
    queued_total: Arc<AtomicUsize>,
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

/// Bytes queued to one follower, and the most there ever were. Every change
/// of `now` is made to the hub's total too.
#[derive(Debug)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
    total: Arc<AtomicUsize>,
}

impl Gauge {
    fn add(&self, bytes: usize) {
        let now = self.now.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak.fetch_max(now, Ordering::AcqRel);
        self.total.fetch_add(bytes, Ordering::AcqRel);
    }

    fn sub(&self, bytes: usize) {
        self.now.fetch_sub(bytes, Ordering::AcqRel);
        self.total.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl Hub {
    /// A hub allowing each follower `budget`.
    pub fn new(budget: FollowerBudget) -> Self {
        Self {
            state: Mutex::new(HubState::default()),
            budget,
            queued_total: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Bytes queued to all followers together.
    pub fn queued_bytes(&self) -> usize {
        self.queued_total.load(Ordering::Acquire)
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

    /// Records the committed ranges of one commit: readers see them from
    /// now on. Must be called in commit order, once the commit is durable.
    pub fn advance(&self, updates: &[StreamUpdate]) {
        let mut state = self.lock();
        for update in updates {
            if let Some(live) = state.streams.get_mut(&update.stream) {
                live.first_seq = update.first_seq;
                live.last_seq = update.last_seq;
            } else {
                state.streams.insert(
                    update.stream.clone(),
                    LiveStream {
                        first_seq: update.first_seq,
                        last_seq: update.last_seq,
                        followers: Vec::new(),
                    },
                );
            }
        }
    }

    /// Hands the frames of a commit already [advanced](Hub::advance) to
    /// every follower of their streams. A follower registered in between
    /// is handed frames it also reads from the store, which it skips.
    pub fn hand_out(&self, updates: Vec<StreamUpdate>) {
        let mut state = self.lock();
        for update in updates {
            let Some(live) = state.streams.get_mut(&update.stream) else {
                continue;
            };
            if live.followers.is_empty() || update.frames.is_empty() {
                continue;
            }
            for (batch, cost) in split(update.frames, self.budget.base / 8) {
                live.followers
                    .retain(|f| offer(f, &batch, cost, &self.budget));
            }
        }
    }

    /// Forgets a removed stream. Its followers' channels end, and they
    /// fall back to the store, which no longer has it.
    pub fn remove(&self, stream: &str) {
        self.lock().streams.remove(stream);
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
        let queued = Arc::new(Gauge {
            now: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            total: self.queued_total.clone(),
        });
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

    /// Every stream's name with its committed last seq.
    pub fn last_seqs(&self) -> Vec<(String, u64)> {
        let state = self.lock();
        state
            .streams
            .iter()
            .map(|(name, s)| (name.clone(), s.last_seq))
            .collect()
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
fn offer(follower: &Follower, batch: &LiveBatch, cost: usize, budget: &FollowerBudget) -> bool {
    let gauge = &follower.queued;
    let after = gauge.now.load(Ordering::Acquire) + cost;
    let fits = after <= budget.base
        || (after <= budget.burst && gauge.total.load(Ordering::Acquire) + cost <= budget.shared);
    if !fits {
        // Over budget: dropping the sender tells the follower to catch up
        // from the store. The batches already queued stay deliverable.
        return false;
    }
    gauge.add(cost);
    if follower.tx.send((batch.clone(), cost)).is_err() {
        gauge.sub(cost);
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
        self.queued.sub(cost);
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
        // Unregistered first, so that nothing is queued after the batches
        // still waiting are counted out of the hub's total.
        self.hub.unregister(&self.stream, self.id);
        let waiting = self.queued.now.load(Ordering::Acquire);
        self.queued.sub(waiting);
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

    /// One commit, told to the hub as the writer tells it.
    fn publish(hub: &Hub, updates: Vec<StreamUpdate>) {
        hub.advance(&updates);
        hub.hand_out(updates);
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
        let hub = Arc::new(Hub::new(FollowerBudget::default()));
        publish(&hub, vec![update("s", 1..=3, 1)]);
        let mut reg = hub.register("s").unwrap();
        assert_eq!(reg.last_seq, 3);
        publish(&hub, vec![update("s", 4..=5, 1), update("other", 1..=1, 1)]);
        let batch = reg.recv().await.unwrap();
        let seqs: Vec<u64> = batch.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [4, 5]);
        assert_eq!(reg.queued_bytes(), 0);
        assert_eq!(hub.range("s"), Some((1, 5)));
        assert_eq!(hub.stream_count(), 2);
    }

    #[tokio::test]
    async fn advance_shows_a_commit_to_readers_before_its_frames_are_handed_out() {
        let hub = Arc::new(Hub::new(FollowerBudget::default()));
        publish(&hub, vec![update("s", 1..=3, 1)]);
        let mut before = hub.register("s").unwrap();
        let commit = vec![update("s", 4..=5, 1), update("new", 1..=2, 1)];
        hub.advance(&commit);
        assert_eq!(hub.range("s"), Some((1, 5)));
        assert_eq!(hub.range("new"), Some((1, 2)));
        assert!(before.rx.try_recv().is_err(), "nothing handed out yet");
        // Registered in between: it reads 4..=5 from the store, and is
        // also handed them live (a subscription skips what it has read).
        let mut between = hub.register("s").unwrap();
        assert_eq!(between.last_seq, 5);
        hub.hand_out(commit);
        for reg in [&mut before, &mut between] {
            let batch = reg.recv().await.unwrap();
            let seqs: Vec<u64> = batch.iter().map(|(s, _)| *s).collect();
            assert_eq!(seqs, [4, 5]);
        }
        assert_eq!(hub.range("s"), Some((1, 5)));
    }

    #[tokio::test]
    async fn a_follower_over_budget_is_dropped_and_keeps_what_was_queued() {
        let hub = Arc::new(Hub::new(FollowerBudget::flat(1000)));
        publish(&hub, vec![update("s", 1..=1, 1)]);
        let mut reg = hub.register("s").unwrap();
        for seq in 2..=40 {
            publish(&hub, vec![update("s", seq..=seq, 36)]);
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

    /// Publishes frames of cost 100 to `stream`, one at a time from seq
    /// `from`, until its follower is dropped; returns how many it took.
    fn fill_until_dropped(hub: &Hub, stream: &str, from: u64) -> u64 {
        let mut seq = from;
        while hub.follower_count(stream) > 0 {
            publish(hub, vec![update(stream, seq..=seq, 36)]);
            seq += 1;
        }
        seq - from - 1
    }

    #[tokio::test]
    async fn a_follower_bursts_past_its_base_only_while_the_hub_has_room() {
        let budget = FollowerBudget {
            base: 1000,
            burst: 3000,
            shared: 4000,
        };
        let hub = Arc::new(Hub::new(budget));
        publish(&hub, vec![update("a", 1..=1, 1), update("b", 1..=1, 1)]);
        let mut a = hub.register("a").unwrap();
        let mut b = hub.register("b").unwrap();
        // Alone, "a" takes its whole burst: 30 frames of cost 100.
        assert_eq!(fill_until_dropped(&hub, "a", 2), 30);
        assert_eq!(hub.queued_bytes(), 3000);
        // With 3000 of the shared 4000 held by "a", "b" gets 1000 more
        // before it reaches its base, and no burst.
        assert_eq!(fill_until_dropped(&hub, "b", 2), 10);
        assert_eq!(hub.queued_bytes(), 4000);
        while a.recv().await.is_some() {}
        assert_eq!(hub.queued_bytes(), 1000);
        drop(b.recv().await);
        drop(b);
        assert_eq!(
            hub.queued_bytes(),
            0,
            "a dropped registration's batches are counted out"
        );
    }

    #[test]
    fn dropping_a_registration_unregisters_it() {
        let hub = Arc::new(Hub::new(FollowerBudget::default()));
        publish(&hub, vec![update("s", 1..=1, 1)]);
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
