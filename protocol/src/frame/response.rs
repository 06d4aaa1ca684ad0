//! Daemon -> client: [`Response`] and the bodies of its variants.

// One module in several files: the message types name each other freely,
// in code and in doc links.
use super::*;

/// A message from the daemon to a client.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Accepts the session. Variant 0 forever.
    HelloOk(HelloOk),
    /// Refuses a request; the daemon closes the connection after it.
    /// Variant 1 forever, so that a client of any version can read refusals.
    Error(ErrorFrame),
    /// Every append of `producer` on `stream` up to and including
    /// `producer_seq` is durable. Cumulative: one `Appended` may answer many
    /// pipelined appends.
    Appended(Appended),
    /// The subscription is open; the stream's retained range at that moment.
    /// An empty stream has `first_seq == last_seq + 1`.
    Subscribed(Subscribed),
    /// A stored frame and its seq, for durable subscriptions.
    Durable(Durable),
    /// A frame for a non-durable subscription: live, no seq, no replay.
    Live(Frame),
    /// Frames the subscriber asked for were compacted or expired, or lost
    /// to damage (`tetherd repair` records the range); the next
    /// [`Durable`] has seq `first_available`. Never a silent gap.
    Gap(Gap),
    /// A non-following subscription has delivered everything through
    /// `last_seq`, the stream's last seq when it was opened.
    End { last_seq: u64 },
    /// A [`DurableAck`] is durable.
    Acked(DurableAck),
    /// Answer to [`Request::ListStreams`].
    Streams(Vec<StreamInfo>),
    /// Answer to [`Request::Status`].
    Status(StatusInfo),
    /// Answer to [`Request::Run`]: the new execution's id, which is also
    /// the name of its output stream.
    Started { execution: String },
    /// Answer to [`Request::ListExecutions`].
    Executions(Vec<ExecutionInfo>),
    /// Answer to [`Request::Stop`]: the execution as it ended.
    Stopped(ExecutionInfo),
    /// Answer to [`Request::ShimHello`]: the shim is attached.
    ShimAccepted,
    /// Answer to [`Request::WorkerExited`]: the exit is durable.
    ExitRecorded,
    /// Answer to [`Request::CheckpointSave`]: the checkpoint is durable.
    CheckpointSaved(CheckpointMeta),
    /// Answer to [`Request::CheckpointLoad`].
    Checkpoint(Checkpoint),
    /// Answer to [`Request::CheckpointList`], newest first.
    Checkpoints(Vec<CheckpointMeta>),
    /// Answer to [`Request::StepGet`]: the recorded result, if any.
    StepResult(Option<Bytes>),
    /// Answer to [`Request::StepPut`]: the step's result is durable. Carries
    /// the result that is kept (the first one recorded).
    StepRecorded(Bytes),
    /// Answer to [`Request::Storage`].
    Storage(StorageState),
    /// Answer to [`Request::Verify`]: the store is whole; a one-line
    /// summary (streams, frames, bytes).
    Verified(String),
    /// A leading part of the answer to [`Request::ListStreams`], sent when
    /// the list does not fit in one message. More parts follow, then
    /// [`Response::Streams`] with the rest; the client joins them in order.
    /// The other lists are split the same way.
    StreamsPart(Vec<StreamInfo>),
    /// A leading part of the answer to [`Request::ListExecutions`]; see
    /// [`Response::StreamsPart`].
    ExecutionsPart(Vec<ExecutionInfo>),
    /// A leading part of the answer to [`Request::CheckpointList`]; see
    /// [`Response::StreamsPart`].
    CheckpointsPart(Vec<CheckpointMeta>),
    /// A leading piece of the data of the [`Response::Checkpoint`] that
    /// follows, for a checkpoint too large for one message. The final
    /// `Checkpoint` carries the metadata and the last piece.
    CheckpointPart(Bytes),
    /// Answer to [`Request::StepList`], in name order.
    Steps(Vec<StepInfo>),
    /// A leading part of the answer to [`Request::StepList`]; see
    /// [`Response::StreamsPart`].
    StepsPart(Vec<StepInfo>),
    /// Answer to [`Request::StepClear`]: how many recorded results were
    /// forgotten.
    StepsCleared(u64),
    /// Answer to [`Request::CheckpointLoadFull`]; its data may be preceded
    /// by [`Response::CheckpointPart`]s, as a `Checkpoint`'s is.
    CheckpointFull(CheckpointFull),
    /// Answer to [`Request::CheckpointListFull`], newest first.
    CheckpointsFull(Vec<CheckpointEntry>),
    /// A leading part of the answer to [`Request::CheckpointListFull`]; see
    /// [`Response::StreamsPart`].
    CheckpointsFullPart(Vec<CheckpointEntry>),
    /// Answer to [`Request::ListExecutionsFull`].
    ExecutionsFull(Vec<ExecutionDetail>),
    /// A leading part of the answer to [`Request::ListExecutionsFull`]; see
    /// [`Response::StreamsPart`].
    ExecutionsFullPart(Vec<ExecutionDetail>),
    /// Answer to [`Request::Metrics`]: Prometheus text (OpenMetrics),
    /// ending with `# EOF`.
    Metrics(String),
    /// A leading piece of the text of the [`Response::Metrics`] that
    /// follows, for a text too large for one message; pieces end at line
    /// ends, and the client joins them in order.
    MetricsPart(String),
    /// To a shim that was granted [`Capabilities::OUTPUT_FLUSH`], unasked:
    /// a checkpoint of its execution is being saved. The shim reads what
    /// the worker has written so far, appends it, and once it is all
    /// acknowledged sends [`Request::OutputFlushed`] with `token`.
    FlushOutput { token: u64 },
    /// Answer to [`Request::Remove`], [`Request::Prune`] and
    /// [`Request::RemoveStreams`]: the ids or names removed.
    Removed(Vec<String>),
    /// Answer to [`Request::Ask`], [`Request::AwaitAnswer`] and
    /// [`Request::Answer`]: the question as it stands.
    Question(QuestionInfo),
    /// Answer to [`Request::ListQuestions`], in id order.
    Questions(Vec<QuestionInfo>),
    /// A leading part of the answer to [`Request::ListQuestions`]; see
    /// [`Response::StreamsPart`].
    QuestionsPart(Vec<QuestionInfo>),
    /// Answer to [`Request::Send`]: the message's id.
    Queued { id: u64 },
    /// Answer to [`Request::Recv`], oldest first.
    Messages(Vec<InboxMessage>),
    /// Answer to [`Request::Dequeue`]: how many messages were removed.
    Dequeued(u64),
    /// Answer to [`Request::MirrorStatus`]; `None` when the daemon does
    /// not mirror.
    MirrorStatus(Option<MirrorInfo>),
}

impl Response {
    /// The variant indexes of [`Response::Durable`] and [`Response::Live`]:
    /// the first varint of their bodies.
    pub const DURABLE_KIND: u32 = 4;
    pub const LIVE_KIND: u32 = 5;

    /// The variant's name, for logs and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Response::HelloOk(_) => "HelloOk",
            Response::Error(_) => "Error",
            Response::Appended(_) => "Appended",
            Response::Subscribed(_) => "Subscribed",
            Response::Durable(_) => "Durable",
            Response::Live(_) => "Live",
            Response::Gap(_) => "Gap",
            Response::End { .. } => "End",
            Response::Acked(_) => "Acked",
            Response::Streams(_) => "Streams",
            Response::Status(_) => "Status",
            Response::Started { .. } => "Started",
            Response::Executions(_) => "Executions",
            Response::Stopped(_) => "Stopped",
            Response::ShimAccepted => "ShimAccepted",
            Response::ExitRecorded => "ExitRecorded",
            Response::CheckpointSaved(_) => "CheckpointSaved",
            Response::Checkpoint(_) => "Checkpoint",
            Response::Checkpoints(_) => "Checkpoints",
            Response::StepResult(_) => "StepResult",
            Response::StepRecorded(_) => "StepRecorded",
            Response::Storage(_) => "Storage",
            Response::Verified(_) => "Verified",
            Response::StreamsPart(_) => "StreamsPart",
            Response::ExecutionsPart(_) => "ExecutionsPart",
            Response::CheckpointsPart(_) => "CheckpointsPart",
            Response::CheckpointPart(_) => "CheckpointPart",
            Response::Steps(_) => "Steps",
            Response::StepsPart(_) => "StepsPart",
            Response::StepsCleared(_) => "StepsCleared",
            Response::CheckpointFull(_) => "CheckpointFull",
            Response::CheckpointsFull(_) => "CheckpointsFull",
            Response::CheckpointsFullPart(_) => "CheckpointsFullPart",
            Response::ExecutionsFull(_) => "ExecutionsFull",
            Response::ExecutionsFullPart(_) => "ExecutionsFullPart",
            Response::Metrics(_) => "Metrics",
            Response::MetricsPart(_) => "MetricsPart",
            Response::FlushOutput { .. } => "FlushOutput",
            Response::Removed(_) => "Removed",
            Response::Question(_) => "Question",
            Response::Questions(_) => "Questions",
            Response::QuestionsPart(_) => "QuestionsPart",
            Response::Queued { .. } => "Queued",
            Response::Messages(_) => "Messages",
            Response::Dequeued(_) => "Dequeued",
            Response::MirrorStatus(_) => "MirrorStatus",
        }
    }
}

/// Accepts a [`Hello`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HelloOk {
    pub version: u32,
    /// The capabilities in force for this session (the intersection).
    pub capabilities: Capabilities,
    /// The daemon's package version ("0.1.0").
    pub daemon: String,
}

/// See [`Response::Appended`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    pub stream: String,
    pub producer: String,
    pub producer_seq: u64,
    /// The stream seq of the frame with `producer_seq`; for a duplicate, the
    /// seq of the producer's newest stored frame.
    pub seq: u64,
}

/// See [`Response::Subscribed`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribed {
    pub first_seq: u64,
    pub last_seq: u64,
}

/// See [`Response::Durable`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Durable {
    pub seq: u64,
    pub frame: Frame,
}

/// See [`Response::Gap`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// The first seq the subscriber asked for.
    pub requested: u64,
    /// The first seq that is still retained.
    pub first_available: u64,
}

/// Why a request was refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ErrorFrame {
    pub code: ErrorCode,
    /// A sentence for humans naming what was wrong.
    pub message: String,
}

/// A machine-readable error class. Carried as a bare `u16` so that a client
/// can read codes newer than itself; [`ErrorCode::name`] says `unknown` then.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(transparent)]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    /// The peer speaks a protocol version this daemon does not.
    pub const UNSUPPORTED_VERSION: Self = Self(1);
    /// A frame's bytes are not a valid message.
    pub const MALFORMED: Self = Self(2);
    /// A frame's length prefix exceeds the maximum frame size.
    pub const FRAME_TOO_LARGE: Self = Self(3);
    /// A message arrived before [`Hello`], or a second `Hello`.
    pub const HELLO_REQUIRED: Self = Self(4);
    /// A well-formed request that makes no sense now (ack beyond the last
    /// seq, a second subscription, an invalid name, ...).
    pub const INVALID_REQUEST: Self = Self(5);
    /// No such stream (or execution, or checkpoint).
    pub const NOT_FOUND: Self = Self(6);
    /// The store's disk is full; the append was not stored. Retry later.
    pub const STORAGE_FULL: Self = Self(7);
    /// The store failed; the request was not carried out.
    pub const STORAGE: Self = Self(8);
    /// The daemon is at its connection limit.
    pub const TOO_MANY_CONNECTIONS: Self = Self(9);
    /// The daemon is shutting down; reconnect to the next instance.
    pub const SHUTTING_DOWN: Self = Self(10);
    /// The peer may not make this request.
    pub const PERMISSION_DENIED: Self = Self(11);
    /// A bug in the daemon. The request was not carried out.
    pub const INTERNAL: Self = Self(12);
    /// The question already has an answer; the message names it and who
    /// gave it. The first answer wins.
    pub const ALREADY_ANSWERED: Self = Self(13);
    /// An answer outside the question's choices, or an answer without a
    /// question id while several are open (the message lists them).
    pub const INVALID_ANSWER: Self = Self(14);

    /// A stable lowercase name for logs and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Self::UNSUPPORTED_VERSION => "unsupported_version",
            Self::MALFORMED => "malformed",
            Self::FRAME_TOO_LARGE => "frame_too_large",
            Self::HELLO_REQUIRED => "hello_required",
            Self::INVALID_REQUEST => "invalid_request",
            Self::NOT_FOUND => "not_found",
            Self::STORAGE_FULL => "storage_full",
            Self::STORAGE => "storage",
            Self::TOO_MANY_CONNECTIONS => "too_many_connections",
            Self::SHUTTING_DOWN => "shutting_down",
            Self::PERMISSION_DENIED => "permission_denied",
            Self::INTERNAL => "internal",
            Self::ALREADY_ANSWERED => "already_answered",
            Self::INVALID_ANSWER => "invalid_answer",
            _ => "unknown",
        }
    }

    /// True for conditions that a retry after reconnecting may cure.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::STORAGE_FULL | Self::STORAGE | Self::SHUTTING_DOWN | Self::TOO_MANY_CONNECTIONS
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())
    }
}

/// One row of `tether streams`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub name: String,
    /// First retained seq; `last_seq + 1` when nothing is retained.
    pub first_seq: u64,
    /// Last seq ever assigned (0 before the first frame).
    pub last_seq: u64,
    /// Retained frames.
    pub frames: u64,
    /// Retained payload bytes.
    pub bytes: u64,
    pub consumers: Vec<ConsumerInfo>,
}

/// A durable consumer and how far it has acknowledged.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ConsumerInfo {
    pub name: String,
    pub acked_through: u64,
}

/// The daemon's answer to [`Request::Status`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StatusInfo {
    /// The daemon's package version.
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    pub uptime_secs: u64,
    pub socket: String,
    pub state_dir: String,
    /// Size of the store file on disk.
    pub store_bytes: u64,
    pub streams: u64,
    pub executions: u64,
    pub connections: u64,
}

/// Whether the store can be written: the answer to [`Request::Storage`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StorageState {
    /// Set while writes are refused (the store is *degraded*); reads go on.
    pub degraded: Option<StorageFault>,
}

/// Why the store cannot be written, and since when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StorageFault {
    /// `storage full: ...` or `I/O error on FILE: ...`.
    pub cause: String,
    /// A lack of space rather than a failing device.
    pub full: bool,
    /// When writes were first refused, microseconds since the Unix epoch.
    pub since_micros: u64,
}
