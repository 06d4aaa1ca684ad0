//! Message types. Pure data: no I/O, no clocks, no allocation policy.
//!
//! A connection carries [`Request`]s from the client and [`Response`]s from
//! the daemon. The first request must be [`Request::Hello`]; the daemon
//! answers [`Response::HelloOk`] or [`Response::Error`]. Those two variants,
//! and the leading `version` field of [`Hello`], keep their positions in every
//! future version so that any two versions can at least refuse each other
//! clearly.
//!
//! Every [`Response::Error`] ends the session: the daemon closes the
//! connection after sending it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Error, MAX_NAME_LEN};

/// Optional protocol features, announced by the client in [`Hello`] and
/// confirmed (intersected) by the daemon in [`HelloOk`]. Unknown bits are
/// ignored so that newer clients can talk to older daemons.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// No optional features.
    pub const NONE: Self = Self(0);
    /// Durable delivery: subscriptions replay from the store and every frame
    /// arrives as [`Response::Durable`] with its seq. Without it a subscriber
    /// gets [`Response::Live`] frames from the moment it subscribed, no replay.
    pub const DURABLE: Self = Self(1 << 0);
    /// Every capability this build understands.
    pub const ALL: Self = Self::DURABLE;

    /// True when every bit of `other` is set in `self`.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The capabilities both sides support.
    pub fn intersect(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

/// What produced a frame. Shown by `tether tail --json` as a lowercase word.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A line published with `tether publish` or the client library.
    Data,
    /// A line a supervised worker wrote to stdout.
    Stdout,
    /// A line a supervised worker wrote to stderr.
    Stderr,
    /// A lifecycle event written by the daemon ("started pid 123").
    Event,
}

impl FrameKind {
    /// The lowercase name used in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Data => "data",
            FrameKind::Stdout => "stdout",
            FrameKind::Stderr => "stderr",
            FrameKind::Event => "event",
        }
    }
}

/// One stored frame: what a producer appended plus the daemon's timestamp.
/// Its seq travels beside it (in [`Durable`]) rather than inside it, because
/// the seq is the store's key, not part of the value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// When the daemon accepted the frame, microseconds since the Unix epoch.
    pub ts_micros: u64,
    pub kind: FrameKind,
    pub payload: Bytes,
}

// ---------------------------------------------------------------------------
// Client -> daemon
// ---------------------------------------------------------------------------

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
}

/// A top-level message of the protocol: an enum whose variant index is the
/// first varint of every frame body. Variants are only ever appended, so a
/// peer that sends an index at or above [`Message::KINDS`] is newer than
/// this build, and is told so rather than that its bytes are malformed.
pub trait Message: serde::de::DeserializeOwned {
    /// How errors name it.
    const NAME: &'static str;
    /// The variant indexes this build knows: `0..KINDS`.
    const KINDS: u32;
}

impl Message for Request {
    const NAME: &'static str = "request";
    const KINDS: u32 = 25;
}

impl Message for Response {
    const NAME: &'static str = "response";
    const KINDS: u32 = 33;
}

impl Request {
    /// The variant index of [`Request::Append`]: the first varint of an
    /// append's body.
    pub const APPEND_KIND: u32 = 1;

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

/// A [`Frame`] borrowing its payload: the same bytes on the wire. The
/// daemon writes stored frames this way straight from the store's pages,
/// without building a `Frame` around each payload first; a reader can take
/// one in place from the bytes it read ([`decode_durable_view`]).
///
/// [`decode_durable_view`]: crate::codec::decode_durable_view
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameView<'a> {
    pub ts_micros: u64,
    pub kind: FrameKind,
    /// Written as one byte string, as `Bytes` is (a `&[u8]` on its own
    /// would go byte by byte, to the same bytes, slowly).
    #[serde(serialize_with = "byte_string")]
    pub payload: &'a [u8],
}

impl Frame {
    /// This frame, borrowed.
    pub fn view(&self) -> FrameView<'_> {
        FrameView {
            ts_micros: self.ts_micros,
            kind: self.kind,
            payload: &self.payload,
        }
    }
}

fn byte_string<S: serde::Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
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

// ---------------------------------------------------------------------------
// Daemon -> client
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Supervision
// ---------------------------------------------------------------------------

/// When a worker that ended is started again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    /// Never: the first exit ends the execution.
    Never,
    /// After a failure (non-zero exit, signal, lost shim), not after exit 0.
    OnFailure,
    /// After every exit, until `max_restarts` or the deadline.
    Always,
}

impl RestartPolicy {
    /// The spelling used on the command line and in output.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Never => "never",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Always => "always",
        }
    }

    /// The policy [`RestartPolicy::as_str`] spells `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Never, Self::OnFailure, Self::Always]
            .into_iter()
            .find(|policy| policy.as_str() == name)
    }
}

/// What `tether run` asks the daemon to start.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// A label for `tether ps`; not unique.
    pub name: Option<String>,
    /// Program and arguments; never empty.
    pub command: Vec<String>,
    /// Working directory of the worker; the daemon's own when `None`.
    pub cwd: Option<String>,
    /// Variables added to the worker's environment.
    pub env: Vec<(String, String)>,
    pub restart: RestartPolicy,
    /// Restarts allowed after the first attempt; `None` is unlimited.
    pub max_restarts: Option<u32>,
    /// No attempt starts more than this long after the run was submitted.
    pub deadline_ms: Option<u64>,
}

/// The lifecycle of an execution. See the supervisor's transition table.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecState {
    /// Recorded, no shim started yet.
    Pending,
    /// A shim has been started for the current attempt.
    Starting,
    /// The shim reported the worker running.
    Running,
    /// Waiting to start the next attempt.
    Backoff,
    /// The worker exited 0 and no restart follows. Final.
    Completed,
    /// The attempt failed; final unless a restart follows.
    Failed,
    /// Stopped by `tether stop`. Final.
    Cancelled,
    /// The shim vanished without reporting the worker's exit.
    Lost,
}

impl ExecState {
    /// The lowercase name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecState::Pending => "pending",
            ExecState::Starting => "starting",
            ExecState::Running => "running",
            ExecState::Backoff => "backoff",
            ExecState::Completed => "completed",
            ExecState::Failed => "failed",
            ExecState::Cancelled => "cancelled",
            ExecState::Lost => "lost",
        }
    }
}

/// How a worker ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// It could not be started at all (no such program, bad cwd, ...).
    SpawnFailed(String),
}

/// One row of `tether ps`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ExecutionInfo {
    /// Also the name of the execution's output stream.
    pub id: String,
    pub name: Option<String>,
    pub state: ExecState,
    /// The current attempt's worker pid, while one runs.
    pub pid: Option<u32>,
    /// Attempts so far, the first included.
    pub attempt: u32,
    /// Attempts after the first.
    pub restarts: u32,
    pub command: Vec<String>,
    pub restart: RestartPolicy,
    /// How the last attempt ended, once one has.
    pub last_exit: Option<ExitStatus>,
    /// Why the execution is in its state, when there is more to say
    /// ("deadline", "max restarts", "exit code 78 is not retried").
    pub reason: Option<String>,
    pub created_micros: u64,
    /// The output stream's last seq.
    pub stream_last_seq: u64,
    /// The newest checkpoint: its stream seq and creation time.
    pub last_checkpoint: Option<CheckpointRef>,
}

/// Where and when a checkpoint was taken.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointRef {
    pub seq: u64,
    pub created_micros: u64,
}

/// See [`Request::ShimHello`]. Identifies the processes by pid *and* start
/// time (field 22 of /proc/PID/stat) within one boot, so that a recycled
/// pid is never mistaken for them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShimHello {
    pub execution: String,
    pub attempt: u32,
    pub shim_pid: u32,
    pub shim_start_ticks: u64,
    /// `None` when the worker could not be started (a `WorkerExited` with
    /// `SpawnFailed` follows).
    pub worker_pid: Option<u32>,
    pub worker_start_ticks: u64,
    /// /proc/sys/kernel/random/boot_id
    pub boot_id: String,
}

/// See [`Request::WorkerExited`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WorkerExited {
    pub execution: String,
    pub attempt: u32,
    pub status: ExitStatus,
}

/// What the daemon hands a shim on its stdin (one codec frame) when it
/// starts it: everything needed to start the worker and report back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShimSpec {
    pub execution: String,
    pub attempt: u32,
    /// The daemon's socket, also given to the worker as `TETHER_SOCKET`.
    pub socket: String,
    pub command: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    /// Sets `TETHER_RESUMED=1` for the worker.
    pub resumed: bool,
    /// Longest line kept as one frame; longer lines are split.
    pub max_line: u32,
}

// ---------------------------------------------------------------------------
// Checkpoints and durable steps
// ---------------------------------------------------------------------------

/// See [`Request::CheckpointSave`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSave {
    pub execution: String,
    /// The worker's own format version for `data`; the daemon only stores it.
    pub schema_version: u32,
    pub data: Bytes,
}

/// A checkpoint without its data, as listed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// Increasing per execution.
    pub id: u64,
    /// The execution stream's last seq when the checkpoint was saved: output
    /// after it came after the checkpoint.
    pub seq: u64,
    pub schema_version: u32,
    pub size: u64,
    pub created_micros: u64,
    /// False when the stored checksum does not match the data; such a
    /// checkpoint is never loaded.
    pub valid: bool,
}

/// A checkpoint with its data. Only valid checkpoints are returned.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub data: Bytes,
}

/// Metadata a user keeps with a checkpoint (`--meta K=V`), in the order
/// given. The daemon only stores it.
pub type UserMeta = Vec<(String, String)>;

/// See [`Request::CheckpointSaveFull`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSaveFull {
    pub execution: String,
    pub schema_version: u32,
    pub data: Bytes,
    pub user_meta: UserMeta,
    /// Save even when the execution has ended (to mend state before it is
    /// resumed).
    pub force: bool,
}

/// A checkpoint as listed, with its [`UserMeta`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub meta: CheckpointMeta,
    pub user_meta: UserMeta,
}

/// A valid checkpoint with its [`UserMeta`] and its data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFull {
    pub meta: CheckpointMeta,
    pub user_meta: UserMeta,
    pub data: Bytes,
}

/// One recorded durable step, as listed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StepInfo {
    pub name: String,
    /// The result's length in bytes.
    pub size: u64,
    /// When it was recorded, microseconds since the Unix epoch; 0 when the
    /// store that recorded it kept no time.
    pub recorded_micros: u64,
}

/// Checks a stream, producer or consumer name: 1 to [`MAX_NAME_LEN`] bytes,
/// no control characters, no whitespace (so names survive shell and table
/// output unquoted).
pub fn validate_name(what: &'static str, name: &str) -> Result<(), Error> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > MAX_NAME_LEN {
        "it is longer than 255 bytes"
    } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        "it contains whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what,
        name: name.to_owned(),
        why,
    })
}
