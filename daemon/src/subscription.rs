//! A subscription: "every frame of a stream after seq K", as a gap-free
//! series of events.
//!
//! A subscription reads the store in bounded chunks until it has caught up
//! with the stream, then registers with the [`Hub`] and takes live batches.
//! The registration's `last_seq` tells it which seqs the live channel will
//! carry; anything older it reads from the store first. When the hub drops
//! it (it fell behind its byte budget) it goes back to reading the store and
//! registers again once caught up. Live frames below the next expected seq
//! are skipped, so the hand-over between the two sources never repeats a
//! seq, and a live batch that starts beyond it sends the subscription back
//! to the store, so none is skipped either.
//!
//! The only way a seq is not delivered is a [`Gap`]: emitted exactly when the
//! next expected seq is below the stream's first retained one (it was
//! compacted or expired).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tether_protocol::codec::{encode_durable, encode_live};
use tether_protocol::{Frame, FrameView, Gap};

use crate::hub::{Hub, Registration};
use crate::store::{FrameSink, ReadChunk, ReadLimits, Store, StoredFrame};
use crate::{Error, Result};

/// Frames read from the store at once, at most.
pub const READ_MAX_FRAMES: usize = 2048;
/// Payload bytes read from the store at once, at most (one larger frame is
/// still read on its own). Each read is a hand-over to a blocking thread
/// and back, and those wake-ups were a third of a replay's CPU: with
/// 256 KiB instead of 128, W1's replay took a fifth less CPU per frame
/// (eight alternated pairs: 0.23-0.30 against 0.30-0.39 µs) and ran at
/// 2.95-4.07M frames/s against 2.29-3.17M. The price is memory per
/// reading subscription (at most one read waiting and one being written):
/// 500 followers with 100 stalled peaked at 99 MiB against 85.
pub const READ_MAX_BYTES: usize = 256 * 1024;

/// One step of a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubEvent {
    /// Stored frames with their seqs: non-empty, ascending, contiguous, and
    /// starting at the seq after the previous event's last.
    Frames(Vec<(u64, Frame)>),
    /// Frames like [`SubEvent::Frames`], already encoded in the
    /// subscription's [`WireForm`]: what the session writes to its socket
    /// as it is. `last_seq` is the last one's seq.
    Encoded { wire: Bytes, last_seq: u64 },
    /// Frames from `requested` were compacted, expired or lost to damage
    /// (a range `tetherd repair` recorded); the next frame
    /// delivered is `first_available`.
    Gap(Gap),
    /// A non-following subscription delivered everything through
    /// `last_seq`. Every later call returns it again.
    End { last_seq: u64 },
}

/// How a session sends frames. A subscription given one delivers its
/// frames already encoded ([`SubEvent::Encoded`]): store reads are encoded
/// on the blocking thread that reads them, each payload copied once from
/// the store's page to the bytes the socket is sent, and live batches by
/// the subscription's own task rather than the session's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireForm {
    /// `Response::Durable`, with seqs.
    Durable,
    /// `Response::Live`, without.
    Live,
}

/// A durable subscription to one stream. See the module documentation.
#[derive(Debug)]
pub struct Subscription {
    stream: String,
    store: Arc<Store>,
    hub: Arc<Hub>,
    /// The next seq to deliver.
    next_seq: u64,
    /// For a non-following subscription: the last seq to deliver.
    end: Option<u64>,
    /// Present while following live.
    live: Option<Registration>,
    /// The most bytes ever queued to any of this subscription's
    /// registrations; kept across re-registrations.
    peak_queued: usize,
    /// When set, frames are delivered encoded in this form.
    wire: Option<WireForm>,
}

impl Subscription {
    /// A subscription delivering `next_seq` onwards; through `end` when
    /// given, else forever. Callers check that the stream exists.
    pub(crate) fn new(
        store: Arc<Store>,
        hub: Arc<Hub>,
        stream: &str,
        next_seq: u64,
        end: Option<u64>,
    ) -> Self {
        Self {
            stream: stream.to_owned(),
            store,
            hub,
            next_seq,
            end,
            live: None,
            peak_queued: 0,
            wire: None,
        }
    }

    /// Has frames delivered encoded in `form` from now on.
    pub fn encode_as(&mut self, form: WireForm) {
        self.wire = Some(form);
    }

    /// A following subscription that starts at an existing registration,
    /// with no replay: the first frame delivered is the first one committed
    /// after `registration` was made.
    pub(crate) fn from_registration(
        store: Arc<Store>,
        hub: Arc<Hub>,
        stream: &str,
        registration: Registration,
    ) -> Self {
        let mut sub = Self::new(store, hub, stream, registration.last_seq + 1, None);
        sub.live = Some(registration);
        sub
    }

    /// The stream this subscription reads.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The seq the next delivered frame will have (unless a gap intervenes).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The most bytes the hub ever held queued for this subscription. Never
    /// above the most the hub lets one follower hold.
    pub fn peak_queued_bytes(&self) -> usize {
        let current = self
            .live
            .as_ref()
            .map_or(0, Registration::peak_queued_bytes);
        self.peak_queued.max(current)
    }

    /// The next event. Cancel safe: if the future is dropped before it
    /// completes, nothing was consumed and the next call picks up at the
    /// same seq.
    pub async fn next(&mut self) -> Result<SubEvent> {
        loop {
            if let Some(end) = self.end {
                if self.next_seq > end {
                    return Ok(SubEvent::End { last_seq: end });
                }
            }
            if self.live_covers_next() {
                match self.recv_live().await? {
                    Some(event) => return Ok(event),
                    None => continue,
                }
            }
            if let Some(event) = self.read_store().await? {
                return Ok(event);
            }
            if self.live.is_none() {
                // Caught up with the store: follow live from here. Frames
                // committed since the read are not above the registration's
                // last seq and come from the store on the next turn.
                self.live = Some(self.hub.register(&self.stream)?);
            }
        }
    }

    /// True when the next seq can only come from the live channel: the
    /// registration started at or after it.
    fn live_covers_next(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|live| self.next_seq > live.last_seq)
    }

    /// Takes one live batch. `None` means "look again": the batch held only
    /// frames already delivered, or the subscription left the live channel
    /// (the hub dropped it, or the batch did not join up with the next seq)
    /// and must read the store.
    async fn recv_live(&mut self) -> Result<Option<SubEvent>> {
        let Some(live) = self.live.as_mut() else {
            return Ok(None);
        };
        let Some(batch) = live.recv().await else {
            // The hub dropped this follower: catch up from the store and
            // register again afterwards.
            self.drop_live();
            return Ok(None);
        };
        let next_seq = self.next_seq;
        let mut fresh = batch.iter().filter(|(seq, _)| *seq >= next_seq).peekable();
        match fresh.peek() {
            // Everything in it was already delivered from the store.
            None => Ok(None),
            Some((seq, _)) if *seq == next_seq => match self.wire {
                None => Ok(self.deliver(fresh.cloned().collect())),
                Some(form) => {
                    let (frames, bytes) = fresh
                        .clone()
                        .fold((0, 0), |(n, b), (_, f)| (n + 1, b + f.payload.len()));
                    let mut wire = WireFrames::new(form, frames, bytes);
                    for (seq, f) in fresh {
                        wire.push(*seq, f.view())?;
                    }
                    Ok(self.deliver_encoded(wire))
                }
            },
            Some(_) => {
                // A hole between what was delivered and the live batch:
                // the store has the missing frames.
                self.drop_live();
                Ok(None)
            }
        }
    }

    fn drop_live(&mut self) {
        if let Some(live) = self.live.take() {
            self.peak_queued = self.peak_queued.max(live.peak_queued_bytes());
        }
    }

    /// Reads the next chunk from the store. `Ok(None)` means the store has
    /// nothing after the next seq yet.
    async fn read_store(&mut self) -> Result<Option<SubEvent>> {
        let (first_seq, read) = match self.wire {
            None => {
                let chunk = self.read_chunk(Vec::new).await?;
                (chunk.first_seq, self.deliver(chunk.frames))
            }
            Some(form) => {
                let chunk = self
                    .read_chunk(move || WireFrames::new(form, READ_MAX_FRAMES, READ_MAX_BYTES))
                    .await?;
                (chunk.first_seq, self.deliver_encoded(chunk.frames))
            }
        };
        if self.next_seq < first_seq {
            let gap = Gap {
                requested: self.next_seq,
                first_available: first_seq,
            };
            self.next_seq = first_seq;
            return Ok(Some(SubEvent::Gap(gap)));
        }
        if read.is_some() {
            return Ok(read);
        }
        if let Some(end) = self.end {
            // Unreachable while `end` is at most the stream's last seq, as
            // `Queue::subscribe` ensures; stopping beats waiting forever.
            self.end = Some(end.min(self.next_seq.saturating_sub(1)));
            return Ok(Some(SubEvent::End {
                last_seq: self.next_seq.saturating_sub(1),
            }));
        }
        if let Some(live) = &self.live {
            if self.next_seq <= live.last_seq {
                return Err(Error::Invariant(format!(
                    "stream {:?} lost frame {} between commit and read",
                    self.stream, self.next_seq
                )));
            }
        }
        Ok(None)
    }

    async fn read_chunk<S: FrameSink + Send + 'static>(
        &self,
        new_sink: impl Fn() -> S + Send + 'static,
    ) -> Result<ReadChunk<S>> {
        let store = self.store.clone();
        let stream = self.stream.clone();
        let from = self.next_seq;
        // The store may hold commits that are not durable yet (only the
        // write-ahead log will make them so): read no further than the hub
        // has published.
        let published = self.hub.range(&self.stream).map_or(0, |(_, last)| last);
        let limits = ReadLimits {
            max_frames: READ_MAX_FRAMES,
            max_bytes: READ_MAX_BYTES,
            through_seq: self.end.unwrap_or(u64::MAX).min(published),
        };
        tokio::task::spawn_blocking(move || store.read_frames_into(&stream, from, limits, new_sink))
            .await
            .map_err(|e| Error::storage("store read task failed", e))?
    }

    /// The event for `frames`, `None` when there are none.
    fn deliver(&mut self, frames: Vec<(u64, Frame)>) -> Option<SubEvent> {
        let (last, _) = frames.last()?;
        self.next_seq = last + 1;
        Some(SubEvent::Frames(frames))
    }

    fn deliver_encoded(&mut self, frames: WireFrames) -> Option<SubEvent> {
        let last_seq = frames.last_seq?;
        self.next_seq = last_seq + 1;
        Some(SubEvent::Encoded {
            wire: frames.wire.freeze(),
            last_seq,
        })
    }
}

/// Frames encoded for the socket as they are read or received.
#[derive(Debug)]
struct WireFrames {
    form: WireForm,
    wire: BytesMut,
    last_seq: Option<u64>,
}

/// Bytes of a typical frame's length prefix and head (seq, timestamp,
/// kind, length), to size buffers by; a bigger one only grows the buffer.
const WIRE_HEAD_TYPICAL: usize = 24;

impl WireFrames {
    /// Ready for `frames` frames of `payload_bytes` in all.
    fn new(form: WireForm, frames: usize, payload_bytes: usize) -> Self {
        Self {
            form,
            wire: BytesMut::with_capacity(payload_bytes + frames * WIRE_HEAD_TYPICAL),
            last_seq: None,
        }
    }

    fn push(&mut self, seq: u64, frame: FrameView<'_>) -> Result<()> {
        match self.form {
            WireForm::Durable => encode_durable(seq, frame, &mut self.wire),
            WireForm::Live => encode_live(frame, &mut self.wire),
        }
        .map_err(|e| Error::storage(format!("frame {seq} cannot be sent"), e))?;
        self.last_seq = Some(seq);
        Ok(())
    }
}

impl FrameSink for WireFrames {
    fn take(&mut self, chunk: &[u8], frames: &[StoredFrame]) -> Result<()> {
        for f in frames {
            let payload = chunk.get(f.payload.clone()).ok_or_else(|| {
                Error::Invariant(format!("frame {} lies outside its stored chunk", f.seq))
            })?;
            let frame = FrameView {
                ts_micros: f.ts_micros,
                kind: f.kind,
                payload,
            };
            self.push(f.seq, frame)?;
        }
        Ok(())
    }
}
