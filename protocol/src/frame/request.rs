//! Client -> daemon: [`Request`] and the bodies of its variants.

// One module in several files: the message types name each other freely,
// in code and in doc links.
use super::*;

/// A message from a client to the daemon.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Must be the first message on every connection. Variant 0 forever.
    Hello(Hello),
    /// Append one frame to a stream (created on first use). Appends are
    /// pipelined: a client may send many before the first [`Appended`].
    Append(Append),
    /// Open this connection's one subscription at a position the daemon
    /// resolves (oldest retained, last N, or a consumer's stored ack).
    Subscribe(Subscribe),
    /// Open this connection's one subscription right after a position the
    /// client already holds. Requires [`Capabilities::DURABLE`].
    DurableResume(DurableResume),
    /// Record that the subscription's named consumer has processed every
    /// frame through `through_seq`. Answered with [`Response::Acked`] once the
    /// ack is durable. Acks let the daemon compact.
    DurableAck(DurableAck),
    /// Ask for one [`StreamInfo`] per stream. Answered with
    /// [`Response::Streams`], after [`Response::StreamsPart`]s when the list
    /// does not fit in one message.
    ListStreams,
    /// Ask for the daemon's [`StatusInfo`].
    Status,
    /// Start a supervised worker. Answered with [`Response::Started`] once
    /// the execution is recorded durably (the worker starts right after).
    Run(RunSpec),
    /// List executions; without `all`, only those not yet ended. Answered
    /// with [`Response::Executions`], after [`Response::ExecutionsPart`]s
    /// when the list does not fit in one message.
    ListExecutions { all: bool },
    /// SIGTERM the execution's worker, SIGKILL it after `timeout_ms`; the
    /// execution ends `cancelled`. Answered with [`Response::Stopped`] once
    /// it has ended (at once if it already had).
    Stop { execution: String, timeout_ms: u64 },
    /// From a shim, first on every (re)connect: it supervises `attempt` of
    /// `execution`. Answered with [`Response::ShimAccepted`].
    ShimHello(ShimHello),
    /// From a shim: the worker of `attempt` has exited, and every output
    /// frame of it has been acknowledged. Answered with
    /// [`Response::ExitRecorded`] once durable; the shim may then exit.
    WorkerExited(WorkerExited),
    /// Store `data` as the execution's newest checkpoint. Answered with
    /// [`Response::CheckpointSaved`] once durable.
    CheckpointSave(CheckpointSave),
    /// Ask for the execution's newest valid checkpoint. Answered with
    /// [`Response::Checkpoint`] (after [`Response::CheckpointPart`]s when
    /// it does not fit in one message), or `Error` NOT_FOUND when there is
    /// none.
    CheckpointLoad { execution: String },
    /// Ask for the checkpoints kept for an execution, newest first.
    /// Answered with [`Response::Checkpoints`], after
    /// [`Response::CheckpointsPart`]s when the list does not fit in one
    /// message.
    CheckpointList { execution: String },
    /// Ask for the recorded result of durable step `step` of the execution.
    /// Answered with [`Response::StepResult`].
    StepGet { execution: String, step: String },
    /// Record the result of durable step `step`. Answered with
    /// [`Response::StepRecorded`] once durable. A step already recorded
    /// keeps its first result.
    StepPut {
        execution: String,
        step: String,
        result: Bytes,
    },
    /// Ask whether the store can be written. Answered with
    /// [`Response::Storage`]. (Added after [`StatusInfo`] was frozen, as a
    /// message of its own: a daemon that predates it refuses it as an
    /// unknown request, and the client shows the status without it.)
    Storage,
    /// Ask the daemon to read every stored frame and check it, as
    /// `tetherd check` does with the daemon stopped. Answered with
    /// [`Response::Verified`], or `Error` STORAGE naming the damage.
    Verify,
    /// A leading piece of the data of the [`Request::CheckpointSave`] that
    /// follows on this session, for a checkpoint too large for one message:
    /// the daemon joins the pieces, in order, in front of the save's own
    /// `data`. Not answered; the save is.
    CheckpointSavePart(Bytes),
    /// Ask for the durable steps recorded for an execution, in name order.
    /// Answered with [`Response::Steps`], after [`Response::StepsPart`]s
    /// when the list does not fit in one message.
    StepList { execution: String },
    /// Forget recorded step results: those named, or every one with `all`.
    /// Answered with [`Response::StepsCleared`] once durable.
    StepClear {
        execution: String,
        steps: Vec<String>,
        all: bool,
    },
    /// [`Request::CheckpointSave`] with metadata kept beside the data, and
    /// refused for an execution that has ended unless `force` is set. May
    /// follow [`Request::CheckpointSavePart`]s as a save does. Answered
    /// with [`Response::CheckpointSaved`] once durable.
    CheckpointSaveFull(CheckpointSaveFull),
    /// Ask for the newest valid checkpoint, of exactly `schema_version`
    /// when one is given, with its metadata. Answered with
    /// [`Response::CheckpointFull`] (after [`Response::CheckpointPart`]s
    /// when it does not fit in one message), or `Error` NOT_FOUND.
    CheckpointLoadFull {
        execution: String,
        schema_version: Option<u32>,
    },
    /// [`Request::CheckpointList`] with each checkpoint's metadata.
    /// Answered with [`Response::CheckpointsFull`], after
    /// [`Response::CheckpointsFullPart`]s when the list does not fit.
    CheckpointListFull { execution: String },
    /// [`Request::Run`] with the worker's environment and output settings
    /// (`tether run` from the caller's directory and environment, `--pty`).
    /// Answered with [`Response::Started`].
    RunFull(RunSpecFull),
    /// [`Request::ListExecutions`] with each execution's environment keys,
    /// directory, CPU and memory use. Answered with
    /// [`Response::ExecutionsFull`], after [`Response::ExecutionsFullPart`]s
    /// when the list does not fit in one message.
    ListExecutionsFull { all: bool },
    /// [`Request::Append`] with the time the producer read the frame,
    /// which the daemon stores instead of its own (never later than its
    /// own clock). Sent only to a daemon that granted
    /// [`Capabilities::APPEND_STAMPED`]. Answered like an append.
    AppendStamped(AppendStamped),
    /// Ask for the daemon's metrics as Prometheus text (counts only, never
    /// payloads). Answered with [`Response::Metrics`], after
    /// [`Response::MetricsPart`]s when the text does not fit in one message.
    Metrics,
    /// Start a new attempt of an ended execution (same id and stream)
    /// from its newest valid checkpoint, or from checkpoint `checkpoint`
    /// when one is named. Answered with [`Response::Started`] once the
    /// attempt's start is durable; `Error` INVALID_REQUEST while it is
    /// live, NOT_FOUND for an unknown execution or checkpoint.
    Resume {
        execution: String,
        checkpoint: Option<u64>,
    },
    /// Stop the running attempt (stop signal, KILL after `timeout_ms`) and
    /// start the next at once, not counted as a failure. Answered with
    /// [`Response::Started`] once the next attempt's start is durable.
    Restart { execution: String, timeout_ms: u64 },
    /// From a shim, in answer to [`Response::FlushOutput`] `token`: every
    /// line the worker wrote before the shim read that ask has been
    /// appended and acknowledged on this session. Not answered.
    OutputFlushed { token: u64 },
    // Removal (`tether rm`, `prune`, `streams rm`).
    /// Remove ended executions by id, each with its stream, checkpoints,
    /// steps and manifest, in one durable commit. A live one is refused
    /// (`invalid_request`, nothing removed) unless `force`, which stops
    /// it first. Answered with [`Response::Removed`]: the ids.
    Remove {
        executions: Vec<String>,
        force: bool,
    },
    /// Remove every ended execution that ended at least `older_than_ms`
    /// ago (`None`: the daemon's `keep_ended`; refused when that is off).
    /// Answered with [`Response::Removed`]: the ids, in id order.
    Prune { older_than_ms: Option<u64> },
    /// Remove streams; each leaves a tombstone of its last seq, which a
    /// stream of that name created again continues above. The stream of
    /// a live execution is refused (`invalid_request`, nothing removed).
    /// Answered with [`Response::Removed`]: the names.
    RemoveStreams { names: Vec<String> },
    // Human gates and inboxes (`tether ask`, `answer`, `questions`,
    // `send`, `recv`).
    /// Ask a question for an execution, or find the one already recorded
    /// under the same key (or for the same nonce). Answered at once with
    /// [`Response::Question`]: open (the asker then sends
    /// [`Request::AwaitAnswer`]) or already closed. A new question is
    /// recorded with its `ask` frame, and a running execution becomes
    /// `waiting`, in one commit. `invalid_request` for an ended
    /// execution, a default outside the choices, or text too long.
    Ask(AskSpec),
    /// Wait up to `wait_ms` for question `question` to close. Answered
    /// with [`Response::Question`] when it closes (at once if it is
    /// closed), or when the wait is over with its outcome still `None`.
    AwaitAnswer { question: u64, wait_ms: u64 },
    /// Answer a question; the first answer wins. Answered with
    /// [`Response::Question`], closed, once the answer and its `answer`
    /// frame are durable. `already_answered` naming the standing answer;
    /// `invalid_answer` outside the choices, or without a question id
    /// while several are open (naming them); `not_found` when the
    /// execution has no such (or no open) question.
    Answer(AnswerSpec),
    /// List questions: the open ones, or all with `all`, of one execution
    /// when `execution` is given, with ids above `after`, in id order.
    /// When there are none and `wait_ms` is not 0, wait that long for one
    /// to be asked (`tether questions --follow`). Answered with
    /// [`Response::Questions`], after [`Response::QuestionsPart`]s when
    /// the list does not fit in one message.
    ListQuestions {
        all: bool,
        execution: Option<String>,
        after: u64,
        wait_ms: u64,
    },
    /// Queue a message in an execution's inbox. Answered with
    /// [`Response::Queued`] once it is durable; `invalid_request` when the
    /// inbox is full or the execution has ended.
    Send { execution: String, message: Bytes },
    /// The oldest messages in an execution's inbox, at most `max` of them
    /// (fewer when they would not fit in one message), without removing
    /// them; when it is empty, wait up to `wait_ms` for one. Answered
    /// with [`Response::Messages`] (empty when the wait ran out).
    Recv {
        execution: String,
        max: u32,
        wait_ms: u64,
    },
    /// The receiver has shown every message of the execution's inbox up
    /// to and including id `through`: remove them. Answered with
    /// [`Response::Dequeued`] once that is durable.
    Dequeue { execution: String, through: u64 },
    /// The NATS mirror's state and each mirrored stream's lag. Answered
    /// with [`Response::MirrorStatus`].
    MirrorStatus,
}
impl Request {
    /// The variant index of [`Request::Append`]: the first varint of an
    /// append's body.
    pub const APPEND_KIND: u32 = 1;
    /// The variant index of [`Request::AppendStamped`], read in place as
    /// appends are.
    pub const APPEND_STAMPED_KIND: u32 = 27;

    /// The variant's index: the first varint of its body.
    pub fn kind(&self) -> u32 {
        match self {
            Request::Hello(_) => 0,
            Request::Append(_) => 1,
            Request::Subscribe(_) => 2,
            Request::DurableResume(_) => 3,
            Request::DurableAck(_) => 4,
            Request::ListStreams => 5,
            Request::Status => 6,
            Request::Run(_) => 7,
            Request::ListExecutions { .. } => 8,
            Request::Stop { .. } => 9,
            Request::ShimHello(_) => 10,
            Request::WorkerExited(_) => 11,
            Request::CheckpointSave(_) => 12,
            Request::CheckpointLoad { .. } => 13,
            Request::CheckpointList { .. } => 14,
            Request::StepGet { .. } => 15,
            Request::StepPut { .. } => 16,
            Request::Storage => 17,
            Request::Verify => 18,
            Request::CheckpointSavePart(_) => 19,
            Request::StepList { .. } => 20,
            Request::StepClear { .. } => 21,
            Request::CheckpointSaveFull(_) => 22,
            Request::CheckpointLoadFull { .. } => 23,
            Request::CheckpointListFull { .. } => 24,
            Request::RunFull(_) => 25,
            Request::ListExecutionsFull { .. } => 26,
            Request::AppendStamped(_) => Self::APPEND_STAMPED_KIND,
            Request::Metrics => 28,
            Request::Resume { .. } => 29,
            Request::Restart { .. } => 30,
            Request::OutputFlushed { .. } => 31,
            Request::Remove { .. } => 32,
            Request::Prune { .. } => 33,
            Request::RemoveStreams { .. } => 34,
            Request::Ask(_) => 35,
            Request::AwaitAnswer { .. } => 36,
            Request::Answer(_) => 37,
            Request::ListQuestions { .. } => 38,
            Request::Send { .. } => 39,
            Request::Recv { .. } => 40,
            Request::Dequeue { .. } => 41,
            Request::MirrorStatus => 42,
        }
    }

    /// The name of the variant whose index is `kind` ([`Request::name`]),
    /// when this build knows it: for a message of which only the first
    /// bytes have arrived.
    pub fn kind_name(kind: u32) -> Option<&'static str> {
        const NAMES: [&str; Request::KINDS as usize] = [
            "Hello",
            "Append",
            "Subscribe",
            "DurableResume",
            "DurableAck",
            "ListStreams",
            "Status",
            "Run",
            "ListExecutions",
            "Stop",
            "ShimHello",
            "WorkerExited",
            "CheckpointSave",
            "CheckpointLoad",
            "CheckpointList",
            "StepGet",
            "StepPut",
            "Storage",
            "Verify",
            "CheckpointSavePart",
            "StepList",
            "StepClear",
            "CheckpointSaveFull",
            "CheckpointLoadFull",
            "CheckpointListFull",
            "RunFull",
            "ListExecutionsFull",
            "AppendStamped",
            "Metrics",
            "Resume",
            "Restart",
            "OutputFlushed",
            "Remove",
            "Prune",
            "RemoveStreams",
            "Ask",
            "AwaitAnswer",
            "Answer",
            "ListQuestions",
            "Send",
            "Recv",
            "Dequeue",
            "MirrorStatus",
        ];
        NAMES.get(usize::try_from(kind).ok()?).copied()
    }

    /// The variant's name, for logs and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello(_) => "Hello",
            Request::Append(_) => "Append",
            Request::Subscribe(_) => "Subscribe",
            Request::DurableResume(_) => "DurableResume",
            Request::DurableAck(_) => "DurableAck",
            Request::ListStreams => "ListStreams",
            Request::Status => "Status",
            Request::Run(_) => "Run",
            Request::ListExecutions { .. } => "ListExecutions",
            Request::Stop { .. } => "Stop",
            Request::ShimHello(_) => "ShimHello",
            Request::WorkerExited(_) => "WorkerExited",
            Request::CheckpointSave(_) => "CheckpointSave",
            Request::CheckpointLoad { .. } => "CheckpointLoad",
            Request::CheckpointList { .. } => "CheckpointList",
            Request::StepGet { .. } => "StepGet",
            Request::StepPut { .. } => "StepPut",
            Request::Storage => "Storage",
            Request::Verify => "Verify",
            Request::CheckpointSavePart(_) => "CheckpointSavePart",
            Request::StepList { .. } => "StepList",
            Request::StepClear { .. } => "StepClear",
            Request::CheckpointSaveFull(_) => "CheckpointSaveFull",
            Request::CheckpointLoadFull { .. } => "CheckpointLoadFull",
            Request::CheckpointListFull { .. } => "CheckpointListFull",
            Request::RunFull(_) => "RunFull",
            Request::ListExecutionsFull { .. } => "ListExecutionsFull",
            Request::AppendStamped(_) => "AppendStamped",
            Request::Metrics => "Metrics",
            Request::Resume { .. } => "Resume",
            Request::Restart { .. } => "Restart",
            Request::OutputFlushed { .. } => "OutputFlushed",
            Request::Remove { .. } => "Remove",
            Request::Prune { .. } => "Prune",
            Request::RemoveStreams { .. } => "RemoveStreams",
            Request::Ask(_) => "Ask",
            Request::AwaitAnswer { .. } => "AwaitAnswer",
            Request::Answer(_) => "Answer",
            Request::ListQuestions { .. } => "ListQuestions",
            Request::Send { .. } => "Send",
            Request::Recv { .. } => "Recv",
            Request::Dequeue { .. } => "Dequeue",
            Request::MirrorStatus => "MirrorStatus",
        }
    }
}

/// Opens a session. `version` must stay the first field of the first variant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The client's [`crate::PROTOCOL_VERSION`].
    pub version: u32,
    /// Features the client would like; see [`Capabilities`].
    pub capabilities: Capabilities,
    /// Free-form client description for logs ("tether 0.1.0 tail").
    pub client: String,
}

/// Appends one frame. The pair (`producer`, `producer_seq`) makes appends
/// idempotent: the daemon remembers, per stream and producer, the highest
/// `producer_seq` it stored, in the same transaction as the frame, and
/// acknowledges any append at or below it without storing it again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Append {
    pub stream: String,
    /// A name the producer keeps across reconnects (and, for idempotent
    /// re-runs, across processes).
    pub producer: String,
    /// Strictly increasing per (stream, producer); gaps are allowed.
    pub producer_seq: u64,
    pub kind: FrameKind,
    pub payload: Bytes,
}

/// An [`Append`] read in place: the same bytes on the wire, with the names
/// and the payload borrowed from the frame they were read from. The daemon
/// reads appends this way so that it can copy a batch's payloads into one
/// buffer instead of allocating three times per frame.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendView<'a> {
    pub stream: &'a str,
    pub producer: &'a str,
    pub producer_seq: u64,
    pub kind: FrameKind,
    #[serde(serialize_with = "byte_string")]
    pub payload: &'a [u8],
}
/// An [`Append`] and when its producer read it: `ts_micros`, microseconds
/// since the Unix epoch. The fields before it are an append's, in the same
/// order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AppendStamped {
    pub stream: String,
    pub producer: String,
    pub producer_seq: u64,
    pub kind: FrameKind,
    pub payload: Bytes,
    pub ts_micros: u64,
}

/// An [`AppendStamped`] read in place, as [`AppendView`] is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendStampedView<'a> {
    pub stream: &'a str,
    pub producer: &'a str,
    pub producer_seq: u64,
    pub kind: FrameKind,
    #[serde(serialize_with = "byte_string")]
    pub payload: &'a [u8],
    pub ts_micros: u64,
}

impl<'a> AppendStampedView<'a> {
    /// The append without its time.
    pub fn append(&self) -> AppendView<'a> {
        AppendView {
            stream: self.stream,
            producer: self.producer,
            producer_seq: self.producer_seq,
            kind: self.kind,
            payload: self.payload,
        }
    }
}

/// Where a [`Subscribe`] starts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest retained frame.
    Oldest,
    /// The last `n` frames (all of them if fewer are retained).
    Last(u64),
    /// After the stored ack of the subscription's named consumer (the
    /// oldest retained frame for a consumer not seen before).
    ConsumerAck,
    /// Live frames only: the first frame delivered is the first one stored
    /// after the subscription opened.
    Now,
}

/// Opens the connection's subscription. A connection has at most one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    pub stream: String,
    pub start: StartAt,
    /// Keep delivering new frames as they are stored. Without it the daemon
    /// delivers what is stored now and then sends [`Response::End`].
    pub follow: bool,
    /// Read as this durable consumer: its acks are stored and hold back
    /// compaction. Required for [`StartAt::ConsumerAck`].
    pub consumer: Option<String>,
}

/// Resumes a subscription after `acked_through`: the daemon delivers
/// `acked_through + 1`, `+ 2`, ... in order, or first a [`Gap`] when those
/// frames were compacted away.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DurableResume {
    pub stream: String,
    pub acked_through: u64,
    pub follow: bool,
    pub consumer: Option<String>,
}

/// A durable consumer's acknowledgement of every frame through `through_seq`.
/// Also sent back by the daemon (as [`Response::Acked`]) once it is durable.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurableAck {
    pub through_seq: u64,
}
