//! `NativeWorker`: what a program run by `tether run` uses. `index.js`
//! wraps it in `Worker` (JSON, step memoising, meta as an object).

use std::sync::Arc;

use bytes::Bytes;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use tether_protocol::FrameKind;

use crate::client::seconds;
use crate::errors::{argument, worker_to_napi};

/// The variable with the attempt number, when the daemon sets one.
const ENV_ATTEMPT: &str = "TETHER_ATTEMPT";

/// The native worker handle; see `Worker` in `index.js`.
#[napi]
#[derive(Debug)]
pub struct NativeWorker {
    inner: Arc<tether::Worker>,
    attempt: Option<u32>,
}

/// A saved checkpoint, as the native side hands it over.
#[napi(object)]
pub struct NativeCheckpoint {
    pub data: Buffer,
    /// Increasing per execution.
    pub id: f64,
    /// The execution stream's last seq when it was saved.
    pub seq: f64,
    pub schema_version: u32,
    /// When it was saved, milliseconds since the epoch (as `Date.now()`).
    pub ts: f64,
    /// The metadata saved with it: `[key, value]` pairs in the order given.
    pub meta: Vec<Vec<String>>,
}

impl std::fmt::Debug for NativeCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeCheckpoint")
            .field("id", &self.id)
            .field("seq", &self.seq)
            .field("schema_version", &self.schema_version)
            .finish_non_exhaustive()
    }
}

/// A message from the execution's inbox, as the native side hands it over.
#[napi(object)]
pub struct NativeMessage {
    /// Unique in the daemon, rising in the order messages were sent.
    pub id: f64,
    pub data: Buffer,
    /// When it was sent, milliseconds since the epoch (as `Date.now()`).
    pub ts: f64,
    /// The uid of the sender.
    pub sender_uid: u32,
}

impl std::fmt::Debug for NativeMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeMessage")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A question as `ask` takes it (`text` aside).
#[napi(object)]
#[derive(Debug)]
pub struct NativeAsk {
    pub choices: Option<Vec<String>>,
    /// Seconds.
    pub timeout: Option<f64>,
    pub default: Option<String>,
    pub key: Option<String>,
}

#[napi]
impl NativeWorker {
    /// Asks a question and resolves to its answer once it closes; null
    /// when it timed out with no default.
    #[napi]
    pub async fn ask(&self, text: String, options: NativeAsk) -> napi::Result<Option<String>> {
        let question = tether::gates::Question {
            execution: String::new(),
            text,
            choices: options.choices.unwrap_or_default(),
            timeout: options.timeout.map(|t| seconds(t, "timeout")).transpose()?,
            default: options.default,
            key: options.key,
        };
        question.check().map_err(|e| argument(e.to_string()))?;
        self.inner.ask(question).await.map_err(worker_to_napi)
    }

    /// The next inbox message, waiting up to `timeout` seconds (none:
    /// forever); null when none came. The message handed over before it
    /// is removed from the inbox first.
    #[napi]
    pub async fn recv(&self, timeout: Option<f64>) -> napi::Result<Option<NativeMessage>> {
        let timeout = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        let got = self.inner.recv(timeout).await.map_err(worker_to_napi)?;
        Ok(got.map(|m| NativeMessage {
            id: m.id as f64,
            data: Buffer::from(m.data.to_vec()),
            ts: m.sent_micros as f64 / 1e3,
            sender_uid: m.sender_uid,
        }))
    }

    /// The worker of the execution this process runs as; an error outside
    /// `tether run`.
    #[napi(factory)]
    pub fn from_env() -> napi::Result<Self> {
        let inner = tether::Worker::from_env().map_err(worker_to_napi)?;
        let attempt = std::env::var(ENV_ATTEMPT)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        Ok(Self {
            inner: Arc::new(inner),
            attempt,
        })
    }

    #[napi(getter)]
    pub fn execution_id(&self) -> String {
        self.inner.execution().to_string()
    }

    #[napi(getter)]
    pub fn resumed(&self) -> bool {
        self.inner.is_resumed()
    }

    #[napi(getter)]
    pub fn attempt(&self) -> Option<u32> {
        self.attempt
    }

    /// The newest valid checkpoint, of exactly `schema_version` when one is
    /// given; null when there is none.
    #[napi]
    pub async fn load_checkpoint(
        &self,
        schema_version: Option<u32>,
    ) -> napi::Result<Option<NativeCheckpoint>> {
        let loaded = self
            .inner
            .load_full(schema_version)
            .await
            .map_err(worker_to_napi)?;
        Ok(loaded.map(|checkpoint| {
            let meta = checkpoint.meta;
            NativeCheckpoint {
                data: Buffer::from(checkpoint.data.to_vec()),
                id: meta.id as f64,
                seq: meta.seq as f64,
                schema_version: meta.schema_version,
                ts: meta.created_micros as f64 / 1e3,
                meta: checkpoint
                    .user_meta
                    .into_iter()
                    .map(|(k, v)| vec![k, v])
                    .collect(),
            }
        }))
    }

    /// Saves `data` as the newest checkpoint with `meta` (flat key, value
    /// pairs) beside it; resolves once durable, with the checkpoint's id.
    #[napi]
    pub async fn save_checkpoint(
        &self,
        data: Buffer,
        schema_version: u32,
        meta: Vec<String>,
    ) -> napi::Result<f64> {
        if !meta.len().is_multiple_of(2) {
            return Err(argument("meta must be key, value pairs"));
        }
        let pairs = meta
            .chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
        let saved = self
            .inner
            .save_full(Bytes::from(data.to_vec()), schema_version, pairs)
            .await
            .map_err(worker_to_napi)?;
        Ok(saved.id as f64)
    }

    /// The recorded result of step `name`, or null.
    #[napi]
    pub async fn step_get(&self, name: String) -> napi::Result<Option<Buffer>> {
        let got = self.inner.step_get(&name).await.map_err(worker_to_napi)?;
        Ok(got.map(|b| Buffer::from(b.to_vec())))
    }

    /// Records `result` for step `name` unless one is recorded; resolves to
    /// the result that stands.
    #[napi]
    pub async fn step_put(&self, name: String, result: Buffer) -> napi::Result<Buffer> {
        let kept = self
            .inner
            .step_put(&name, Bytes::from(result.to_vec()))
            .await
            .map_err(worker_to_napi)?;
        Ok(Buffer::from(kept.to_vec()))
    }

    /// Forgets the recorded result of step `name`; resolves to how many
    /// results were forgotten (0 or 1).
    #[napi]
    pub async fn step_clear(&self, name: String) -> napi::Result<f64> {
        let n = self
            .inner
            .step_clear(vec![name], false)
            .await
            .map_err(worker_to_napi)?;
        Ok(n as f64)
    }

    /// Appends one frame of `kind` (`stdout`, `stderr`, `user`, ...) to the
    /// execution's stream; resolves once durable.
    #[napi]
    pub async fn emit(&self, kind: String, payload: Buffer) -> napi::Result<()> {
        let kind = FrameKind::from_name(&kind)
            .ok_or_else(|| argument(format!("unknown frame kind {kind:?}")))?;
        self.inner
            .emit(kind, payload.to_vec())
            .await
            .map_err(worker_to_napi)
    }
}
