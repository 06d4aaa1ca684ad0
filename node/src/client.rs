//! `NativeClient` and `NativeTail`: publish to and read streams, run and
//! stop workers, over `tether::sdk`. `index.js` wraps them in `Client` and
//! `Tail` (the async iterator).

use std::time::Duration;

use bytes::Bytes;
use napi::bindgen_prelude::{Buffer, Float64Array, Uint32Array, Uint8Array};
use napi_derive::napi;
use tether::conn::ConnectOptions;
use tether::sdk::{self, RunOptions, TailItem, TailOptions};
use tether_protocol::{FrameKind, RestartPolicy};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::errors::{argument, to_napi};

/// How long `stop` waits between SIGTERM and SIGKILL unless told.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to a tetherd; see `Client` in `index.js`.
#[napi]
#[derive(Debug)]
pub struct NativeClient {
    inner: sdk::Client,
}

/// A worker to start; see `Client.run` in `index.js`.
#[napi(object)]
#[derive(Debug)]
pub struct NativeRunSpec {
    pub command: Vec<String>,
    pub name: Option<String>,
    /// `never`, `on-failure` (the default) or `always`.
    pub restart: Option<String>,
    pub max_restarts: Option<u32>,
    /// Seconds.
    pub deadline: Option<f64>,
    pub cwd: Option<String>,
    /// `[key, value]` pairs.
    pub env: Option<Vec<Vec<String>>>,
    /// The execution's id; an existing one is left alone.
    pub id: Option<String>,
    /// `[key, value]` pairs.
    pub labels: Option<Vec<Vec<String>>>,
    pub parent: Option<String>,
    pub max_failures_without_progress: Option<u32>,
}

#[napi]
impl NativeClient {
    /// `connect_timeout`: seconds to keep retrying an unreachable daemon.
    #[napi(constructor)]
    pub fn new(
        socket: Option<String>,
        host: Option<String>,
        connect_timeout: Option<f64>,
    ) -> napi::Result<Self> {
        let endpoint =
            sdk::Client::endpoint_of(socket.map(Into::into), host.as_deref()).map_err(argument)?;
        let mut options = ConnectOptions::default();
        if let Some(secs) = connect_timeout {
            options.retry_window = seconds(secs, "connectTimeout")?;
        }
        Ok(Self {
            inner: sdk::Client::new(endpoint, options, "node"),
        })
    }

    /// Appends each item as one frame of kind `data`; resolves once all
    /// are durable.
    #[napi]
    pub async fn publish(
        &self,
        stream: String,
        producer: Option<String>,
        items: Vec<Buffer>,
    ) -> napi::Result<()> {
        let payloads = items.into_iter().map(|b| Bytes::from(b.to_vec())).collect();
        self.inner
            .publish(&stream, producer.as_deref(), payloads)
            .await
            .map_err(to_napi)
    }

    /// Opens a reader of `stream`; see `Client.tail` in `index.js`.
    #[napi]
    pub async fn tail(
        &self,
        stream: String,
        follow: bool,
        from_seq: Option<f64>,
        last: Option<f64>,
        cursor_file: Option<String>,
        consumer: Option<String>,
    ) -> napi::Result<NativeTail> {
        let options = TailOptions {
            stream,
            follow,
            from_seq: from_seq.map(|s| whole(s, "fromSeq")).transpose()?,
            last: last.map(|n| whole(n, "last")).transpose()?,
            cursor_file: cursor_file.map(Into::into),
            consumer,
        };
        let tail = self.inner.tail(options).await.map_err(to_napi)?;
        Ok(NativeTail {
            tail: Mutex::new(tail),
            closing: CancellationToken::new(),
        })
    }

    /// The daemon's status, as the JSON `tether status --json` prints.
    #[napi]
    pub async fn status(&self) -> napi::Result<String> {
        Ok(self.inner.status().await.map_err(to_napi)?.to_string())
    }

    /// Every stream, as the JSON `tether streams --json` prints.
    #[napi]
    pub async fn streams(&self) -> napi::Result<String> {
        Ok(self.inner.streams().await.map_err(to_napi)?.to_string())
    }

    /// Starts a supervised worker; resolves to its execution id.
    #[napi]
    pub async fn run(&self, spec: NativeRunSpec) -> napi::Result<String> {
        let mut options = RunOptions::new(spec.command);
        options.name = spec.name;
        if let Some(restart) = spec.restart {
            options.restart = RestartPolicy::from_name(&restart).ok_or_else(|| {
                argument(format!(
                    "restart must be \"never\", \"on-failure\" or \"always\", not {restart:?}"
                ))
            })?;
        }
        options.max_restarts = spec.max_restarts;
        options.deadline = spec.deadline.map(|s| seconds(s, "deadline")).transpose()?;
        options.cwd = spec.cwd.map(Into::into);
        for pair in spec.env.unwrap_or_default() {
            let [key, value] = <[String; 2]>::try_from(pair)
                .map_err(|_| argument("env must be [key, value] pairs"))?;
            options.env.push((key, value));
        }
        for pair in spec.labels.unwrap_or_default() {
            let [key, value] = <[String; 2]>::try_from(pair)
                .map_err(|_| argument("labels must be [key, value] pairs"))?;
            options.labels.push((key, value));
        }
        options.id = spec.id;
        options.parent = spec.parent;
        options.max_failures_without_progress = spec.max_failures_without_progress;
        self.inner.run(options).await.map_err(to_napi)
    }

    /// The executions that have not ended (`all`: every one), as the JSON
    /// `tether ps --json` prints.
    #[napi]
    pub async fn ps(&self, all: bool) -> napi::Result<String> {
        Ok(self.inner.ps(all).await.map_err(to_napi)?.to_string())
    }

    /// Stops an execution (SIGTERM, SIGKILL after `timeout` seconds);
    /// resolves to it as it ended, as JSON.
    #[napi]
    pub async fn stop(&self, id: String, timeout: Option<f64>) -> napi::Result<String> {
        let timeout = match timeout {
            Some(secs) => seconds(secs, "timeout")?,
            None => STOP_TIMEOUT,
        };
        let ended = self.inner.stop(&id, timeout).await.map_err(to_napi)?;
        Ok(ended.to_string())
    }

    /// Starts a new attempt of an ended execution from its newest valid
    /// checkpoint (or checkpoint `checkpoint`); resolves to its id.
    #[napi]
    pub async fn resume(&self, id: String, checkpoint: Option<i64>) -> napi::Result<String> {
        let checkpoint = match checkpoint {
            Some(n) => Some(u64::try_from(n).map_err(|_| {
                napi::Error::new(
                    napi::Status::InvalidArg,
                    "checkpoint must be a checkpoint id (an integer >= 1)",
                )
            })?),
            None => None,
        };
        self.inner.resume(&id, checkpoint).await.map_err(to_napi)
    }

    /// Stops the running attempt (SIGTERM, SIGKILL after `timeout`
    /// seconds) and starts the next at once; resolves to the id.
    #[napi]
    pub async fn restart(&self, id: String, timeout: Option<f64>) -> napi::Result<String> {
        let timeout = match timeout {
            Some(secs) => seconds(secs, "timeout")?,
            None => STOP_TIMEOUT,
        };
        self.inner.restart(&id, timeout).await.map_err(to_napi)
    }

    /// Removes ended executions by id with their streams, checkpoints and
    /// steps (`force`: stops live ones first); resolves to the ids removed.
    #[napi]
    pub async fn rm(&self, ids: Vec<String>, force: bool) -> napi::Result<Vec<String>> {
        self.inner.rm(ids, force).await.map_err(to_napi)
    }

    /// Queues `message` in the inbox of execution `id`; resolves to its id
    /// once it is durable.
    #[napi]
    pub async fn send(&self, id: String, message: Buffer) -> napi::Result<f64> {
        let queued = self
            .inner
            .send(&id, Bytes::from(message.to_vec()))
            .await
            .map_err(to_napi)?;
        Ok(queued as f64)
    }

    /// Answers a question of execution `id` (its one open question when
    /// `question` is none); resolves to the question, closed, as the JSON
    /// `tether questions --json` prints.
    #[napi]
    pub async fn answer(
        &self,
        id: String,
        answer: String,
        question: Option<f64>,
    ) -> napi::Result<String> {
        let question = question.map(|q| whole(q, "question")).transpose()?;
        let closed = self
            .inner
            .answer(&id, &answer, question)
            .await
            .map_err(to_napi)?;
        Ok(closed.to_string())
    }

    /// The open questions (every one with `all`), of execution `id` when
    /// given, as a JSON array of what `tether questions --json` prints.
    #[napi]
    pub async fn questions(&self, all: bool, id: Option<String>) -> napi::Result<String> {
        let found = self.inner.questions(all, id).await.map_err(to_napi)?;
        Ok(serde_json::Value::Array(found).to_string())
    }

    /// Removes ended executions that ended at least `older_than` seconds
    /// ago (none: the daemon's `keep_ended`); resolves to the ids removed.
    #[napi]
    pub async fn prune(&self, older_than: Option<f64>) -> napi::Result<Vec<String>> {
        let older_than = older_than
            .map(|secs| seconds(secs, "olderThan"))
            .transpose()?;
        self.inner.prune(older_than).await.map_err(to_napi)
    }
}

/// A reader of one stream; `Tail` in `index.js` hands its batches out one
/// frame at a time.
#[napi]
#[derive(Debug)]
pub struct NativeTail {
    /// An async lock: held across the wait for the next batch.
    tail: Mutex<sdk::Tail>,
    /// Cancelled by `close`, so that a wait for frames that may never come
    /// (a follower) ends and lets `close` have the lock.
    closing: CancellationToken,
}

/// Frames as a few arrays rather than an object each: JavaScript makes a
/// frame object only when it hands the frame out, and one batch is one
/// crossing of the boundary.
#[napi(object)]
pub struct NativeBatch {
    /// Every payload, one after the other.
    pub data: Buffer,
    /// Where each payload ends in `data`.
    pub ends: Uint32Array,
    pub seqs: Float64Array,
    /// Microseconds since the epoch.
    pub ts: Float64Array,
    /// Indexes into `data`, `stdout`, `stderr`, `event`, `user`.
    pub kinds: Uint8Array,
    /// What was compacted or lost before these frames, in words.
    pub gaps: Vec<String>,
    /// True when the stream has ended (then there are no frames).
    pub ended: bool,
}

impl std::fmt::Debug for NativeBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeBatch")
            .field("frames", &self.seqs.len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

#[napi]
impl NativeTail {
    /// Records every frame through `processed` as processed (cursor file,
    /// consumer ack), then waits for the next frames: at most `max`.
    #[napi]
    pub async fn next_batch(&self, max: u32, processed: Option<f64>) -> napi::Result<NativeBatch> {
        let mut tail = self.tail.lock().await;
        mark(&mut tail, processed)?;
        // `next_batch` is cancel-safe: dropping it loses no frame.
        let items = tokio::select! {
            items = tail.next_batch(max as usize) => items.map_err(to_napi)?,
            () = self.closing.cancelled() => None,
        };
        Ok(batch(items))
    }

    /// Records every frame through `processed` as processed and ends the
    /// reading (for a consumer: once its ack is durable).
    #[napi]
    pub async fn close(&self, processed: Option<f64>) -> napi::Result<()> {
        self.closing.cancel();
        let mut tail = self.tail.lock().await;
        mark(&mut tail, processed)?;
        tail.close().await.map_err(to_napi)
    }
}

fn mark(tail: &mut sdk::Tail, processed: Option<f64>) -> napi::Result<()> {
    match processed {
        Some(seq) if tail.records_progress() => tail
            .mark_processed(whole(seq, "processed")?)
            .map_err(to_napi),
        _ => Ok(()),
    }
}

fn batch(items: Option<Vec<TailItem>>) -> NativeBatch {
    let Some(items) = items else {
        return NativeBatch {
            data: Vec::new().into(),
            ends: Vec::<u32>::new().into(),
            seqs: Vec::<f64>::new().into(),
            ts: Vec::<f64>::new().into(),
            kinds: Vec::<u8>::new().into(),
            gaps: Vec::new(),
            ended: true,
        };
    };
    let size = items
        .iter()
        .map(|item| match item {
            TailItem::Frame { frame, .. } => frame.payload.len(),
            TailItem::Gap(_) => 0,
        })
        .sum();
    let mut data = Vec::with_capacity(size);
    let mut ends = Vec::with_capacity(items.len());
    let mut seqs = Vec::with_capacity(items.len());
    let mut ts = Vec::with_capacity(items.len());
    let mut kinds = Vec::with_capacity(items.len());
    let mut gaps = Vec::new();
    for item in items {
        match item {
            TailItem::Frame { seq, frame } => {
                data.extend_from_slice(&frame.payload);
                // A batch is far below 4 GiB: the daemon caps frame sizes
                // and the batch's frame count.
                ends.push(u32::try_from(data.len()).unwrap_or(u32::MAX));
                seqs.push(seq as f64);
                ts.push(frame.ts_micros as f64);
                kinds.push(kind_index(frame.kind));
            }
            TailItem::Gap(message) => gaps.push(message),
        }
    }
    NativeBatch {
        data: data.into(),
        ends: ends.into(),
        seqs: seqs.into(),
        ts: ts.into(),
        kinds: kinds.into(),
        gaps,
        ended: false,
    }
}

/// The index of `kind` in `index.js`'s `KINDS`.
fn kind_index(kind: FrameKind) -> u8 {
    match kind {
        FrameKind::Data => 0,
        FrameKind::Stdout => 1,
        FrameKind::Stderr => 2,
        FrameKind::Event => 3,
        FrameKind::User => 4,
        FrameKind::Ask => 5,
        FrameKind::Answer => 6,
    }
}

/// A number of seconds as a duration; `what` names the argument.
pub(crate) fn seconds(secs: f64, what: &str) -> napi::Result<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| argument(format!("{what} must be a number of seconds >= 0")))
}

/// A whole number >= 0 (a seq, a count); `what` names the argument.
fn whole(n: f64, what: &str) -> napi::Result<u64> {
    // 2^53: above it a JavaScript number no longer holds every integer.
    const MAX_SAFE: f64 = 9_007_199_254_740_991.0;
    if n.fract() != 0.0 || !(0.0..=MAX_SAFE).contains(&n) {
        return Err(argument(format!(
            "{what} must be a whole number >= 0, not {n}"
        )));
    }
    Ok(n as u64)
}
