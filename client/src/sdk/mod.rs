//! What the Python and Node SDKs share, so that each binding only converts
//! values and maps errors: one implementation of publishing, tailing and
//! supervising for every language.
//!
//! * [`Client`]: one daemon endpoint; publishes with producer seqs that go
//!   on increasing from one call to the next, answers status, streams and
//!   the supervisor's run, ps and stop as the CLI's JSON views.
//! * [`Tail`]: a reader that hands out frames in batches and records what
//!   the caller processed in a cursor file or as consumer acks.
//! * [`Client::send`], [`Client::answer`], [`Client::questions`]: human
//!   gates and inboxes (`gates.rs`).
//! * [`RunOptions`]: a worker to start, as `tether run` takes it.
//! * [`ErrorClass`]: which exception each SDK raises for an error.

mod error_class;
mod gates;
pub mod run;
mod tail;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tether_protocol::{
    ExecutionDetail, ExecutionInfo, Request, Response, StatusInfo, StorageState, StreamInfo,
};
use tokio::sync::Mutex;

use crate::conn::{unexpected, ConnectOptions, Connector, Endpoint};
use crate::error::{Error, Result};
use crate::publisher::{Publisher, PublisherOptions};
use crate::subscriber::{Start, SubscribeOptions, Subscriber};
use crate::{cursor, json};

pub use error_class::ErrorClass;
pub use run::RunOptions;
pub use tail::{Tail, TailItem, TailOptions};

/// A publisher and the producer seq its next frame gets.
#[derive(Debug)]
struct Producing {
    publisher: Publisher,
    next_seq: u64,
}

/// A client of one daemon; see the module docs.
#[derive(Debug)]
pub struct Client {
    connector: Connector,
    /// One publisher per (stream, producer), kept so that producer seqs go
    /// on increasing from one `publish` call to the next.
    publishers: Mutex<HashMap<(String, String), Producing>>,
    /// The producer name used when `publish` is given none: unique to
    /// this client, so two clients never deduplicate each other's frames.
    default_producer: String,
}

impl Client {
    /// A client of the daemon at `endpoint`. `language` names the SDK in
    /// the daemon's logs and in the default producer name
    /// (`LANGUAGE-PID-NANOS`).
    pub fn new(endpoint: Endpoint, mut options: ConnectOptions, language: &str) -> Self {
        options.client = format!("tether-{language} {}", env!("CARGO_PKG_VERSION"));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        Self {
            connector: Connector::new(endpoint, options),
            publishers: Mutex::new(HashMap::new()),
            default_producer: format!("{language}-{}-{nanos}", std::process::id()),
        }
    }

    /// The endpoint: `None` for the standard local socket, else a path or
    /// an `ssh://` URL, as the bindings' constructors take it.
    pub fn endpoint_of(socket: Option<std::path::PathBuf>, host: Option<&str>) -> Result<Endpoint> {
        match (socket, host) {
            (Some(_), Some(_)) => Err(Error::Usage("give socket or host, not both".into())),
            (Some(path), None) => Ok(Endpoint::unix(path)),
            (None, Some(url)) => Endpoint::ssh(url),
            (None, None) => Ok(Endpoint::default_local()),
        }
    }

    /// The connector, for what this module does not cover (a `Worker`).
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// Appends each payload as one frame of kind `data` and returns once
    /// all are durable. Producer seqs count what this client published as
    /// `producer` to `stream`, from 1: a program run again that publishes
    /// the same items as the same producer stores nothing twice.
    pub async fn publish(
        &self,
        stream: &str,
        producer: Option<&str>,
        payloads: Vec<Bytes>,
    ) -> Result<()> {
        let producer = producer.unwrap_or(&self.default_producer);
        let mut publishers = self.publishers.lock().await;
        let key = (stream.to_owned(), producer.to_owned());
        let producing = match publishers.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let publisher = Publisher::new(
                    self.connector.clone(),
                    stream.to_owned(),
                    producer.to_owned(),
                    PublisherOptions::default(),
                )?;
                entry.insert(Producing {
                    publisher,
                    next_seq: 1,
                })
            }
        };
        for payload in payloads {
            producing
                .publisher
                .publish(producing.next_seq, payload)
                .await?;
            producing.next_seq += 1;
        }
        producing.publisher.flush().await
    }

    /// Opens a reader of `options.stream`; see [`Tail`].
    pub async fn tail(&self, options: TailOptions) -> Result<Tail> {
        if options.from_seq.is_some() && options.last.is_some() {
            return Err(Error::Usage("give from_seq or last, not both".into()));
        }
        let stored = match &options.cursor_file {
            Some(path) => cursor::read(path)?,
            None => None,
        };
        let subscribe = SubscribeOptions {
            stream: options.stream.clone(),
            start: Start::choose(
                stored,
                options.from_seq,
                options.last,
                options.consumer.is_some(),
            ),
            follow: options.follow,
            consumer: options.consumer.clone(),
        };
        let sub = Subscriber::open(self.connector.clone(), subscribe).await?;
        Ok(Tail::new(sub, options))
    }

    /// The daemon's status, as `tether status --json` prints it.
    pub async fn status(&self) -> Result<Value> {
        let (status, storage) = status(&self.connector).await?;
        json::status(&status, storage.as_ref())
    }

    /// Every stream, as `tether streams --json` prints them.
    pub async fn streams(&self) -> Result<Value> {
        streams(&self.connector)
            .await?
            .iter()
            .map(json::stream)
            .collect()
    }

    /// Starts a supervised worker and returns its execution id (also its
    /// stream's name). The request is sent once, never retried: after a
    /// connection failure the worker may have started (check `ps`).
    pub async fn run(&self, options: RunOptions) -> Result<String> {
        // A plain run goes as `Run`, which any daemon takes.
        let request = if options.needs_full() {
            Request::RunFull(options.into_full_in(&std::env::current_dir)?)
        } else {
            Request::Run(options.into_spec()?)
        };
        let mut conn = self.connector.connect().await?;
        match conn.request(&request).await? {
            Response::Started { execution } => Ok(execution),
            other => Err(unexpected("Started", &other)),
        }
    }

    /// The executions that have not ended (`all`: every one), oldest
    /// first, as `tether ps --json` prints them.
    pub async fn ps(&self, all: bool) -> Result<Value> {
        let details = execution_details(&self.connector, all).await?;
        let infos = details.iter().map(|d| &d.info);
        let open = crate::gates::open_questions_of_waiting(&self.connector, infos).await?;
        details
            .iter()
            .map(|d| {
                let mut value = json::execution_detail(d)?;
                if let Some(map) = value.as_object_mut() {
                    let question = crate::gates::waiting_on(&open, &d.info);
                    map.insert("question".into(), json::waiting_question(question));
                }
                Ok(value)
            })
            .collect()
    }

    /// Removes ended executions as `tether rm` does; see [`remove`].
    pub async fn rm(&self, ids: Vec<String>, force: bool) -> Result<Vec<String>> {
        remove(&self.connector, ids, force).await
    }

    /// Removes old ended executions as `tether prune` does; see [`prune`].
    pub async fn prune(&self, older_than: Option<Duration>) -> Result<Vec<String>> {
        prune(&self.connector, older_than).await
    }

    /// Stops an execution as `tether stop` does (SIGTERM, SIGKILL after
    /// `timeout`) and returns it as it ended.
    pub async fn stop(&self, execution: &str, timeout: Duration) -> Result<Value> {
        let request = Request::Stop {
            execution: execution.to_owned(),
            timeout_ms: crate::time::millis(timeout),
        };
        // Stop is idempotent, so a session lost while waiting is retried.
        match self.connector.request(&request).await? {
            Response::Stopped(info) => json::execution(&info),
            other => Err(unexpected("Stopped", &other)),
        }
    }

    /// Starts a new attempt of an ended execution as `tether resume`
    /// does, from its newest valid checkpoint or from `checkpoint`.
    pub async fn resume(&self, execution: &str, checkpoint: Option<u64>) -> Result<String> {
        resume(&self.connector, execution, checkpoint).await
    }

    /// Stops the running attempt and starts the next as `tether restart`
    /// does (SIGTERM, SIGKILL after `timeout`).
    pub async fn restart(&self, execution: &str, timeout: Duration) -> Result<String> {
        restart(&self.connector, execution, timeout).await
    }
}

/// Starts a new attempt of an ended execution, same id and stream, from
/// its newest valid checkpoint (or checkpoint `checkpoint`), and returns
/// its id once the start is recorded. Sent once, never retried: after a
/// connection failure the attempt may have started (check `ps`).
pub async fn resume(
    connector: &Connector,
    execution: &str,
    checkpoint: Option<u64>,
) -> Result<String> {
    let request = Request::Resume {
        execution: execution.to_owned(),
        checkpoint,
    };
    let mut conn = connector.connect().await?;
    match conn.request(&request).await? {
        Response::Started { execution } => Ok(execution),
        other => Err(unexpected("Started", &other)),
    }
}

/// Stops the running attempt of an execution (SIGTERM, SIGKILL after
/// `timeout`) and starts the next at once, not counted as a failure;
/// returns its id once the next attempt's start is recorded. Sent once,
/// as [`resume`] is.
pub async fn restart(connector: &Connector, execution: &str, timeout: Duration) -> Result<String> {
    let request = Request::Restart {
        execution: execution.to_owned(),
        timeout_ms: crate::time::millis(timeout),
    };
    let mut conn = connector.connect().await?;
    match conn.request(&request).await? {
        Response::Started { execution } => Ok(execution),
        other => Err(unexpected("Started", &other)),
    }
}

/// Removes ended executions by id, each with its stream, checkpoints,
/// steps and manifest (`force`: stops live ones first); returns the ids
/// removed. Sent once, never retried: after a lost connection they may be
/// gone (a second try would say they are not found).
pub async fn remove(connector: &Connector, ids: Vec<String>, force: bool) -> Result<Vec<String>> {
    let request = Request::Remove {
        executions: ids,
        force,
    };
    removed(connector, &request).await
}

/// Removes every ended execution that ended at least `older_than` ago
/// (`None`: the daemon's `keep_ended`); returns the ids removed. Retried
/// after a lost connection, as pruning again is harmless.
pub async fn prune(connector: &Connector, older_than: Option<Duration>) -> Result<Vec<String>> {
    let request = Request::Prune {
        older_than_ms: older_than.map(crate::time::millis),
    };
    match connector.request(&request).await? {
        Response::Removed(ids) => Ok(ids),
        other => Err(unexpected("Removed", &other)),
    }
}

/// Removes streams by name, each leaving a tombstone of its last seq;
/// returns the names removed. Sent once, as [`remove`] is.
pub async fn remove_streams(connector: &Connector, names: Vec<String>) -> Result<Vec<String>> {
    removed(connector, &Request::RemoveStreams { names }).await
}

/// Sends one removal on a fresh session and reads its answer.
async fn removed(connector: &Connector, request: &Request) -> Result<Vec<String>> {
    let mut conn = connector.connect().await?;
    match conn.request(request).await? {
        Response::Removed(removed) => Ok(removed),
        other => Err(unexpected("Removed", &other)),
    }
}

/// The daemon's status and its storage report (`None` from a daemon that
/// predates the report and refuses it).
pub async fn status(connector: &Connector) -> Result<(StatusInfo, Option<StorageState>)> {
    let status = match connector.request(&Request::Status).await? {
        Response::Status(status) => status,
        other => return Err(unexpected("Status", &other)),
    };
    let storage = match connector.request(&Request::Storage).await {
        Ok(Response::Storage(storage)) => Some(storage),
        _ => None,
    };
    Ok((status, storage))
}

/// Every stream the daemon keeps.
pub async fn streams(connector: &Connector) -> Result<Vec<StreamInfo>> {
    match connector.request(&Request::ListStreams).await? {
        Response::Streams(streams) => Ok(streams),
        other => Err(unexpected("Streams", &other)),
    }
}

/// [`executions`] with each one's environment keys, directory, CPU and
/// memory use. A daemon that predates them is asked for the executions
/// alone; their details are then empty.
pub async fn execution_details(connector: &Connector, all: bool) -> Result<Vec<ExecutionDetail>> {
    let mut details = match connector
        .request(&Request::ListExecutionsFull { all })
        .await
    {
        Ok(Response::ExecutionsFull(details)) => details,
        Ok(other) => return Err(unexpected("ExecutionsFull", &other)),
        Err(e) if e.is_unknown_request() => {
            return Ok(executions(connector, all)
                .await?
                .into_iter()
                .map(ExecutionDetail::from)
                .collect())
        }
        Err(e) => return Err(e),
    };
    details.sort_by(|a, b| {
        (a.info.created_micros, &a.info.id).cmp(&(b.info.created_micros, &b.info.id))
    });
    Ok(details)
}

/// The executions that have not ended (`all`: every one), oldest first.
pub async fn executions(connector: &Connector, all: bool) -> Result<Vec<ExecutionInfo>> {
    let mut executions = match connector.request(&Request::ListExecutions { all }).await? {
        Response::Executions(executions) => executions,
        other => return Err(unexpected("Executions", &other)),
    };
    executions.sort_by(|a, b| (a.created_micros, &a.id).cmp(&(b.created_micros, &b.id)));
    Ok(executions)
}
