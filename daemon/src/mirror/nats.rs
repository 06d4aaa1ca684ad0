//! The mirror's side of NATS: one client, the JetStream stream made sure
//! of, and where a subject's mirrored frames end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream::LastRawMessageErrorKind};

use super::MirrorConfig;

/// How long a JetStream request (stream info, a message) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a publish may wait for its acknowledgement. Past it the
/// mirror asks JetStream where the subject ends and goes on from there,
/// so a short wait costs a lookup, never a frame.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes awaiting their acknowledgement across all streams.
const MAX_ACKS_IN_FLIGHT: usize = 16 * 1024;

/// The smallest duplicate window the mirror's JetStream stream is made with.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A failure talking to NATS; the mirror waits and tries again.
#[derive(Debug)]
pub struct NatsError(pub String);

impl std::fmt::Display for NatsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns any NATS client error into a [`NatsError`] saying what was tried.
pub fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> NatsError + '_ {
    move |e| NatsError(format!("{what}: {e}"))
}

/// The end of a subject in JetStream: the last message's stream sequence
/// and the tether seq it carries (0 and 0 for an empty subject).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubjectEnd {
    pub stream_seq: u64,
    pub tether_seq: u64,
}

/// The NATS side of the mirror, shared by every mirrored stream.
///
/// A connection is never reconnected: a publish lost with a dropped
/// connection must not be followed by later ones sent on the next, or
/// JetStream would hold frames past a hole and the end of a subject
/// would no longer say that everything before it is there. So each
/// client connects once; once it has lost its connection, the next round
/// of any stream makes a new one, and the old one's unsent publishes
/// stay unsent (its reconnect is put off for good). They stay in memory
/// too, as async-nats offers no way to drop them: at most the publishes
/// in flight ([`MAX_ACKS_IN_FLIGHT`]) per lost connection.
#[derive(Debug)]
pub struct Nats {
    pub config: MirrorConfig,
    /// The client in use and its JetStream context.
    current: tokio::sync::Mutex<Option<(async_nats::Client, jetstream::Context)>>,
    /// Whether NATS is taken to be unreachable: set by the first failure,
    /// which alone logs a warning, cleared by the next success.
    down: AtomicBool,
    /// Whether the JetStream stream is known to exist.
    stream_ready: AtomicBool,
}

/// How long a client that lost its connection waits before it would
/// reconnect: past any daemon's life. See [`Nats`].
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Nats {
    /// The NATS side for `config`; nothing is connected yet.
    pub fn new(config: MirrorConfig) -> Nats {
        Nats {
            config,
            current: tokio::sync::Mutex::new(None),
            down: AtomicBool::new(false),
            stream_ready: AtomicBool::new(false),
        }
    }

    /// The JetStream context of a connected client: the current one, or a
    /// new one when the current one lost its connection.
    pub async fn context(&self) -> Result<jetstream::Context, NatsError> {
        let mut current = self.current.lock().await;
        if let Some((client, js)) = &*current {
            if client.connection_state() == async_nats::connection::State::Connected {
                return Ok(js.clone());
            }
        }
        *current = None;
        let connected_once = Arc::new(AtomicBool::new(false));
        let mut options = async_nats::ConnectOptions::new()
            .max_reconnects(None)
            .connection_timeout(REQUEST_TIMEOUT)
            .reconnect_delay_callback(move |_| {
                if connected_once.swap(true, Ordering::Relaxed) {
                    NEVER
                } else {
                    Duration::ZERO
                }
            })
            .name("tetherd mirror");
        if let Some(path) = &self.config.creds {
            options = options.credentials_file(path).await.map_err(|e| {
                NatsError(format!(
                    "cannot read the NATS credentials {}: {e}",
                    path.display()
                ))
            })?;
        }
        let client = options
            .connect(self.config.nats_url.as_str())
            .await
            .map_err(|e| NatsError(format!("cannot connect: {e}")))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .ack_timeout(ACK_TIMEOUT)
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .build(client.clone());
        *current = Some((client, js.clone()));
        Ok(js)
    }

    /// Whether NATS is taken to be unreachable now.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Notes a failure: the first since NATS was last reachable is logged
    /// as a warning, the rest only at debug level, so that an outage is
    /// one line however long it lasts.
    pub fn failed(&self, error: &NatsError) {
        self.stream_ready.store(false, Ordering::Relaxed);
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "mirror: NATS at {} is unreachable ({error}); waiting, producers are not held up",
                self.config.nats_url
            );
        } else {
            tracing::debug!("mirror: still waiting for NATS: {error}");
        }
    }

    /// Notes a success after failures.
    pub fn succeeded(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "mirror: NATS at {} is reachable again; catching up",
                self.config.nats_url
            );
        }
    }

    /// Makes sure the JetStream stream exists, creating it (subjects
    /// `PREFIX.>`, file storage, a duplicate window of two minutes) if not.
    /// An existing stream is used as it is.
    pub async fn ensure_stream(&self) -> Result<(), NatsError> {
        if self.stream_ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        let config = jetstream::stream::Config {
            name: self.config.jetstream_stream.clone(),
            subjects: vec![format!("{}.>", self.config.subject_prefix)],
            duplicate_window: DUPLICATE_WINDOW,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        self.context()
            .await?
            .get_or_create_stream(config)
            .await
            .map_err(|e| failed("cannot create or find the JetStream stream")(&e))?;
        self.stream_ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Where `subject` ends in the JetStream stream: everything up to the
    /// returned tether seq is already there.
    pub async fn subject_end(&self, subject: &str) -> Result<SubjectEnd, NatsError> {
        self.ensure_stream().await?;
        let stream = self
            .context()
            .await?
            .get_stream_no_info(&self.config.jetstream_stream)
            .await
            .map_err(|e| failed("cannot open the JetStream stream")(&e))?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => {
                let tether_seq = message
                    .headers
                    .get(super::HEADER_SEQ)
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(0);
                if tether_seq == 0 {
                    tracing::warn!(
                        "mirror: the last message on {subject} has no {} header; \
                         mirroring from the stored position",
                        super::HEADER_SEQ
                    );
                }
                Ok(SubjectEnd {
                    stream_seq: message.sequence,
                    tether_seq,
                })
            }
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
                Ok(SubjectEnd::default())
            }
            Err(e) => Err(failed("cannot read the last mirrored message")(&e)),
        }
    }
}
