//! Compaction and retention: deleting a stream's oldest frames once every
//! consumer acked them or they pass the retention limits.
//!
//! Compaction and retention run on the writer too, one bounded batch at a
//! time and only when no command is waiting, so they never delay an append
//! by more than one small batch.

use std::time::{Duration, Instant};

use super::answer::Publish;
use super::writer::Writer;
use crate::config::Retention;
use crate::hub::StreamUpdate;
use crate::store::StreamMeta;
use crate::{Error, Result};

/// Frames deleted by one compaction or retention batch, at most.
const COMPACT_BATCH: u64 = 4096;

/// Under a steady stream of commands the writer is never idle; it still
/// runs one compaction batch after this many command batches, so that
/// retention keeps up with a busy stream.
pub(super) const COMPACT_EVERY_BATCHES: u32 = 64;

/// How often age retention is checked.
pub(super) const AGE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long compaction (and copying chunks from the log) rests after it
/// failed, so that a persistent failure (a full disk) does not keep the
/// writer spinning.
pub(super) const COMPACT_RETRY_DELAY: Duration = Duration::from_secs(1);

impl Writer {
    pub(super) fn compaction_ready(&self) -> bool {
        self.healthy
            && !self.dirty.is_empty()
            && self
                .compaction_paused_until
                .is_none_or(|t| Instant::now() >= t)
    }

    /// New retention limits: every stream may now be over them.
    pub(super) fn set_retention(&mut self, retention: Retention) {
        self.opts.retention = retention;
        self.next_age_check = Instant::now();
        let names: Vec<String> = self.state.streams.keys().cloned().collect();
        for name in names {
            self.mark_dirty(&name);
        }
    }

    pub(super) fn mark_dirty(&mut self, name: &str) {
        if self.dirty_set.insert(name.to_owned()) {
            self.dirty.push_back(name.to_owned());
        }
    }

    pub(super) fn over_size_limits(&self, meta: &StreamMeta) -> bool {
        let r = &self.opts.retention;
        r.max_frames.is_some_and(|m| meta.frames > m) || r.max_bytes.is_some_and(|m| meta.bytes > m)
    }

    /// Queues every stream whose oldest frame may have expired.
    pub(super) fn mark_aged(&mut self) {
        let Some(cutoff) = self.age_cutoff() else {
            return;
        };
        let aged: Vec<String> = self
            .state
            .streams
            .iter()
            .filter(|(_, s)| s.meta.frames > 0 && s.oldest_ts.is_none_or(|t| t < cutoff))
            .map(|(name, _)| name.clone())
            .collect();
        for name in aged {
            self.mark_dirty(&name);
        }
    }

    /// Frames stamped before this have outlived `max_age`.
    fn age_cutoff(&self) -> Option<u64> {
        let age = self.opts.retention.max_age?;
        let age = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        Some(Self::now_micros().saturating_sub(age))
    }

    /// Runs compaction batches until nothing is due.
    pub(super) fn compact_all(&mut self) -> Result<()> {
        if !self.healthy {
            self.recover()?;
        }
        self.compaction_paused_until = None;
        self.mark_aged();
        // Ends: every step either deletes frames or takes a stream off the
        // dirty list.
        while !self.dirty.is_empty() {
            if let Err(e) = self.compact_step() {
                self.compaction_failed(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn compaction_failed(&mut self, e: &Error) {
        self.compaction_paused_until = Some(Instant::now() + COMPACT_RETRY_DELAY);
        self.after_failure("compaction", e);
    }

    /// Deletes one bounded batch of frames from the next dirty stream.
    pub(super) fn compact_step(&mut self) -> Result<()> {
        let Some(name) = self.dirty.pop_front() else {
            return Ok(());
        };
        self.dirty_set.remove(&name);
        let plan = match self.plan(&name) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.mark_dirty(&name);
                return Err(e);
            }
        };
        let store = self.store.clone();
        let sync_ahead = self.syncer.sync_ahead();
        let ((deleted, meta), durable) = store.write_logged(
            |txn| {
                let mut freed = 0;
                let deleted =
                    txn.delete_prefix(plan.meta.id, plan.meta.first_seq, plan.upto, |f| {
                        let go = f.seq <= plan.through_seq
                            || freed < plan.free_bytes
                            || f.ts_micros < plan.cutoff;
                        if go {
                            freed += f.payload_len;
                        }
                        go
                    })?;
                let mut meta = plan.meta.clone();
                meta.first_seq += deleted.frames;
                meta.frames = meta.frames.saturating_sub(deleted.frames);
                meta.bytes = meta.bytes.saturating_sub(deleted.bytes);
                if deleted.frames > 0 {
                    txn.put_stream(&name, &meta)?;
                }
                Ok((deleted, meta))
            },
            sync_ahead,
        )?;
        if let Some(s) = self.state.streams.get_mut(&name) {
            s.meta = meta.clone();
            s.oldest_ts = deleted.first_kept.map(|f| f.ts_micros);
        }
        if deleted.frames > 0 {
            let publish = Publish {
                hub: self.hub.clone(),
                updates: vec![StreamUpdate {
                    stream: name.clone(),
                    first_seq: meta.first_seq,
                    // Durable by the time this runs: the frames up to it
                    // were committed before this compaction, and are
                    // published first.
                    last_seq: meta.last_seq,
                    frames: Vec::new(),
                }],
                checkpoint_refs: self.checkpoint_refs.clone(),
                checkpoints: Vec::new(),
                metrics: self.opts.metrics.clone(),
                removed_streams: Vec::new(),
                removed_executions: Vec::new(),
            };
            self.answer(durable, Some(publish), Vec::new(), Vec::new());
            // More may be due than one batch deletes.
            self.mark_dirty(&name);
        }
        Ok(())
    }

    /// What one compaction batch of `name` should delete; `None` when
    /// nothing is due.
    fn plan(&mut self, name: &str) -> Result<Option<CompactPlan>> {
        let cutoff = self.age_cutoff().unwrap_or(0);
        let r = self.opts.retention.clone();
        let Some(s) = self.state.streams.get_mut(name) else {
            return Ok(None);
        };
        if s.meta.frames == 0 {
            return Ok(None);
        }
        if cutoff > 0 && s.oldest_ts.is_none() {
            s.oldest_ts = self.store.frame_ts(s.meta.id, s.meta.first_seq)?;
        }
        let meta = &s.meta;
        // With no durable consumer, acks hold nothing back and delete
        // nothing: only retention applies.
        let acked = s.consumers.values().copied().min().unwrap_or(0);
        let over_count = r.max_frames.map_or(0, |m| meta.last_seq.saturating_sub(m));
        let through_seq = acked.max(over_count);
        let free_bytes = r.max_bytes.map_or(0, |m| meta.bytes.saturating_sub(m));
        let expired = s.oldest_ts.is_some_and(|t| t < cutoff);
        if through_seq < meta.first_seq && free_bytes == 0 && !expired {
            return Ok(None);
        }
        Ok(Some(CompactPlan {
            meta: meta.clone(),
            upto: meta.last_seq.min(meta.first_seq + COMPACT_BATCH - 1),
            through_seq,
            free_bytes,
            cutoff,
        }))
    }
}

/// One compaction batch: delete from `meta.first_seq`, no further than
/// `upto`, every frame through `through_seq`, then while `free_bytes` are
/// not yet freed or frames are older than `cutoff`.
#[derive(Debug)]
struct CompactPlan {
    meta: StreamMeta,
    upto: u64,
    through_seq: u64,
    free_bytes: u64,
    cutoff: u64,
}
