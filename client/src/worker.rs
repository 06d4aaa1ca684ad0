//! The worker SDK: what a program supervised by `tetherd` uses to write to
//! its own stream, save and restore checkpoints, and run durable steps.
//!
//! A supervised worker finds everything it needs in its environment
//! (`TETHER_EXECUTION_ID`, `TETHER_SOCKET`, `TETHER_RESUMED`), so
//! [`Worker::from_env`] is the usual way in:
//!
//! ```no_run
//! # async fn agent() -> Result<(), tether::worker::Error> {
//! use tether::{CheckpointTrigger, Worker};
//!
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! struct Plan { next: u32 }
//!
//! let worker = Worker::from_env()?;
//! let mut plan: Plan = worker.restore(1).await?.unwrap_or_default();
//! let mut trigger = CheckpointTrigger::when(|done: &u32| *done % 2 == 0);
//! while plan.next < 8 {
//!     let step = plan.next;
//!     let out: String = worker
//!         .step(&format!("step-{step}"), || async move {
//!             Ok::<_, std::io::Error>(format!("step {step} done"))
//!         })
//!         .await?;
//!     println!("{out}");
//!     plan.next += 1;
//!     if trigger.should_checkpoint(&step) {
//!         worker.checkpoint(&plan, 1).await?;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Checkpoints and step results are encoded with `serde_json`. A checkpoint
//! carries the worker's own schema version; [`Worker::restore`] refuses a
//! stored version other than the one asked for with
//! [`Error::SchemaMismatch`], and data that does not fit the type with
//! [`Error::Decode`], so a worker never silently resumes from garbage.
//!
//! Every request goes over one session that is reopened (with backoff,
//! within the connector's retry window) when it is lost, so a worker rides
//! out a daemon restart. Requests other than a checkpoint save are
//! idempotent; a save whose answer was lost is sent again and may then be
//! stored twice, which costs one extra (identical) checkpoint and nothing
//! else.

use std::fmt;
use std::future::Future;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tether_protocol::{
    Checkpoint, CheckpointFull, CheckpointMeta, CheckpointSave, CheckpointSaveFull, ErrorCode,
    FrameKind, Request, Response, UserMeta,
};
use tokio::sync::Mutex;

use crate::conn::{unexpected, ConnectOptions, Connector, Endpoint, Link};
use crate::publisher::{Publisher, PublisherOptions};

/// The variable naming the execution a worker belongs to.
pub const ENV_EXECUTION: &str = "TETHER_EXECUTION_ID";
/// The variable naming the daemon's socket.
pub const ENV_SOCKET: &str = "TETHER_SOCKET";
/// The variable that is `1` when the attempt resumes from a checkpoint.
pub const ENV_RESUMED: &str = "TETHER_RESUMED";
/// The variable with the attempt's number (1, 2, ...).
pub const ENV_ATTEMPT: &str = "TETHER_ATTEMPT";

/// The worker SDK's errors are the crate's [`Error`]: its variants
/// `NotUnderTether`, `SchemaMismatch`, `Decode`, `Encode` and `Step` are
/// the worker's own.
pub use crate::Error;

/// Result with the worker SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A supervised worker's handle on the daemon. See the module docs.
#[derive(Debug)]
pub struct Worker {
    execution: String,
    resumed: bool,
    /// `None` when the daemon did not say.
    attempt: Option<u64>,
    session: Mutex<Session>,
    emitter: Mutex<Emitter>,
    /// For what opens sessions of its own (`ask`, `recv`).
    connector: Connector,
    /// The id of the inbox message [`Worker::recv`] handed over last, to
    /// be removed from the inbox by the next `recv`.
    pub(crate) handed: Mutex<Option<u64>>,
}

impl Worker {
    /// The worker of the execution named by `TETHER_EXECUTION_ID`, talking
    /// to the daemon at `TETHER_SOCKET` (else the default socket), resumed
    /// when `TETHER_RESUMED=1`.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Like [`Worker::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let execution =
            var(ENV_EXECUTION)
                .filter(|v| !v.is_empty())
                .ok_or(Error::NotUnderTether {
                    variable: ENV_EXECUTION,
                })?;
        let endpoint = match var(ENV_SOCKET).filter(|v| !v.is_empty()) {
            Some(path) => Endpoint::unix(path),
            None => Endpoint::default_local(),
        };
        let resumed = var(ENV_RESUMED).is_some_and(|v| v == "1");
        let options = ConnectOptions {
            client: format!("tether-worker {} {execution}", env!("CARGO_PKG_VERSION")),
            ..ConnectOptions::default()
        };
        let mut worker = Self::new(execution, Connector::new(endpoint, options), resumed)?;
        worker.attempt = var(ENV_ATTEMPT).and_then(|v| v.trim().parse().ok());
        Ok(worker)
    }

    /// A worker of `execution` that reaches the daemon through `connector`.
    /// Connects lazily, on the first request.
    pub fn new(execution: impl Into<String>, connector: Connector, resumed: bool) -> Result<Self> {
        let execution = execution.into();
        let emitter = Emitter::new(&connector, &execution)?;
        Ok(Self {
            session: Mutex::new(Session::new(connector.clone())),
            emitter: Mutex::new(emitter),
            connector,
            handed: Mutex::new(None),
            execution,
            resumed,
            attempt: None,
        })
    }

    /// The attempt's number (1, 2, ...), when the daemon says it
    /// (`TETHER_ATTEMPT`).
    pub fn attempt(&self) -> Option<u64> {
        self.attempt
    }

    /// True when this attempt was started from a checkpoint
    /// (`TETHER_RESUMED=1`): [`Worker::restore`] then has state to return.
    pub fn is_resumed(&self) -> bool {
        self.resumed
    }

    /// How this worker reaches the daemon.
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The execution id, which is also the name of its stream.
    pub fn execution(&self) -> &str {
        &self.execution
    }

    /// Appends one frame of `kind` to the execution's stream. It is durable
    /// when this returns. Frames are written as producer
    /// `worker-<execution>-<pid>`.
    pub async fn emit(&self, kind: FrameKind, payload: impl Into<Bytes>) -> Result<()> {
        let mut emitter = self.emitter.lock().await;
        emitter.emit(kind, payload.into()).await?;
        Ok(())
    }

    /// Saves `state` (as JSON) as the execution's newest checkpoint, tagged
    /// with `schema_version`. Durable when this returns.
    pub async fn checkpoint<T: Serialize + ?Sized>(
        &self,
        state: &T,
        schema_version: u32,
    ) -> Result<CheckpointMeta> {
        let data = serde_json::to_vec(state).map_err(|source| Error::Encode {
            what: "the checkpoint".into(),
            source,
        })?;
        self.save_bytes(Bytes::from(data), schema_version).await
    }

    /// Saves raw bytes as the newest checkpoint, for workers with their own
    /// encoding.
    pub async fn save_bytes(&self, data: Bytes, schema_version: u32) -> Result<CheckpointMeta> {
        let request = save_request(&self.execution, schema_version, data.clone());
        self.save(&request, || {
            save_requests_in_parts(&self.execution, schema_version, data)
        })
        .await
    }

    /// [`Worker::save_bytes`] with `user_meta` kept beside the data (shown
    /// by `tether checkpoint list` and returned by [`Worker::load_full`]).
    pub async fn save_full(
        &self,
        data: Bytes,
        schema_version: u32,
        user_meta: UserMeta,
    ) -> Result<CheckpointMeta> {
        let save = CheckpointSaveFull {
            execution: self.execution.clone(),
            schema_version,
            data,
            user_meta,
            force: false,
        };
        let request = Request::CheckpointSaveFull(save.clone());
        self.save(&request, || save_full_requests_in_parts(save))
            .await
    }

    /// Sends a save, and again in pieces (from `in_parts`) when the daemon
    /// refuses it whole as too large.
    async fn save(
        &self,
        request: &Request,
        in_parts: impl FnOnce() -> (Vec<Request>, Request),
    ) -> Result<CheckpointMeta> {
        let response = match self.call(request).await {
            Err(e) if refused_as_too_large(&e) => {
                let (leading, last) = in_parts();
                let mut session = self.session.lock().await;
                session.call_after(&leading, &last).await?
            }
            answer => answer?,
        };
        saved(response)
    }

    /// The newest valid checkpoint, decoded as `T`; `None` when there is
    /// none. A checkpoint of another schema version is
    /// [`Error::SchemaMismatch`]; JSON that does not fit `T` is
    /// [`Error::Decode`].
    pub async fn restore<T: DeserializeOwned>(&self, schema_version: u32) -> Result<Option<T>> {
        let Some(checkpoint) = self.load_bytes().await? else {
            return Ok(None);
        };
        let meta = &checkpoint.meta;
        if meta.schema_version != schema_version {
            return Err(Error::SchemaMismatch {
                stored: meta.schema_version,
                expected: schema_version,
            });
        }
        serde_json::from_slice(&checkpoint.data)
            .map(Some)
            .map_err(|source| Error::Decode {
                what: format!("checkpoint {} (seq {})", meta.id, meta.seq),
                source,
            })
    }

    /// The newest valid checkpoint as stored, or `None` when there is none.
    pub async fn load_bytes(&self) -> Result<Option<Checkpoint>> {
        let request = load_request(&self.execution);
        match self.call(&request).await {
            Ok(response) => Ok(Some(loaded(response)?)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The newest valid checkpoint with its metadata, of exactly
    /// `schema_version` when one is given; `None` when there is none.
    pub async fn load_full(&self, schema_version: Option<u32>) -> Result<Option<CheckpointFull>> {
        let request = load_full_request(&self.execution, schema_version);
        match self.call(&request).await {
            Ok(response) => Ok(Some(loaded_full(response)?)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Runs a durable step. If a result for `name` is recorded for this
    /// execution (by an earlier attempt), it is returned and `body` is not
    /// run. Otherwise `body` runs, its result is recorded, and the recorded
    /// result is returned: should another attempt have recorded one first,
    /// that first one wins. A failing `body` records nothing.
    pub async fn step<T, E, F, Fut>(&self, name: &str, body: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        if let Some(recorded) = self.step_get(name).await? {
            return decode_step(name, &recorded);
        }
        let value = body().await.map_err(|e| Error::Step {
            step: name.to_owned(),
            source: e.into(),
        })?;
        let result = serde_json::to_vec(&value).map_err(|source| Error::Encode {
            what: format!("the result of step {name:?}"),
            source,
        })?;
        let kept = self.step_put(name, Bytes::from(result)).await?;
        decode_step(name, &kept)
    }

    /// The result recorded for step `name` of this execution, as stored;
    /// `None` when there is none. For SDKs with their own encoding.
    pub async fn step_get(&self, name: &str) -> Result<Option<Bytes>> {
        let get = Request::StepGet {
            execution: self.execution.clone(),
            step: name.to_owned(),
        };
        step_result(self.call(&get).await?)
    }

    /// Records `result` for step `name` unless one is recorded already, and
    /// returns the result that stands (the first recorded wins). Durable
    /// when this returns.
    pub async fn step_put(&self, name: &str, result: Bytes) -> Result<Bytes> {
        let put = Request::StepPut {
            execution: self.execution.clone(),
            step: name.to_owned(),
            result,
        };
        step_recorded(self.call(&put).await?)
    }

    /// Forgets the results recorded for `steps` (every step with `all`), so
    /// that they run again; returns how many were forgotten. Durable when
    /// this returns.
    pub async fn step_clear(&self, steps: Vec<String>, all: bool) -> Result<u64> {
        let request = step_clear_request(&self.execution, steps, all);
        steps_cleared(self.call(&request).await?)
    }

    /// Sends one request and returns its answer, over the shared session.
    async fn call(&self, request: &Request) -> crate::Result<Response> {
        self.session.lock().await.call(request).await
    }
}

/// The reconnecting session requests go over.
#[derive(Debug)]
struct Session {
    link: Link,
    /// True while a request is between being sent and being answered. A
    /// caller that gave up waiting (its future dropped) leaves it set, and
    /// the next call then starts a fresh session rather than read the
    /// answer meant for the abandoned request.
    in_flight: bool,
}

impl Session {
    fn new(connector: Connector) -> Self {
        Self {
            link: Link::new(connector),
            in_flight: false,
        }
    }

    async fn call(&mut self, request: &Request) -> crate::Result<Response> {
        self.call_after(&[], request).await
    }

    /// [`Session::call`], sending `leading` (requests the daemon does not
    /// answer) first, on the same session.
    async fn call_after(
        &mut self,
        leading: &[Request],
        request: &Request,
    ) -> crate::Result<Response> {
        if self.in_flight {
            self.link = Link::new(self.link.connector().clone());
            self.in_flight = false;
        }
        loop {
            self.link.establish().await?;
            let Some(conn) = self.link.connection() else {
                continue;
            };
            self.in_flight = true;
            let outcome = conn.request_after(leading, request).await;
            self.in_flight = false;
            match outcome {
                Ok(response) => {
                    self.link.progressed();
                    return Ok(response);
                }
                // The daemon closes a session after refusing a request, so
                // a refusal also means the next call needs a new session;
                // `lose` takes care of both cases.
                Err(e) => self.link.lose(e)?,
            }
        }
    }
}

/// Appends frames to the execution's stream as one producer.
#[derive(Debug)]
struct Emitter {
    publisher: Publisher,
    next_seq: u64,
}

impl Emitter {
    fn new(connector: &Connector, execution: &str) -> crate::Result<Self> {
        let producer = format!("worker-{execution}-{}", std::process::id());
        let publisher = Publisher::new(
            connector.clone(),
            execution,
            producer,
            PublisherOptions::default(),
        )?;
        // Producer seqs start at the current time in microseconds rather
        // than at 1: should a later attempt of the same execution get the
        // same pid (and so the same producer name), its seqs are still
        // above every earlier one and the daemon does not drop its frames
        // as duplicates.
        Ok(Self {
            publisher,
            next_seq: crate::time::now_micros().max(1),
        })
    }

    async fn emit(&mut self, kind: FrameKind, payload: Bytes) -> crate::Result<()> {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.publisher.publish_kind(seq, kind, payload).await?;
        self.publisher.flush().await
    }
}

/// Decides, event by event, when an agent loop should checkpoint: on the
/// events a predicate picks (a plan step marked done, say), and of those
/// only on every n-th.
pub struct CheckpointTrigger<E> {
    predicate: Box<dyn FnMut(&E) -> bool + Send>,
    every: u64,
    matched: u64,
}

impl<E> CheckpointTrigger<E> {
    /// Checkpoint on every event for which `predicate` is true.
    pub fn when(predicate: impl FnMut(&E) -> bool + Send + 'static) -> Self {
        Self {
            predicate: Box::new(predicate),
            every: 1,
            matched: 0,
        }
    }

    /// Checkpoint on every event.
    pub fn always() -> Self {
        Self::when(|_| true)
    }

    /// Checkpoint only on every `n`-th matching event (the n-th, the
    /// 2n-th, ...). `0` is taken as `1`.
    pub fn every(mut self, n: u64) -> Self {
        self.every = n.max(1);
        self
    }

    /// True when the loop should checkpoint after `event`.
    pub fn should_checkpoint(&mut self, event: &E) -> bool {
        if !(self.predicate)(event) {
            return false;
        }
        self.matched += 1;
        self.matched.is_multiple_of(self.every)
    }
}

impl<E> fmt::Debug for CheckpointTrigger<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointTrigger")
            .field("every", &self.every)
            .field("matched", &self.matched)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// Requests and answers, shared with the `tether checkpoint` and `step` commands
// ---------------------------------------------------------------------------

/// The request that saves `data` as the newest checkpoint of `execution`.
pub fn save_request(execution: &str, schema_version: u32, data: Bytes) -> Request {
    Request::CheckpointSave(CheckpointSave {
        execution: execution.to_owned(),
        schema_version,
        data,
    })
}

/// The pieces a checkpoint's data is cut into when the daemon refused it
/// whole, as larger than its maximum message size: small enough for the
/// smallest maximum a daemon accepts (1 KiB) with the message around them.
pub const SAVE_PIECE_LEN: usize = 960;

/// The requests that save `data` in pieces, for a daemon whose maximum
/// message size it exceeds: `CheckpointSavePart`s of [`SAVE_PIECE_LEN`]
/// bytes, then the save with the last piece. They must go on one session.
pub fn save_requests_in_parts(
    execution: &str,
    schema_version: u32,
    mut data: Bytes,
) -> (Vec<Request>, Request) {
    let leading = leading_pieces(&mut data);
    (leading, save_request(execution, schema_version, data))
}

/// [`save_requests_in_parts`] for a save with metadata.
pub fn save_full_requests_in_parts(mut save: CheckpointSaveFull) -> (Vec<Request>, Request) {
    let leading = leading_pieces(&mut save.data);
    (leading, Request::CheckpointSaveFull(save))
}

/// Cuts all but the last [`SAVE_PIECE_LEN`] bytes off `data`, as
/// `CheckpointSavePart`s.
fn leading_pieces(data: &mut Bytes) -> Vec<Request> {
    let mut leading = Vec::with_capacity(data.len() / SAVE_PIECE_LEN);
    while data.len() > SAVE_PIECE_LEN {
        leading.push(Request::CheckpointSavePart(data.split_to(SAVE_PIECE_LEN)));
    }
    leading
}

/// Whether the daemon refused a request as larger than its maximum message
/// size. A checkpoint save refused so is sent again in pieces: the client
/// does not know the daemon's maximum, and at the defaults every
/// checkpoint fits in one message.
pub fn refused_as_too_large(e: &crate::Error) -> bool {
    e.daemon_code() == Some(ErrorCode::FRAME_TOO_LARGE)
}

/// The request that loads the newest valid checkpoint of `execution`.
pub fn load_request(execution: &str) -> Request {
    Request::CheckpointLoad {
        execution: execution.to_owned(),
    }
}

/// The request that loads the newest valid checkpoint of `execution` with
/// its metadata, of exactly `schema_version` when one is given.
pub fn load_full_request(execution: &str, schema_version: Option<u32>) -> Request {
    Request::CheckpointLoadFull {
        execution: execution.to_owned(),
        schema_version,
    }
}

/// The request that forgets recorded step results: `steps`, or every one
/// with `all`.
pub fn step_clear_request(execution: &str, steps: Vec<String>, all: bool) -> Request {
    Request::StepClear {
        execution: execution.to_owned(),
        steps,
        all,
    }
}

/// The answer to a save: the stored checkpoint's metadata.
pub fn saved(response: Response) -> crate::Result<CheckpointMeta> {
    match response {
        Response::CheckpointSaved(meta) => Ok(meta),
        other => Err(unexpected("CheckpointSaved", &other)),
    }
}

/// The answer to a load: the checkpoint.
pub fn loaded(response: Response) -> crate::Result<Checkpoint> {
    match response {
        Response::Checkpoint(checkpoint) => Ok(checkpoint),
        other => Err(unexpected("Checkpoint", &other)),
    }
}

/// The answer to a load with metadata: the checkpoint.
pub fn loaded_full(response: Response) -> crate::Result<CheckpointFull> {
    match response {
        Response::CheckpointFull(checkpoint) => Ok(checkpoint),
        other => Err(unexpected("CheckpointFull", &other)),
    }
}

/// The answer to a step clear: how many results were forgotten.
pub fn steps_cleared(response: Response) -> crate::Result<u64> {
    match response {
        Response::StepsCleared(count) => Ok(count),
        other => Err(unexpected("StepsCleared", &other)),
    }
}

/// The answer to a list: checkpoints, newest first.
pub fn listed(response: Response) -> crate::Result<Vec<CheckpointMeta>> {
    match response {
        Response::Checkpoints(list) => Ok(list),
        other => Err(unexpected("Checkpoints", &other)),
    }
}

fn step_result(response: Response) -> crate::Result<Option<Bytes>> {
    match response {
        Response::StepResult(result) => Ok(result),
        other => Err(unexpected("StepResult", &other)),
    }
}

fn step_recorded(response: Response) -> crate::Result<Bytes> {
    match response {
        Response::StepRecorded(result) => Ok(result),
        other => Err(unexpected("StepRecorded", &other)),
    }
}

fn decode_step<T: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| Error::Decode {
        what: format!("the recorded result of step {name:?}"),
        source,
    })
}

fn is_not_found(e: &crate::Error) -> bool {
    e.daemon_code() == Some(ErrorCode::NOT_FOUND)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_trigger_fires_on_matching_events_only() {
        let mut trigger = CheckpointTrigger::when(|e: &&str| e.starts_with("done"));
        assert!(!trigger.should_checkpoint(&"thinking"));
        assert!(trigger.should_checkpoint(&"done 1"));
        assert!(trigger.should_checkpoint(&"done 2"));
    }

    #[test]
    fn every_n_counts_matching_events_not_all_events() {
        let mut trigger = CheckpointTrigger::when(|e: &u32| e.is_multiple_of(2)).every(2);
        let fired: Vec<u32> = (0..10).filter(|e| trigger.should_checkpoint(e)).collect();
        // Matching: 0, 2, 4, 6, 8; every second of them fires.
        assert_eq!(fired, vec![2, 6]);
        let mut zero = CheckpointTrigger::<u32>::always().every(0);
        assert!(zero.should_checkpoint(&1));
    }

    #[test]
    fn outside_tether_the_missing_variable_is_named() {
        let err = Worker::from_vars(|_| None).unwrap_err();
        assert!(matches!(
            err,
            Error::NotUnderTether {
                variable: ENV_EXECUTION
            }
        ));
        assert!(err.to_string().contains("TETHER_EXECUTION_ID"), "{err}");
        assert_eq!(err.exit_code(), 1);
    }

    #[test]
    fn the_environment_sets_execution_socket_and_resumed() {
        let vars = |name: &str| match name {
            ENV_EXECUTION => Some("agent-abc123".to_owned()),
            ENV_SOCKET => Some("/tmp/x/t.sock".to_owned()),
            ENV_RESUMED => Some("1".to_owned()),
            _ => None,
        };
        let worker = Worker::from_vars(vars).unwrap();
        assert_eq!(worker.execution(), "agent-abc123");
        assert!(worker.is_resumed());
        let fresh = Worker::from_vars(|name| (name == ENV_EXECUTION).then(|| "e".to_owned()));
        assert!(!fresh.unwrap().is_resumed());
    }

    #[test]
    fn a_schema_mismatch_names_both_versions() {
        let err = Error::SchemaMismatch {
            stored: 3,
            expected: 2,
        };
        assert_eq!(
            err.to_string(),
            "the newest checkpoint has schema version 3, this worker expects 2"
        );
    }
}
