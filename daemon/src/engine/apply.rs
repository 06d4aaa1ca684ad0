//! Applying commands: each request of a batch changes the write
//! transaction and the writer's caches, or is refused alone before it
//! changed anything. Appends get their seqs here and producers' resends are
//! found; what a batch changed is staged, written once at its end and
//! published after its commit.
//!
//! Checkpoints and durable step results are written by the writer as well,
//! so that a checkpoint records the stream's last seq as of its own
//! transaction, and a new attempt's start reads the newest valid checkpoint
//! in the same transaction that records it (see [`crate::checkpoint`]).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use tether_protocol::{
    validate_name, CheckpointMeta, CheckpointRef, CheckpointSave, Frame, FrameKind, UserMeta,
};

use super::answer::Publish;
use super::cache::StreamState;
use super::commands::{Outcome, Recorded, Removed, Request};
use super::writer::Writer;
use super::AppendOutcome;
use crate::checkpoint::{self, Resume};
use crate::hub::StreamUpdate;
use crate::ingest::IngestAppend;
use crate::store::{ProducerState, WriteTxn};
use crate::{Error, Result};

/// What a batch changed, to be written at its end and published after its
/// commit.
#[derive(Debug, Default)]
pub(super) struct Staged {
    streams: BTreeMap<String, Vec<(u64, Frame)>>,
    /// Producers whose dedupe state changed, by stream, with the first
    /// producer seq this batch stored for each.
    producers: HashMap<String, HashMap<String, u64>>,
    pub(super) created_stream: bool,
    /// Checkpoints saved, in order, as `ps` will show them.
    checkpoints: Vec<(String, CheckpointRef)>,
    /// Streams and executions removed, for the hub and `ps`.
    removed_streams: Vec<String>,
    removed_executions: Vec<String>,
}

impl Staged {
    /// Notes that `producer`'s dedupe state on `stream` changed; copies the
    /// names only the first time in a batch.
    fn stage_producer(&mut self, stream: &str, producer: &str, producer_seq: u64) {
        match self.producers.get_mut(stream) {
            Some(firsts) => {
                if !firsts.contains_key(producer) {
                    firsts.insert(producer.to_owned(), producer_seq);
                }
            }
            None => {
                self.producers.insert(
                    stream.to_owned(),
                    HashMap::from([(producer.to_owned(), producer_seq)]),
                );
            }
        }
    }

    /// The frames of `stream` staged for publication after the commit.
    pub(super) fn frames_of(&mut self, stream: &str) -> &mut Vec<(u64, Frame)> {
        // Looked up before any `entry`, which would copy the name.
        if !self.streams.contains_key(stream) {
            self.streams.insert(stream.to_owned(), Vec::new());
        }
        self.streams
            .get_mut(stream)
            .unwrap_or_else(|| unreachable!("the stream was just inserted"))
    }
}

impl Writer {
    /// Applies one request to the transaction and the caches. The outer
    /// error is a storage failure (the batch fails); the inner one refuses
    /// this request alone, before it changed anything.
    /// Takes the request by value so that appends move their names and
    /// payloads into the outcome and the frame instead of copying them.
    pub(super) fn apply(
        &mut self,
        txn: &mut WriteTxn<'_>,
        request: Request,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        match request {
            Request::Append(appends) => self.apply_appends(txn, appends, ts, staged),
            Request::OpenConsumer { stream, consumer } => {
                self.apply_open_consumer(txn, &stream, &consumer)
            }
            Request::Ack {
                stream,
                consumer,
                through_seq,
            } => self.apply_ack(txn, &stream, &consumer, through_seq),
            Request::Record {
                execution,
                manifest,
                events,
                resume,
                from_checkpoint,
            } => {
                let resume = resume.then_some(from_checkpoint);
                self.apply_record(txn, &execution, &manifest, &events, resume, ts, staged)
            }
            Request::SaveCheckpoint { save, user_meta } => {
                self.apply_checkpoint(txn, &save, &user_meta, ts, staged)
            }
            Request::PutStep {
                execution,
                step,
                result,
            } => self.apply_step(txn, &execution, &step, &result, ts),
            Request::ClearSteps { execution, steps } => {
                if !txn.has_execution(&execution)? {
                    return Ok(Err(Error::ExecutionNotFound(execution)));
                }
                let cleared = txn.clear_steps(&execution, steps.as_deref())?;
                Ok(Ok(Outcome::Cleared(cleared)))
            }
            Request::Remove {
                executions,
                streams,
            } => self.apply_remove(txn, executions, streams, staged),
            Request::Gate(change) => self.apply_gate(txn, change, ts, staged),
            // Separated out by `process`; never part of a transaction.
            Request::Compact | Request::SetRetention(_) => Ok(Ok(Outcome::Done)),
        }
    }

    /// Removes executions and streams, each whole, in this one
    /// transaction (a durable commit: see [`WriteTxn::remove_stream`]).
    fn apply_remove(
        &mut self,
        txn: &mut WriteTxn<'_>,
        executions: Vec<String>,
        streams: Vec<String>,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        let mut removed = Removed::default();
        for execution in executions {
            if txn.remove_execution(&execution)? {
                staged.removed_executions.push(execution.clone());
                removed.executions.push(execution.clone());
            }
            // The execution's stream goes with it; it is not listed apart.
            self.remove_stream(txn, &execution, staged)?;
        }
        for name in streams {
            if let Some(last_seq) = self.remove_stream(txn, &name, staged)? {
                removed.streams.push((name, last_seq));
            }
        }
        Ok(Ok(Outcome::Removed(removed)))
    }

    /// Removes one stream from the transaction and the caches; its last
    /// seq, or `None` when there was no such stream.
    fn remove_stream(
        &mut self,
        txn: &mut WriteTxn<'_>,
        name: &str,
        staged: &mut Staged,
    ) -> Result<Option<u64>> {
        let Some(stream) = self.state.streams.remove(name) else {
            return Ok(None);
        };
        let last_seq = stream.meta.last_seq;
        txn.remove_stream(name, stream.meta.id, last_seq)?;
        let tombstone = self.state.tombstones.entry(name.to_owned()).or_insert(0);
        *tombstone = (*tombstone).max(last_seq);
        // Frames this batch appended to it before are gone with it.
        staged.streams.remove(name);
        staged.producers.remove(name);
        staged.removed_streams.push(name.to_owned());
        // A compaction queued for it finds no stream and passes.
        Ok(Some(last_seq))
    }

    fn apply_appends(
        &mut self,
        txn: &mut WriteTxn<'_>,
        appends: Vec<IngestAppend>,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = self.check_resumed(&appends) {
            return Ok(Err(e));
        }
        let mut outcomes = Vec::with_capacity(appends.len());
        let mut appends = appends.into_iter().peekable();
        while let Some(first) = appends.next() {
            // A batch is mostly one producer's frames in a row: the stream,
            // the producer and the staged frames are looked up once a run.
            let mut run = vec![first];
            while let Some(next) = appends.next_if(|a| a.same_writer(&run[0])) {
                run.push(next);
            }
            self.apply_run(txn, run, ts, staged, &mut outcomes)?;
        }
        if !self.failed_from.is_empty() {
            forget_resumed(&mut self.failed_from, &outcomes);
        }
        Ok(Ok(Outcome::Appended(outcomes)))
    }

    /// Applies appends of one (stream, producer), in order. Per frame
    /// nothing is allocated here: names move into the outcome, and the
    /// payload into the frame.
    fn apply_run(
        &mut self,
        txn: &mut WriteTxn<'_>,
        run: Vec<IngestAppend>,
        ts: u64,
        staged: &mut Staged,
        outcomes: &mut Vec<AppendOutcome>,
    ) -> Result<()> {
        let (stream_name, producer_name) = match run.first() {
            Some(a) => (a.stream.clone(), a.producer.clone()),
            None => return Ok(()),
        };
        let stream = self.stream_or_create(&stream_name, ts, staged);
        let mut newest = stream.producers.get(&*producer_name).copied();
        let mut first_stored = None;
        let staged_frames = staged.frames_of(&stream_name);
        for a in run {
            let mut outcome = AppendOutcome {
                stream: a.stream,
                producer: a.producer,
                producer_seq: a.producer_seq,
                seq: 0,
                duplicate: false,
            };
            if let Some(p) = newest.filter(|p| outcome.producer_seq <= p.producer_seq) {
                outcome.seq = p.seq;
                outcome.duplicate = true;
                outcomes.push(outcome);
                continue;
            }
            // A producer's own time (from a shim, of a line it read while
            // the daemon was down) is kept, but never one later than this
            // commit's: a skewed or lying clock cannot date frames ahead.
            let frame = Frame {
                ts_micros: a.ts_micros.map_or(ts, |own| own.min(ts)),
                kind: a.kind,
                payload: a.payload,
            };
            outcome.seq = put_new_frame(txn, stream, frame, staged_frames)?;
            newest = Some(ProducerState {
                producer_seq: outcome.producer_seq,
                seq: outcome.seq,
            });
            first_stored.get_or_insert(outcome.producer_seq);
            outcomes.push(outcome);
        }
        if let (Some(state), Some(first)) = (newest, first_stored) {
            match stream.producers.get_mut(&*producer_name) {
                Some(stored) => *stored = state,
                None => {
                    stream.producers.insert(producer_name.to_string(), state);
                }
            }
            staged.stage_producer(&stream_name, &producer_name, first);
        }
        Ok(())
    }

    /// Records, after a failed commit, where each producer of the batch
    /// must resume.
    pub(super) fn remember_failed(&mut self, staged: &Staged) {
        for (stream, firsts) in &staged.producers {
            let failed = self.failed_from.entry(stream.clone()).or_default();
            for (producer, &first) in firsts {
                let from = failed.entry(producer.clone()).or_insert(first);
                *from = (*from).min(first);
            }
        }
    }

    /// Refuses appends that would skip the first unstored seq of a
    /// producer whose earlier appends failed (see `failed_from`).
    fn check_resumed(&self, appends: &[IngestAppend]) -> Result<()> {
        if self.failed_from.is_empty() {
            return Ok(());
        }
        let mut resumed: Vec<(&str, &str)> = Vec::new();
        for a in appends {
            let from = self
                .failed_from
                .get(&*a.stream)
                .and_then(|m| m.get(&*a.producer));
            let Some(&from) = from else { continue };
            let key = (&*a.stream, &*a.producer);
            if a.producer_seq == from {
                resumed.push(key);
            } else if a.producer_seq > from && !resumed.contains(&key) {
                return Err(Error::Refused(format!(
                    "appends of producer {} on stream {} from producer seq {from} were not \
                     stored (a commit failed); resend from there",
                    a.producer, a.stream
                )));
            }
        }
        Ok(())
    }

    /// Stores a manifest and appends its lifecycle events (and, for a new
    /// attempt, `resume` set, the one saying what it resumes from; with a
    /// checkpoint named, that one is first copied as the newest). The
    /// daemon is their only producer and writes them once, so they carry
    /// no dedupe state.
    #[allow(clippy::too_many_arguments)]
    fn apply_record(
        &mut self,
        txn: &mut WriteTxn<'_>,
        execution: &str,
        manifest: &[u8],
        events: &[Bytes],
        resume: Option<Option<u64>>,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("stream", execution) {
            return Ok(Err(e.into()));
        }
        // Checked before anything is written: a refusal leaves no trace.
        if let Some(Some(named)) = resume {
            if let Err(e) = self.promote_checkpoint(txn, execution, named, staged)? {
                return Ok(Err(e));
            }
        }
        txn.put_execution(execution, manifest)?;
        for payload in events {
            let stream = self.stream_or_create(execution, ts, staged);
            let frame = Frame {
                ts_micros: ts,
                kind: FrameKind::Event,
                payload: payload.clone(),
            };
            put_new_frame(txn, stream, frame, staged.frames_of(execution))?;
        }
        let resume = match resume.is_some() {
            true => {
                let resume = self.resume_point(txn, execution)?;
                if let Some(event) = resume.event() {
                    tracing::info!(execution, "{event}");
                    let stream = self.stream_or_create(execution, ts, staged);
                    let frame = Frame {
                        ts_micros: ts,
                        kind: FrameKind::Event,
                        payload: Bytes::from(event),
                    };
                    put_new_frame(txn, stream, frame, staged.frames_of(execution))?;
                }
                Some(resume)
            }
            false => None,
        };
        Ok(Ok(Outcome::Recorded(Recorded {
            last_seq: self.last_seq(execution),
            resume,
        })))
    }

    /// Copies checkpoint `named` of `execution` as its newest, record and
    /// all (its seq, time, data and metadata), so that a resumed worker
    /// loads it. Refused when it is not stored or fails its checksum.
    fn promote_checkpoint(
        &mut self,
        txn: &mut WriteTxn<'_>,
        execution: &str,
        named: u64,
        staged: &mut Staged,
    ) -> Result<Result<()>> {
        let mut found: Option<Vec<u8>> = None;
        txn.visit_checkpoints(execution, |id, record| {
            if id == named {
                found = Some(record.to_vec());
            }
            id > named
        })?;
        let Some(record) = found else {
            return Ok(Err(Error::CheckpointNotFound(format!(
                "execution {execution} has no checkpoint {named} (see 'tether checkpoint list')"
            ))));
        };
        let inspected = checkpoint::inspect(named, &record);
        if !inspected.meta.valid {
            return Ok(Err(Error::InvalidRequest(format!(
                "checkpoint {named} of execution {execution} fails its checksum; choose \
                 another (see 'tether checkpoint list')"
            ))));
        }
        let newest = txn.newest_checkpoint_id(execution)?.unwrap_or(named);
        if newest == named {
            return Ok(Ok(()));
        }
        let id = newest + 1;
        txn.put_checkpoint(execution, id, &record)?;
        let keep = self.opts.checkpoint_keep.max(1) as u64;
        if id > keep {
            txn.delete_checkpoints_before(execution, id + 1 - keep)?;
        }
        let meta = CheckpointMeta {
            id,
            ..inspected.meta
        };
        staged
            .checkpoints
            .push((execution.to_owned(), checkpoint::reference(&meta)));
        Ok(Ok(()))
    }

    /// What a new attempt of `execution` resumes from, read in `txn`: the
    /// newest checkpoint whose checksum matches. Invalid newer ones are
    /// skipped and logged.
    fn resume_point(&self, txn: &mut WriteTxn<'_>, execution: &str) -> Result<Resume> {
        let mut any = false;
        let mut found = None;
        txn.visit_checkpoints(execution, |id, record| {
            any = true;
            let inspected = checkpoint::inspect(id, record);
            if inspected.meta.valid {
                found = Some(inspected.meta);
                return false;
            }
            checkpoint::warn_invalid(execution, id);
            true
        })?;
        Ok(match found {
            Some(meta) => Resume::From {
                checkpoint: meta.id,
                seq: meta.seq,
                through: self.last_seq(execution),
            },
            None if any => Resume::NoValid,
            None => Resume::Fresh,
        })
    }

    /// Stores a checkpoint with the stream's last seq and deletes those
    /// beyond the newest `checkpoint_keep`.
    fn apply_checkpoint(
        &mut self,
        txn: &mut WriteTxn<'_>,
        save: &CheckpointSave,
        user_meta: &UserMeta,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        let execution = save.execution.as_str();
        let limit = self.opts.max_checkpoint_bytes;
        if save.data.len() > limit {
            return Ok(Err(checkpoint::too_large(
                "checkpoint",
                save.data.len(),
                limit,
            )));
        }
        if !txn.has_execution(execution)? {
            return Ok(Err(Error::ExecutionNotFound(execution.to_owned())));
        }
        // Ids only grow: the newest checkpoint is never deleted, so the
        // next id is always above every id ever given.
        let id = txn.newest_checkpoint_id(execution)?.map_or(1, |n| n + 1);
        let seq = self.last_seq(execution);
        let record =
            checkpoint::encode_record(save.schema_version, ts, seq, &save.data, user_meta)?;
        txn.put_checkpoint(execution, id, &record)?;
        let keep = self.opts.checkpoint_keep.max(1) as u64;
        if id > keep {
            txn.delete_checkpoints_before(execution, id + 1 - keep)?;
        }
        let meta = CheckpointMeta {
            id,
            seq,
            schema_version: save.schema_version,
            size: save.data.len() as u64,
            created_micros: ts,
            valid: true,
        };
        staged
            .checkpoints
            .push((execution.to_owned(), checkpoint::reference(&meta)));
        Ok(Ok(Outcome::Checkpoint(meta)))
    }

    /// Records a durable step's result unless one is recorded already: the
    /// first result is the one every later attempt gets back.
    fn apply_step(
        &mut self,
        txn: &mut WriteTxn<'_>,
        execution: &str,
        step: &str,
        result: &Bytes,
        ts: u64,
    ) -> Result<Result<Outcome>> {
        let limit = self.opts.max_checkpoint_bytes;
        if result.len() > limit {
            return Ok(Err(checkpoint::too_large(
                "step result",
                result.len(),
                limit,
            )));
        }
        if !txn.has_execution(execution)? {
            return Ok(Err(Error::ExecutionNotFound(execution.to_owned())));
        }
        if let Some(kept) = txn.step(execution, step)? {
            return Ok(Ok(Outcome::Step(Bytes::from(kept))));
        }
        txn.put_step(execution, step, result, ts)?;
        Ok(Ok(Outcome::Step(result.clone())))
    }

    fn apply_open_consumer(
        &mut self,
        txn: &mut WriteTxn<'_>,
        stream: &str,
        consumer: &str,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("consumer", consumer) {
            return Ok(Err(e.into()));
        }
        let Some(s) = self.state.streams.get_mut(stream) else {
            return Ok(Err(Error::StreamNotFound(stream.to_owned())));
        };
        if let Some(&acked) = s.consumers.get(consumer) {
            return Ok(Ok(Outcome::Consumer(acked)));
        }
        let acked = s.meta.first_seq - 1;
        txn.put_consumer(s.meta.id, consumer, acked)?;
        s.consumers.insert(consumer.to_owned(), acked);
        Ok(Ok(Outcome::Consumer(acked)))
    }

    pub(super) fn apply_ack(
        &mut self,
        txn: &mut WriteTxn<'_>,
        stream: &str,
        consumer: &str,
        through_seq: u64,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("consumer", consumer) {
            return Ok(Err(e.into()));
        }
        let Some(s) = self.state.streams.get_mut(stream) else {
            return Ok(Err(Error::StreamNotFound(stream.to_owned())));
        };
        if through_seq > s.meta.last_seq {
            return Ok(Err(Error::InvalidRequest(format!(
                "ack through seq {through_seq} is beyond the last seq {} of stream {stream}",
                s.meta.last_seq
            ))));
        }
        if s.consumers.get(consumer).is_some_and(|&a| a >= through_seq) {
            return Ok(Ok(Outcome::Done));
        }
        txn.put_consumer(s.meta.id, consumer, through_seq)?;
        s.consumers.insert(consumer.to_owned(), through_seq);
        self.mark_dirty(stream);
        Ok(Ok(Outcome::Done))
    }

    /// Writes the metadata and producer state a batch changed, once each.
    pub(super) fn flush(&self, txn: &mut WriteTxn<'_>, staged: &Staged) -> Result<()> {
        for name in staged.streams.keys() {
            if let Some(s) = self.state.streams.get(name) {
                txn.put_stream(name, &s.meta)?;
            }
        }
        for (stream, producers) in &staged.producers {
            let Some(s) = self.state.streams.get(stream) else {
                continue;
            };
            for producer in producers.keys() {
                if let Some(state) = s.producers.get(producer) {
                    txn.put_producer(s.meta.id, producer, *state)?;
                }
            }
        }
        if staged.created_stream {
            txn.set_next_stream_id(self.state.next_stream_id)?;
        }
        Ok(())
    }

    /// What publishing a committed batch takes (run once it is durable),
    /// and queues streams over their retention limits for compaction.
    pub(super) fn publish(&mut self, staged: Staged) -> Publish {
        let mut updates = Vec::with_capacity(staged.streams.len());
        let mut over_limit = Vec::new();
        for (name, frames) in staged.streams {
            let Some(s) = self.state.streams.get(&name) else {
                continue;
            };
            if self.over_size_limits(&s.meta) {
                over_limit.push(name.clone());
            }
            updates.push(StreamUpdate {
                stream: name,
                first_seq: s.meta.first_seq,
                last_seq: s.meta.last_seq,
                frames,
            });
        }
        for name in over_limit {
            self.mark_dirty(&name);
        }
        Publish {
            hub: self.hub.clone(),
            updates,
            checkpoint_refs: self.checkpoint_refs.clone(),
            checkpoints: staged.checkpoints,
            metrics: self.opts.metrics.clone(),
            removed_streams: staged.removed_streams,
            removed_executions: staged.removed_executions,
        }
    }
}

/// Forgets where producers must resume (`Writer::failed_from`) once they
/// have: their append of that seq was stored, or was a duplicate of one
/// already stored. A failed commit whose log record was appended is
/// replayed when the store is reopened, so the resend of its first seq
/// can find it stored; the producer has resumed all the same.
fn forget_resumed(
    failed_from: &mut HashMap<String, HashMap<String, u64>>,
    outcomes: &[AppendOutcome],
) {
    for o in outcomes {
        let Some(failed) = failed_from.get_mut(&*o.stream) else {
            continue;
        };
        if failed.get(&*o.producer) == Some(&o.producer_seq) {
            failed.remove(&*o.producer);
        }
        if failed.is_empty() {
            failed_from.remove(&*o.stream);
        }
    }
}

/// Stores `frame` as the next seq of `stream` (named `name`), updates the
/// cached metadata and stages the frame for publication after the commit.
pub(super) fn put_new_frame(
    txn: &mut WriteTxn<'_>,
    stream: &mut StreamState,
    frame: Frame,
    staged: &mut Vec<(u64, Frame)>,
) -> Result<u64> {
    let seq = stream.meta.last_seq + 1;
    txn.put_frame(stream.meta.id, seq, &frame)?;
    if stream.meta.frames == 0 {
        stream.oldest_ts = Some(frame.ts_micros);
    }
    stream.meta.last_seq = seq;
    stream.meta.frames += 1;
    stream.meta.bytes += frame.payload.len() as u64;
    staged.push((seq, frame));
    Ok(seq)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn outcome(producer: &str, producer_seq: u64, duplicate: bool) -> AppendOutcome {
        AppendOutcome {
            stream: "s".into(),
            producer: producer.into(),
            producer_seq,
            seq: producer_seq,
            duplicate,
        }
    }

    fn failed_from(points: &[(&str, u64)]) -> HashMap<String, HashMap<String, u64>> {
        let producers = points
            .iter()
            .map(|(producer, seq)| (producer.to_string(), *seq))
            .collect();
        HashMap::from([("s".to_string(), producers)])
    }

    #[test]
    fn a_producer_has_resumed_once_its_first_unstored_seq_is_answered() {
        let mut failed = failed_from(&[("p", 5), ("q", 9)]);
        forget_resumed(
            &mut failed,
            &[outcome("p", 4, true), outcome("q", 8, false)],
        );
        assert_eq!(failed, failed_from(&[("p", 5), ("q", 9)]));
        forget_resumed(
            &mut failed,
            &[outcome("p", 5, false), outcome("p", 6, false)],
        );
        assert_eq!(failed, failed_from(&[("q", 9)]));
        forget_resumed(&mut failed, &[outcome("q", 9, false)]);
        assert!(failed.is_empty());
    }

    #[test]
    fn a_resend_found_stored_by_the_logs_replay_counts_as_resumed() {
        // The failed commit's record was replayed when the store was
        // reopened: the resend of its first seq is a duplicate.
        let mut failed = failed_from(&[("p", 5)]);
        forget_resumed(&mut failed, &[outcome("p", 5, true), outcome("p", 6, true)]);
        assert!(failed.is_empty());
    }
}
