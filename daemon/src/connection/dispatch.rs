//! Serving requests: each is authorized (and control requests logged,
//! naming the peer), then appends and acks join the pipeline while every
//! other request waits for it to drain and is served in turn.
//!
//! Supervision requests (`Run`, `ListExecutions`, `Stop`) go to the
//! supervisor. A `ShimHello` makes the session a shim session for one
//! attempt of one execution; only such a session may report that attempt's
//! `WorkerExited`, and because other requests first drain the pipeline, the
//! exit is recorded only after every output frame sent before it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tether_protocol::{
    max_payload_len, validate_name, Appended, CheckpointSave, CheckpointSaveFull, DurableAck,
    ErrorCode, Request, Response, RunSpecFull, ShimHello, StatusInfo, StorageFault, StorageState,
    WorkerExited, FRAME_ENVELOPE, PROTOCOL_VERSION,
};

use super::{parts, Refusal, Session};
use crate::access;
use crate::engine::{AppendOutcome, AWAKE_FOR};
use crate::ingest::IngestAppend;
use crate::supervisor::state;
use crate::Error;

/// Flush asks queued for one shim's session.
const FLUSH_ASKS: usize = 16;

impl Session {
    /// Handles one request other than an append.
    pub(super) async fn dispatch(&mut self, request: Request) -> Result<(), Refusal> {
        if let Request::Append(append) = request {
            // `SessionCodec` hands appends over as batches; an `Append`
            // here would come from another decoder, and is served (and
            // authorized) the same.
            return self.start_appends(vec![append.into()]).await;
        }
        if let Request::AppendStamped(append) = request {
            return self.start_appends(vec![append.into()]).await;
        }
        self.authorize(&request)?;
        match request {
            Request::DurableAck(ack) => self.start_ack(ack),
            other => {
                // Keep answers in request order: finish the pipeline first.
                while let Some(done) = self.pending.next().await {
                    self.send_all(done?).await?;
                }
                self.handle_control(other).await
            }
        }
    }

    /// Refuses a request the peer may not send, and logs the control
    /// actions it may, naming the peer's uid and pid.
    fn authorize(&mut self, request: &Request) -> Result<(), Refusal> {
        if let Err(why) = self.peer.permits(request) {
            return Err(Refusal::new(ErrorCode::PERMISSION_DENIED, why));
        }
        if access::is_control(request) {
            // Appends never come here: see `authorize_appends`.
            let per_frame = matches!(request, Request::DurableAck(_));
            self.log_control(request.name(), control_target(request), per_frame);
        }
        Ok(())
    }

    /// Logs a control request, naming the peer's uid and pid. Requests that
    /// come by the thousand (`per_frame`) are logged once a session.
    fn log_control(&mut self, request: &str, target: &str, per_frame: bool) {
        if per_frame && std::mem::replace(&mut self.logged_writes, true) {
            return;
        }
        if per_frame && self.shared.queue.storage_fault().is_some() {
            // Producers retrying against a degraded store reconnect every
            // few seconds; their sessions are refused, and the fault is
            // logged once (see `crate::degraded`).
            tracing::debug!(
                uid = self.peer.uid(),
                request,
                stream = target,
                "control request"
            );
            return;
        }
        // The target is named by the field the journal indexes (STREAM=
        // or EXECUTION=), so that `journalctl STREAM=jobs` finds it.
        let (uid, pid) = (self.peer.uid(), self.peer.pid());
        match request {
            _ if target.is_empty() => tracing::info!(uid, pid, request, "control request"),
            "Append" => tracing::info!(uid, pid, request, stream = target, "control request"),
            _ => tracing::info!(uid, pid, request, execution = target, "control request"),
        }
    }

    /// Whether the session keeps its thread awake, yielding to any other
    /// task, instead of letting it sleep until the answer comes: only for
    /// a producer that waits on each ack, and for at most
    /// [`AWAKE_FOR`] from the append. The answer comes from the writer
    /// after the log's sync; a thread asleep then must be woken to send it
    /// on, which on a virtual CPU adds tens of µs to every round trip.
    pub(super) fn stays_awake(&self) -> bool {
        self.awaiting_lone
            .is_some_and(|since| since.elapsed() < AWAKE_FOR)
    }

    /// [`Session::authorize`] for a batch of appends.
    fn authorize_appends(&mut self, batch: &[IngestAppend]) -> Result<(), Refusal> {
        if let Err(why) = self.peer.permits_appends() {
            return Err(Refusal::new(ErrorCode::PERMISSION_DENIED, why));
        }
        let target = batch.first().map_or("", |a| &*a.stream);
        self.log_control("Append", target, true);
        Ok(())
    }

    pub(super) async fn start_appends(&mut self, batch: Vec<IngestAppend>) -> Result<(), Refusal> {
        self.authorize_appends(&batch)?;
        check_payloads(&batch, self.max_frame_len())?;
        let lone = batch.len() == 1 && self.pending.is_empty();
        self.awaiting_lone = (lone && self.lone_streak).then(Instant::now);
        self.lone_streak = lone;
        // Submitted here, in socket order; only the outcome is awaited in
        // the pipeline. See `Queue::submit_append`.
        let outcomes = self.shared.queue.submit_append(batch).await?;
        self.pending
            .push_back(Box::pin(async move { Ok(coalesce_acks(outcomes.await?)) }));
        Ok(())
    }

    fn start_ack(&mut self, ack: DurableAck) -> Result<(), Refusal> {
        let Some(sub) = &self.subscription else {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                "DurableAck needs an open subscription with a consumer name",
            ));
        };
        let Some(consumer) = sub.consumer.clone() else {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "DurableAck on stream {:?} needs a subscription opened with a consumer name",
                    sub.stream
                ),
            ));
        };
        let stream = sub.stream.clone();
        let queue = self.shared.queue.clone();
        self.pending.push_back(Box::pin(async move {
            queue.ack(&stream, &consumer, ack.through_seq).await?;
            Ok(vec![Response::Acked(ack)])
        }));
        Ok(())
    }

    async fn handle_control(&mut self, mut request: Request) -> Result<(), Refusal> {
        if let Some(execution) = named_execution(&mut request) {
            *execution = self.shared.supervisor.resolve(execution);
        }
        match request {
            Request::Hello(_) => Err(Refusal::new(
                ErrorCode::HELLO_REQUIRED,
                "Hello was already received on this connection",
            )),
            gate @ (Request::Ask(_)
            | Request::AwaitAnswer { .. }
            | Request::Answer(_)
            | Request::ListQuestions { .. }
            | Request::Send { .. }
            | Request::Recv { .. }
            | Request::Dequeue { .. }) => self.serve_gate(gate).await,
            Request::Subscribe(subscribe) => self.open_subscription(subscribe).await,
            Request::DurableResume(resume) => self.resume_subscription(resume).await,
            Request::ListStreams => {
                let streams = self.shared.queue.list_streams().await?;
                self.send_all(parts::streams(streams, self.max_frame_len())?)
                    .await
            }
            Request::Status => {
                let status = self.status();
                self.send_all(vec![Response::Status(status)]).await
            }
            Request::MirrorStatus => {
                let info = crate::mirror::info(&self.shared.mirror, &self.shared.queue);
                self.send_all(vec![Response::MirrorStatus(info)]).await
            }
            Request::Verify => {
                let summary = self.shared.queue.verify().await?;
                self.send_all(vec![Response::Verified(summary)]).await
            }
            Request::Storage => {
                let degraded = self.shared.queue.storage_fault().map(|fault| StorageFault {
                    cause: fault.cause,
                    full: fault.full,
                    since_micros: fault
                        .since
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
                });
                let state = StorageState { degraded };
                self.send_all(vec![Response::Storage(state)]).await
            }
            Request::Run(spec) => self.run(spec.into()).await,
            Request::RunFull(run) => self.run(run).await,
            Request::ListExecutions { all } => {
                let executions = self.shared.supervisor.list(all);
                self.send_all(parts::executions(executions, self.max_frame_len())?)
                    .await
            }
            Request::ListExecutionsFull { all } => {
                let executions = self.shared.supervisor.list_full(all);
                self.send_all(parts::executions_full(executions, self.max_frame_len())?)
                    .await
            }
            Request::Stop {
                execution,
                timeout_ms,
            } => self.stop(&execution, timeout_ms).await,
            Request::Resume {
                execution,
                checkpoint,
            } => {
                let execution = self
                    .shared
                    .supervisor
                    .resume(&execution, checkpoint)
                    .await?;
                self.send_all(vec![Response::Started { execution }]).await
            }
            Request::Restart {
                execution,
                timeout_ms,
            } => self.restart(&execution, timeout_ms).await,
            Request::ShimHello(hello) => self.shim_hello(hello).await,
            Request::OutputFlushed { token } => {
                self.output_flushed(token);
                Ok(())
            }
            Request::WorkerExited(exited) => self.worker_exited(exited).await,
            Request::CheckpointSavePart(piece) => self.gather_checkpoint(&piece),
            Request::CheckpointSave(mut save) => {
                validate_name("execution", &save.execution)?;
                if !self.checkpoint_parts.is_empty() {
                    self.gather_checkpoint(&save.data)?;
                    save.data = std::mem::take(&mut self.checkpoint_parts).freeze();
                }
                self.shared.supervisor.flush_output(&save.execution).await;
                let meta = self.shared.queue.save_checkpoint(save).await?;
                self.send_all(vec![Response::CheckpointSaved(meta)]).await
            }
            Request::CheckpointLoad { execution } => self.load_checkpoint(&execution).await,
            Request::CheckpointList { execution } => {
                validate_name("execution", &execution)?;
                let list = self.shared.queue.list_checkpoints(&execution).await?;
                self.send_all(parts::checkpoints(list, self.max_frame_len())?)
                    .await
            }
            Request::StepGet { execution, step } => {
                validate_name("execution", &execution)?;
                let result = self.shared.queue.step(&execution, &step).await?;
                self.send_all(vec![Response::StepResult(result)]).await
            }
            Request::StepPut {
                execution,
                step,
                result,
            } => {
                validate_name("execution", &execution)?;
                let kept = self
                    .shared
                    .queue
                    .put_step(&execution, &step, result)
                    .await?;
                self.send_all(vec![Response::StepRecorded(kept)]).await
            }
            Request::StepList { execution } => {
                validate_name("execution", &execution)?;
                let steps = self.shared.queue.list_steps(&execution).await?;
                self.send_all(parts::steps(steps, self.max_frame_len())?)
                    .await
            }
            Request::StepClear {
                execution,
                steps,
                all,
            } => {
                validate_name("execution", &execution)?;
                let steps = (!all).then_some(steps);
                let cleared = self.shared.queue.clear_steps(&execution, steps).await?;
                self.send_all(vec![Response::StepsCleared(cleared)]).await
            }
            Request::CheckpointSaveFull(save) => self.save_checkpoint_full(save).await,
            Request::CheckpointLoadFull {
                execution,
                schema_version,
            } => self.load_checkpoint_full(&execution, schema_version).await,
            Request::CheckpointListFull { execution } => {
                validate_name("execution", &execution)?;
                let list = self.shared.queue.list_checkpoints_full(&execution).await?;
                self.send_all(parts::checkpoints_full(list, self.max_frame_len())?)
                    .await
            }
            Request::Metrics => {
                let text = crate::metrics::text_of(&self.shared)?;
                self.send_all(parts::metrics(text, self.max_frame_len())?)
                    .await
            }
            Request::Remove { executions, force } => self.remove(&executions, force).await,
            Request::Prune { older_than_ms } => self.prune(older_than_ms).await,
            Request::RemoveStreams { names } => {
                for name in &names {
                    validate_name("stream", name)?;
                }
                let removed = self.shared.supervisor.remove_streams(&names).await?;
                let names = removed.into_iter().map(|(name, _)| name).collect();
                self.send_all(vec![Response::Removed(names)]).await
            }
            Request::Append(_) | Request::AppendStamped(_) | Request::DurableAck(_) => {
                Err(Refusal::new(
                    ErrorCode::INTERNAL,
                    "pipelined request reached the control path",
                ))
            }
        }
    }

    /// Keeps a leading piece of the next checkpoint saved on this session.
    /// What is kept is bounded by the checkpoint size limit, checked as the
    /// pieces arrive rather than once they are all here.
    fn gather_checkpoint(&mut self, piece: &[u8]) -> Result<(), Refusal> {
        let limit = self.shared.config.max_checkpoint_bytes;
        let size = self.checkpoint_parts.len() + piece.len();
        if size > limit {
            return Err(crate::checkpoint::too_large("checkpoint", size, limit).into());
        }
        self.checkpoint_parts.extend_from_slice(piece);
        Ok(())
    }

    /// The newest valid checkpoint; having none is `NOT_FOUND`, which the
    /// client reports as "no checkpoint" (exit 3).
    async fn load_checkpoint(&mut self, execution: &str) -> Result<(), Refusal> {
        validate_name("execution", execution)?;
        match self.shared.queue.load_checkpoint(execution).await? {
            Some(checkpoint) => {
                self.send_all(parts::checkpoint(checkpoint, self.max_frame_len())?)
                    .await
            }
            None => Err(Refusal::new(
                ErrorCode::NOT_FOUND,
                format!("execution {execution} has no valid checkpoint"),
            )),
        }
    }

    /// A save with user metadata, refused for an execution that has ended
    /// unless forced: a worker's late save after its end is more likely a
    /// mistake than a repair.
    async fn save_checkpoint_full(&mut self, save: CheckpointSaveFull) -> Result<(), Refusal> {
        let CheckpointSaveFull {
            execution,
            schema_version,
            mut data,
            user_meta,
            force,
        } = save;
        validate_name("execution", &execution)?;
        if !self.checkpoint_parts.is_empty() {
            self.gather_checkpoint(&data)?;
            data = std::mem::take(&mut self.checkpoint_parts).freeze();
        }
        if !force {
            let info = self.shared.supervisor.get(&execution)?;
            if state::is_final(info.state) {
                return Err(Refusal::new(
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "execution {execution} has ended ({}); a checkpoint saved now is \
                         only used if it is resumed: pass --force to save it anyway",
                        info.state.as_str()
                    ),
                ));
            }
        }
        self.shared.supervisor.flush_output(&execution).await;
        let save = CheckpointSave {
            execution,
            schema_version,
            data,
        };
        let meta = self
            .shared
            .queue
            .save_checkpoint_with(save, user_meta)
            .await?;
        self.send_all(vec![Response::CheckpointSaved(meta)]).await
    }

    /// The newest valid checkpoint (of `schema_version`, if given) with its
    /// user metadata; having none is `NOT_FOUND`.
    async fn load_checkpoint_full(
        &mut self,
        execution: &str,
        schema_version: Option<u32>,
    ) -> Result<(), Refusal> {
        validate_name("execution", execution)?;
        let found = self
            .shared
            .queue
            .load_checkpoint_full(execution, schema_version)
            .await?;
        match found {
            Some(checkpoint) => {
                self.send_all(parts::checkpoint_full(checkpoint, self.max_frame_len())?)
                    .await
            }
            None => Err(Refusal::new(
                ErrorCode::NOT_FOUND,
                match schema_version {
                    Some(v) => format!(
                        "execution {execution} has no valid checkpoint of schema version {v}"
                    ),
                    None => format!("execution {execution} has no valid checkpoint"),
                },
            )),
        }
    }

    async fn run(&mut self, mut run: RunSpecFull) -> Result<(), Refusal> {
        // `[restart] max_restarts` of the config file: the limit of a run
        // whose client set none.
        if run.spec.max_restarts.is_none() {
            run.spec.max_restarts = self.shared.config.default_max_restarts;
        }
        if run.max_failures_without_progress.is_none() {
            run.max_failures_without_progress =
                self.shared.config.default_max_failures_without_progress;
        }
        let execution = self.shared.supervisor.run(run).await?;
        self.send_all(vec![Response::Started { execution }]).await
    }

    async fn stop(&mut self, execution: &str, timeout_ms: u64) -> Result<(), Refusal> {
        let timeout = Duration::from_millis(timeout_ms);
        let stopped = tokio::select! {
            // Stopping can take the whole timeout; a daemon shutting down
            // does not wait for it (the stop is recorded and carried on by
            // the next daemon).
            _ = self.shutdown.cancelled() => return Err(Error::ShuttingDown.into()),
            stopped = self.shared.supervisor.stop(execution, timeout) => stopped?,
        };
        self.send_all(vec![Response::Stopped(stopped)]).await
    }

    async fn restart(&mut self, execution: &str, timeout_ms: u64) -> Result<(), Refusal> {
        let timeout = Duration::from_millis(timeout_ms);
        let execution = tokio::select! {
            // As with stop: the restart is carried on by the next daemon.
            _ = self.shutdown.cancelled() => return Err(Error::ShuttingDown.into()),
            restarted = self.shared.supervisor.restart(execution, timeout) => restarted?,
        };
        self.send_all(vec![Response::Started { execution }]).await
    }

    /// `tether rm`: ids only, never names, so that a name cannot pick
    /// another execution than the one meant.
    async fn remove(&mut self, executions: &[String], force: bool) -> Result<(), Refusal> {
        for id in executions {
            validate_name("execution", id)?;
        }
        let removed = tokio::select! {
            // `--force` may wait for a stop; a daemon shutting down does not.
            _ = self.shutdown.cancelled() => return Err(Error::ShuttingDown.into()),
            removed = self.shared.supervisor.remove(executions, force) => removed?,
        };
        self.send_all(vec![Response::Removed(removed)]).await
    }

    /// `tether prune`: without an age, the configured `keep_ended`.
    async fn prune(&mut self, older_than_ms: Option<u64>) -> Result<(), Refusal> {
        let older_than = match older_than_ms {
            Some(ms) => Duration::from_millis(ms),
            None => self.shared.config.keep_ended.ok_or_else(|| {
                Error::InvalidRequest(
                    "[executions] keep_ended is off: say how old with --older-than".into(),
                )
            })?,
        };
        let removed = self.shared.supervisor.prune(older_than).await?;
        self.send_all(vec![Response::Removed(removed)]).await
    }

    async fn shim_hello(&mut self, hello: ShimHello) -> Result<(), Refusal> {
        if let Some((execution, attempt)) = &self.shim {
            if *execution != hello.execution || *attempt != hello.attempt {
                return Err(Refusal::new(
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "this connection is the shim of attempt {attempt} of {execution}; \
                         open another connection for another attempt"
                    ),
                ));
            }
        }
        let attached = (hello.execution.clone(), hello.attempt);
        self.shared.supervisor.shim_hello(hello).await?;
        if self.takes_flush && self.flush_asks.is_none() {
            let (asks, received) = tokio::sync::mpsc::channel(FLUSH_ASKS);
            self.shared.supervisor.attach_flusher(&attached.0, asks);
            self.flush_asks = Some(received);
        }
        self.shim = Some(attached);
        self.send_all(vec![Response::ShimAccepted]).await
    }

    async fn worker_exited(&mut self, exited: WorkerExited) -> Result<(), Refusal> {
        let is_its_shim = self
            .shim
            .as_ref()
            .is_some_and(|(e, a)| *e == exited.execution && *a == exited.attempt);
        if !is_its_shim {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "WorkerExited for attempt {} of {} needs that attempt's ShimHello first \
                     on the same connection",
                    exited.attempt, exited.execution
                ),
            ));
        }
        self.shared.supervisor.worker_exited(exited).await?;
        self.send_all(vec![Response::ExitRecorded]).await
    }

    fn status(&self) -> StatusInfo {
        let shared = &self.shared;
        StatusInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_secs: shared.started.elapsed().as_secs(),
            socket: shared.config.socket.display().to_string(),
            state_dir: shared.config.state_dir.display().to_string(),
            store_bytes: shared.queue.store_bytes(),
            streams: shared.queue.stream_count(),
            executions: shared.supervisor.count(),
            connections: shared.connections.load(Ordering::Relaxed),
        }
    }
}

/// One cumulative `Appended` per (stream, producer) of a committed batch,
/// carrying its highest producer seq. Appends of one producer arrive in
/// producer-seq order, so the last outcome of each pair is the highest.
fn coalesce_acks(outcomes: Vec<AppendOutcome>) -> Vec<Response> {
    let mut newest: Vec<AppendOutcome> = Vec::new();
    for outcome in outcomes {
        match newest
            .iter_mut()
            .find(|n| n.stream == outcome.stream && n.producer == outcome.producer)
        {
            Some(n) => *n = outcome,
            None => newest.push(outcome),
        }
    }
    newest
        .into_iter()
        .map(|n| {
            Response::Appended(Appended {
                stream: n.stream.to_string(),
                producer: n.producer.to_string(),
                producer_seq: n.producer_seq,
                seq: n.seq,
            })
        })
        .collect()
}

/// Refuses a payload over the maximum message size less the envelope: a
/// frame stored is one a reader can be sent, in one message, whatever the
/// names that came with it (see [`tether_protocol::FRAME_ENVELOPE`]).
fn check_payloads(batch: &[IngestAppend], max_frame_len: usize) -> Result<(), Refusal> {
    let max = max_payload_len(max_frame_len);
    match batch.iter().find(|a| a.payload.len() > max) {
        None => Ok(()),
        Some(append) => Err(Refusal::new(
            ErrorCode::FRAME_TOO_LARGE,
            format!(
                "a payload of {} bytes for stream {:?} exceeds the limit of {max} bytes \
                 (the maximum message size less {FRAME_ENVELOPE} bytes)",
                append.payload.len(),
                &*append.stream,
            ),
        )),
    }
}

/// What a control request acts on, for its log line.
fn control_target(request: &Request) -> &str {
    match request {
        Request::Run(spec) => spec.name.as_deref().unwrap_or(""),
        Request::RunFull(run) => run.spec.name.as_deref().unwrap_or(""),
        Request::Stop { execution, .. }
        | Request::Resume { execution, .. }
        | Request::Restart { execution, .. }
        | Request::StepPut { execution, .. }
        | Request::StepClear { execution, .. } => execution,
        Request::CheckpointSave(save) => &save.execution,
        Request::CheckpointSaveFull(save) => &save.execution,
        Request::Ask(spec) => &spec.execution,
        Request::Answer(spec) => &spec.execution,
        Request::Send { execution, .. } => execution,
        Request::Remove { executions, .. } => executions.first().map_or("", String::as_str),
        Request::RemoveStreams { names } => names.first().map_or("", String::as_str),
        _ => "",
    }
}

/// The execution a request names, which may be given by its name (`run
/// --name`): resolved here, once, for every client and SDK. Shim requests
/// name their attempt's execution by id and are left alone.
fn named_execution(request: &mut Request) -> Option<&mut String> {
    match request {
        Request::Stop { execution, .. }
        | Request::Resume { execution, .. }
        | Request::Restart { execution, .. }
        | Request::CheckpointLoad { execution }
        | Request::CheckpointList { execution }
        | Request::StepGet { execution, .. }
        | Request::StepPut { execution, .. }
        | Request::StepList { execution }
        | Request::StepClear { execution, .. }
        | Request::CheckpointLoadFull { execution, .. }
        | Request::CheckpointListFull { execution } => Some(execution),
        Request::CheckpointSave(save) => Some(&mut save.execution),
        Request::CheckpointSaveFull(save) => Some(&mut save.execution),
        Request::Ask(spec) => Some(&mut spec.execution),
        Request::Answer(spec) => Some(&mut spec.execution),
        Request::Send { execution, .. }
        | Request::Recv { execution, .. }
        | Request::Dequeue { execution, .. } => Some(execution),
        _ => None,
    }
}
