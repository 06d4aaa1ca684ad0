//! Golden bytes: the exact frames of one representative value of every
//! `Request` and `Response` variant.
//!
//! Postcard is not self-describing: the order of enum variants and of struct
//! fields *is* the wire format, and reordering, inserting or retyping one
//! silently changes the bytes. If this test fails, the wire format changed:
//! bump `PROTOCOL_VERSION` and update the fixtures in the same change, or
//! undo the change. `Request::Hello` and `Response::HelloOk` must stay variant
//! 0, `Response::Error` variant 1, and `Hello::version` its first field, in
//! every version, so that peers of different versions can refuse each other.
//!
//! Each fixture is written as the 4-byte big-endian length prefix followed by
//! the body, one field per space-separated group. Postcard writes integers
//! wider than a byte as LEB128 varints (300 is `ac02`), enum variants as a
//! varint index, strings and byte strings as a varint length and the bytes,
//! `Option` as `00` or `01` and the value, `bool` as `00`/`01`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use tether_protocol::{AnswerSpec, Answerer, AskSpec, InboxMessage, QuestionInfo, QuestionOutcome};
use tether_protocol::{
    Append, AppendStamped, Appended, Capabilities, ClientCodec, ConsumerInfo, Durable, DurableAck,
    DurableResume, ErrorCode, ErrorFrame, Frame, FrameKind, Gap, Hello, HelloOk, Message, Request,
    Response, ServerCodec, StartAt, StatusInfo, StreamInfo, Subscribe, Subscribed,
    PROTOCOL_VERSION,
};
use tether_protocol::{
    Checkpoint, CheckpointFull, CheckpointMeta, CheckpointSave, CheckpointSaveFull, StepInfo,
};
use tether_protocol::{
    CheckpointRef, ExecState, ExecutionInfo, ExitStatus, RestartPolicy, RunSpec, ShimHello,
    StorageFault, StorageState, WorkerExited,
};
use tether_protocol::{ExecutionDetail, RunSpecFull};
use tether_protocol::{MirrorInfo, MirrorStreamInfo};
use tokio_util::codec::{Decoder, Encoder};

/// The wire format these fixtures freeze.
const FROZEN_VERSION: u32 = 1;

fn request_fixtures() -> Vec<(Request, &'static str)> {
    let mut fixtures = older_request_fixtures();
    fixtures.extend(append_stamped_fixtures());
    fixtures
}

/// `AppendStamped`: an append's fields, then the producer's time.
fn append_stamped_fixtures() -> Vec<(Request, &'static str)> {
    vec![(
        Request::AppendStamped(AppendStamped {
            stream: "s".into(),
            producer: "p".into(),
            producer_seq: 3,
            kind: FrameKind::Stderr,
            payload: Bytes::from_static(b"hi"),
            ts_micros: 300,
        }),
        "0000000c 1b 0173 0170 03 02 026869 ac02",
    )]
}

#[test]
fn append_stamped_encodes_to_its_golden_bytes() {
    check_fixtures(
        append_stamped_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

fn older_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![
        (
            Request::Hello(Hello {
                version: 1,
                capabilities: Capabilities::DURABLE,
                client: "tether 0.1.0".into(),
            }),
            "00000010 00 01 01 0c74657468657220302e312e30",
        ),
        (
            Request::Append(Append {
                stream: "jobs".into(),
                producer: "p1".into(),
                producer_seq: 300,
                kind: FrameKind::Stdout,
                payload: Bytes::from_static(b"hi\n"),
            }),
            "00000010 01 046a6f6273 027031 ac02 01 0368690a",
        ),
        (
            Request::Subscribe(Subscribe {
                stream: "jobs".into(),
                start: StartAt::Oldest,
                follow: true,
                consumer: None,
            }),
            "00000009 02 046a6f6273 00 01 00",
        ),
        (
            Request::Subscribe(Subscribe {
                stream: "jobs".into(),
                start: StartAt::Last(10),
                follow: false,
                consumer: Some("c".into()),
            }),
            "0000000c 02 046a6f6273 010a 00 010163",
        ),
        (
            Request::Subscribe(Subscribe {
                stream: "jobs".into(),
                start: StartAt::ConsumerAck,
                follow: true,
                consumer: Some("c".into()),
            }),
            "0000000b 02 046a6f6273 02 01 010163",
        ),
        (
            Request::Subscribe(Subscribe {
                stream: "jobs".into(),
                start: StartAt::Now,
                follow: true,
                consumer: None,
            }),
            "00000009 02 046a6f6273 03 01 00",
        ),
        (
            Request::DurableResume(DurableResume {
                stream: "jobs".into(),
                acked_through: 128,
                follow: true,
                consumer: Some("c".into()),
            }),
            "0000000c 03 046a6f6273 8001 01 010163",
        ),
        (
            Request::DurableAck(DurableAck { through_seq: 16384 }),
            "00000004 04 808001",
        ),
        (Request::ListStreams, "00000001 05"),
        (Request::Status, "00000001 06"),
        (
            Request::Run(RunSpec {
                name: Some("a".into()),
                command: vec!["sh".into(), "-c".into()],
                cwd: None,
                env: vec![("K".into(), "V".into())],
                restart: RestartPolicy::OnFailure,
                max_restarts: Some(3),
                deadline_ms: None,
            }),
            "00000015 0701016102027368022d630001014b015601010300",
        ),
        (Request::ListExecutions { all: true }, "00000002 0801"),
        (
            Request::Stop {
                execution: "e1".into(),
                timeout_ms: 10000,
            },
            "00000006 09026531904e",
        ),
        (
            Request::ShimHello(ShimHello {
                execution: "e1".into(),
                attempt: 2,
                shim_pid: 100,
                shim_start_ticks: 5000,
                worker_pid: Some(101),
                worker_start_ticks: 5001,
                boot_id: "b".into(),
            }),
            "0000000e 0a02653102648827016589270162",
        ),
        (
            Request::WorkerExited(WorkerExited {
                execution: "e1".into(),
                attempt: 2,
                status: ExitStatus::Signal(9),
            }),
            "00000007 0b026531020112",
        ),
        (
            Request::CheckpointSave(CheckpointSave {
                execution: "e1".into(),
                schema_version: 2,
                data: Bytes::from_static(b"{}"),
            }),
            "00000008 0c02653102027b7d",
        ),
        (
            Request::CheckpointLoad {
                execution: "e1".into(),
            },
            "00000004 0d026531",
        ),
        (
            Request::CheckpointList {
                execution: "e1".into(),
            },
            "00000004 0e026531",
        ),
        (
            Request::StepGet {
                execution: "e1".into(),
                step: "s".into(),
            },
            "00000006 0f0265310173",
        ),
        (
            Request::StepPut {
                execution: "e1".into(),
                step: "s".into(),
                result: Bytes::from_static(b"7"),
            },
            "00000008 1002653101730137",
        ),
        (Request::Storage, "00000001 11"),
        (Request::Verify, "00000001 12"),
        (
            Request::CheckpointSavePart(Bytes::from_static(b"{}")),
            "00000004 13 027b7d",
        ),
        (
            Request::StepList {
                execution: "e1".into(),
            },
            "00000004 14 026531",
        ),
        (
            Request::StepClear {
                execution: "e1".into(),
                steps: vec!["s".into()],
                all: false,
            },
            "00000008 15 026531 01 0173 00",
        ),
        (
            Request::CheckpointSaveFull(CheckpointSaveFull {
                execution: "e1".into(),
                schema_version: 2,
                data: Bytes::from_static(b"{}"),
                user_meta: vec![("k".into(), "v".into())],
                force: true,
            }),
            "0000000e 16 026531 02 027b7d 01 016b 0176 01",
        ),
        (
            Request::CheckpointLoadFull {
                execution: "e1".into(),
                schema_version: Some(2),
            },
            "00000006 17 026531 01 02",
        ),
        (
            Request::CheckpointListFull {
                execution: "e1".into(),
            },
            "00000004 18 026531",
        ),
    ]
}

fn response_fixtures() -> Vec<(Response, &'static str)> {
    vec![
        (
            Response::HelloOk(HelloOk {
                version: 1,
                capabilities: Capabilities::DURABLE,
                daemon: "0.1.0".into(),
            }),
            "00000009 00 01 01 05302e312e30",
        ),
        (
            Response::Error(ErrorFrame {
                code: ErrorCode::UNSUPPORTED_VERSION,
                message: "v2?".into(),
            }),
            "00000006 01 01 0376323f",
        ),
        (
            // A code newer than this build still travels as a plain varint.
            Response::Error(ErrorFrame {
                code: ErrorCode(300),
                message: String::new(),
            }),
            "00000004 01 ac02 00",
        ),
        (
            Response::Appended(Appended {
                stream: "jobs".into(),
                producer: "p1".into(),
                producer_seq: 300,
                seq: 42,
            }),
            "0000000c 02 046a6f6273 027031 ac02 2a",
        ),
        (
            Response::Subscribed(Subscribed {
                first_seq: 1,
                last_seq: 0,
            }),
            "00000003 03 01 00",
        ),
        (
            Response::Durable(Durable {
                seq: 42,
                frame: Frame {
                    ts_micros: 1_700_000_000_000_000,
                    kind: FrameKind::Data,
                    payload: Bytes::from_static(b"ok"),
                },
            }),
            "0000000e 04 2a 8080f9c0c1c48203 00 026f6b",
        ),
        (
            Response::Live(Frame {
                ts_micros: 5,
                kind: FrameKind::Stderr,
                payload: Bytes::from_static(b"e"),
            }),
            "00000005 05 05 02 0165",
        ),
        (
            Response::Live(Frame {
                ts_micros: 0,
                kind: FrameKind::Event,
                payload: Bytes::new(),
            }),
            "00000004 05 00 03 00",
        ),
        (
            Response::Live(Frame {
                ts_micros: 0,
                kind: FrameKind::User,
                payload: Bytes::new(),
            }),
            "00000004 05 00 04 00",
        ),
        (
            Response::Gap(Gap {
                requested: 3,
                first_available: 200,
            }),
            "00000004 06 03 c801",
        ),
        (Response::End { last_seq: 7 }, "00000002 07 07"),
        (
            Response::Acked(DurableAck { through_seq: 9 }),
            "00000002 08 09",
        ),
        (
            Response::Streams(vec![StreamInfo {
                name: "jobs".into(),
                first_seq: 5,
                last_seq: 9,
                frames: 5,
                bytes: 1000,
                consumers: vec![ConsumerInfo {
                    name: "c".into(),
                    acked_through: 4,
                }],
            }]),
            "00000010 09 01 046a6f6273 05 09 05 e807 01 0163 04",
        ),
        (Response::Streams(vec![]), "00000002 09 00"),
        (
            Response::Status(StatusInfo {
                version: "0.1.0".into(),
                protocol: 1,
                pid: 4321,
                uptime_secs: 60,
                socket: "/s".into(),
                state_dir: "/d".into(),
                store_bytes: 65536,
                streams: 2,
                executions: 1,
                connections: 3,
            }),
            "00000017 0a 05302e312e30 01 e121 3c 022f73 022f64 808004 02 01 03",
        ),
        (
            Response::Started {
                execution: "e1".into(),
            },
            "00000004 0b026531",
        ),
        (
            Response::Executions(vec![ExecutionInfo {
                id: "e1".into(),
                name: None,
                state: ExecState::Running,
                pid: Some(101),
                attempt: 1,
                restarts: 0,
                command: vec!["true".into()],
                restart: RestartPolicy::Never,
                last_exit: Some(ExitStatus::Code(1)),
                reason: None,
                created_micros: 1,
                stream_last_seq: 7,
                last_checkpoint: Some(CheckpointRef {
                    seq: 5,
                    created_micros: 2,
                }),
            }]),
            "0000001b 0c0102653100020165010001047472756500010002000107010502",
        ),
        (
            Response::Stopped(ExecutionInfo {
                id: "e1".into(),
                name: Some("n".into()),
                state: ExecState::Cancelled,
                pid: None,
                attempt: 1,
                restarts: 0,
                command: vec![],
                restart: RestartPolicy::Always,
                last_exit: Some(ExitStatus::SpawnFailed("x".into())),
                reason: Some("r".into()),
                created_micros: 0,
                stream_last_seq: 0,
                last_checkpoint: None,
            }),
            "00000017 0d02653101016e06000100000201020178010172000000",
        ),
        (Response::ShimAccepted, "00000001 0e"),
        (Response::ExitRecorded, "00000001 0f"),
        (
            Response::CheckpointSaved(CheckpointMeta {
                id: 3,
                seq: 9,
                schema_version: 2,
                size: 2,
                created_micros: 1,
                valid: true,
            }),
            "00000007 10030902020101",
        ),
        (
            Response::Checkpoint(Checkpoint {
                meta: CheckpointMeta {
                    id: 3,
                    seq: 9,
                    schema_version: 2,
                    size: 2,
                    created_micros: 1,
                    valid: true,
                },
                data: Bytes::from_static(b"{}"),
            }),
            "0000000a 11030902020101027b7d",
        ),
        (Response::Checkpoints(vec![]), "00000002 1200"),
        (Response::StepResult(None), "00000002 1300"),
        (
            Response::StepRecorded(Bytes::from_static(b"7")),
            "00000003 140137",
        ),
        (
            Response::Storage(StorageState {
                degraded: Some(StorageFault {
                    cause: "x".into(),
                    full: true,
                    since_micros: 300,
                }),
            }),
            "00000007 15 01 0178 01 ac02",
        ),
        (
            Response::Storage(StorageState { degraded: None }),
            "00000002 1500",
        ),
        (Response::Verified("ok".into()), "00000004 16026f6b"),
        (
            Response::StreamsPart(vec![StreamInfo {
                name: "a".into(),
                first_seq: 1,
                last_seq: 0,
                frames: 0,
                bytes: 0,
                consumers: vec![],
            }]),
            "00000009 17 01 0161 01 00 00 00 00",
        ),
        (Response::ExecutionsPart(vec![]), "00000002 18 00"),
        (Response::CheckpointsPart(vec![]), "00000002 19 00"),
        (
            Response::CheckpointPart(Bytes::from_static(b"{}")),
            "00000004 1a 027b7d",
        ),
        (
            Response::Steps(vec![StepInfo {
                name: "s".into(),
                size: 1,
                recorded_micros: 300,
            }]),
            "00000007 1b 01 0173 01 ac02",
        ),
        (Response::StepsPart(vec![]), "00000002 1c 00"),
        (Response::StepsCleared(2), "00000002 1d 02"),
        (
            Response::CheckpointFull(CheckpointFull {
                meta: CheckpointMeta {
                    id: 1,
                    seq: 2,
                    schema_version: 3,
                    size: 2,
                    created_micros: 4,
                    valid: true,
                },
                user_meta: vec![("k".into(), "v".into())],
                data: Bytes::from_static(b"{}"),
            }),
            "0000000f 1e 01 02 03 02 04 01 01 016b 0176 027b7d",
        ),
        (Response::CheckpointsFull(vec![]), "00000002 1f 00"),
        (Response::CheckpointsFullPart(vec![]), "00000002 20 00"),
    ]
}

/// The requests that run workers as typed: from the caller's directory
/// and environment, on a pseudo-terminal, and `ps` with more.
fn run_full_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![
        (
            Request::RunFull(RunSpecFull {
                spec: RunSpec {
                    name: Some("a".into()),
                    command: vec!["sh".into(), "-c".into()],
                    cwd: None,
                    env: vec![("K".into(), "V".into())],
                    restart: RestartPolicy::OnFailure,
                    max_restarts: Some(3),
                    deadline_ms: None,
                },
                whole_env: true,
                pty: false,
                id: Some("k".into()),
                labels: vec![("a".into(), "b".into())],
                parent: Some("p".into()),
                max_failures_without_progress: Some(5),
                stop_signal: Some("INT".into()),
            }),
            "00000029 19 01016102027368022d630001014b015601010300 01 00 \
             01016b 0101610162 010170 0105 0103494e54",
        ),
        (Request::ListExecutionsFull { all: true }, "00000002 1a 01"),
    ]
}

/// See [`run_full_request_fixtures`].
fn run_full_response_fixtures() -> Vec<(Response, &'static str)> {
    vec![
        (
            Response::ExecutionsFull(vec![ExecutionDetail {
                info: ExecutionInfo {
                    id: "e1".into(),
                    name: Some("n".into()),
                    state: ExecState::Cancelled,
                    pid: None,
                    attempt: 1,
                    restarts: 0,
                    command: vec![],
                    restart: RestartPolicy::Always,
                    last_exit: Some(ExitStatus::SpawnFailed("x".into())),
                    reason: Some("r".into()),
                    created_micros: 0,
                    stream_last_seq: 0,
                    last_checkpoint: None,
                },
                env_keys: vec!["K".into()],
                cwd: Some("/".into()),
                cpu_per_mille: Some(125),
                rss_bytes: Some(4096),
                labels: vec![("k".into(), "v".into())],
                parent: Some("p".into()),
                children: vec!["c".into()],
                max_restarts: Some(3),
                deadline_ms: None,
                stop_signal: Some("INT".into()),
                max_failures_without_progress: None,
            }]),
            "00000037 21 01 02653101016e06000100000201020178010172000000 \
             01014b 01012f 017d 018020 01016b0176 010170 010163 0103 00 0103494e54 00",
        ),
        (Response::ExecutionsFullPart(vec![]), "00000002 22 00"),
    ]
}

#[test]
fn run_full_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        run_full_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

#[test]
fn run_full_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        run_full_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}

/// The requests that resume an ended execution and restart a live one.
fn resume_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![
        (
            Request::Resume {
                execution: "e1".into(),
                checkpoint: Some(3),
            },
            "00000006 1d 026531 0103",
        ),
        (
            Request::Resume {
                execution: "e1".into(),
                checkpoint: None,
            },
            "00000005 1d 026531 00",
        ),
        (
            Request::Restart {
                execution: "e1".into(),
                timeout_ms: 5000,
            },
            "00000006 1e 026531 8827",
        ),
        (Request::OutputFlushed { token: 7 }, "00000002 1f 07"),
    ]
}

/// The ask a shim answers with `OutputFlushed`.
fn flush_response_fixtures() -> Vec<(Response, &'static str)> {
    vec![(Response::FlushOutput { token: 300 }, "00000003 25 ac02")]
}

#[test]
fn flush_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        flush_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}

#[test]
fn resume_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        resume_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

/// Every request fixture, the added families' included.
fn all_request_fixtures() -> Vec<(Request, &'static str)> {
    let mut all = request_fixtures();
    all.extend(run_full_request_fixtures());
    all.extend(metrics_request_fixtures());
    all.extend(resume_request_fixtures());
    all.extend(removal_request_fixtures());
    all.extend(gate_request_fixtures());
    all.extend(mirror_request_fixtures());
    all
}

/// Every response fixture, the added families' included.
fn all_response_fixtures() -> Vec<(Response, &'static str)> {
    let mut all = response_fixtures();
    all.extend(run_full_response_fixtures());
    all.extend(metrics_response_fixtures());
    all.extend(flush_response_fixtures());
    all.extend(removal_response_fixtures());
    all.extend(gate_response_fixtures());
    all.extend(mirror_response_fixtures());
    all
}

/// The variant's name. The match is exhaustive on purpose: a new variant
/// does not compile until it is named here, and then the coverage test
/// fails until it has a fixture.
fn request_variant(msg: &Request) -> &'static str {
    match msg {
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

const ALL_REQUEST_VARIANTS: [&str; 43] = [
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

/// See [`request_variant`].
fn response_variant(msg: &Response) -> &'static str {
    match msg {
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

const ALL_RESPONSE_VARIANTS: [&str; 46] = [
    "HelloOk",
    "Error",
    "Appended",
    "Subscribed",
    "Durable",
    "Live",
    "Gap",
    "End",
    "Acked",
    "Streams",
    "Status",
    "Started",
    "Executions",
    "Stopped",
    "ShimAccepted",
    "ExitRecorded",
    "CheckpointSaved",
    "Checkpoint",
    "Checkpoints",
    "StepResult",
    "StepRecorded",
    "Storage",
    "Verified",
    "StreamsPart",
    "ExecutionsPart",
    "CheckpointsPart",
    "CheckpointPart",
    "Steps",
    "StepsPart",
    "StepsCleared",
    "CheckpointFull",
    "CheckpointsFull",
    "CheckpointsFullPart",
    "ExecutionsFull",
    "ExecutionsFullPart",
    "Metrics",
    "MetricsPart",
    "FlushOutput",
    "Removed",
    "Question",
    "Questions",
    "QuestionsPart",
    "Queued",
    "Messages",
    "Dequeued",
    "MirrorStatus",
];

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(spaced: &str) -> Vec<u8> {
    let digits: Vec<u8> = spaced
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Checks every fixture in both directions (value to bytes, bytes to value)
/// and reports all mismatches at once, with the actual bytes to compare.
fn check_fixtures<T, E, D>(fixtures: Vec<(T, &'static str)>, mut encoder: E, mut decoder: D)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + Clone,
    E: Encoder<T, Error = tether_protocol::Error>,
    D: Decoder<Item = T, Error = tether_protocol::Error>,
{
    let mut failures = Vec::new();
    for (value, golden) in fixtures {
        let golden_bytes = from_hex(golden);
        let mut encoded = BytesMut::new();
        encoder.encode(value.clone(), &mut encoded).unwrap();
        if encoded[..] != golden_bytes[..] {
            failures.push(format!(
                "{value:?}\n   golden: {}\n   actual: {}",
                to_hex(&golden_bytes),
                to_hex(&encoded)
            ));
            continue;
        }
        let mut src = BytesMut::from(&golden_bytes[..]);
        match decoder.decode(&mut src) {
            Ok(Some(decoded)) if decoded == value && src.is_empty() => {}
            other => failures.push(format!("{golden} decoded to {other:?}, not {value:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "the wire format changed (bump PROTOCOL_VERSION and update the fixtures):\n{}",
        failures.join("\n")
    );
}

#[test]
fn requests_encode_to_their_golden_bytes() {
    check_fixtures(request_fixtures(), ClientCodec::new(), ServerCodec::new());
}

#[test]
fn responses_encode_to_their_golden_bytes() {
    check_fixtures(response_fixtures(), ServerCodec::new(), ClientCodec::new());
}

#[test]
fn every_request_variant_has_a_fixture() {
    let covered: BTreeSet<_> = all_request_fixtures()
        .iter()
        .map(|(msg, _)| request_variant(msg))
        .collect();
    assert_eq!(covered, BTreeSet::from(ALL_REQUEST_VARIANTS));
}

#[test]
fn every_response_variant_has_a_fixture() {
    let covered: BTreeSet<_> = all_response_fixtures()
        .iter()
        .map(|(msg, _)| response_variant(msg))
        .collect();
    assert_eq!(covered, BTreeSet::from(ALL_RESPONSE_VARIANTS));
}

/// The variant indexes the fixtures use are exactly `0..KINDS`: a variant
/// appended without raising [`Message::KINDS`] would be refused by its own
/// build as a message from a newer one.
fn variant_indexes_are_0_to_kinds<T: Message + Serialize>(fixtures: Vec<(T, &'static str)>) {
    let indexes: BTreeSet<u32> = fixtures
        .iter()
        .map(|(msg, _)| {
            let body = postcard::to_allocvec(msg).unwrap();
            postcard::take_from_bytes::<u32>(&body).unwrap().0
        })
        .collect();
    assert_eq!(
        indexes,
        (0..T::KINDS).collect::<BTreeSet<u32>>(),
        "{}",
        T::NAME
    );
}

/// `Request::kind` and `Request::kind_name` agree with the bytes and the
/// names: a reader judges a request by them before the rest arrives.
#[test]
fn request_kinds_and_their_names_match_the_wire() {
    for (msg, _) in all_request_fixtures() {
        let body = postcard::to_allocvec(&msg).unwrap();
        let kind = postcard::take_from_bytes::<u32>(&body).unwrap().0;
        assert_eq!(msg.kind(), kind, "{msg:?}");
        assert_eq!(Request::kind_name(kind), Some(msg.name()), "{msg:?}");
    }
    assert_eq!(Request::kind_name(Request::KINDS), None);
}

#[test]
fn message_kinds_match_the_variants() {
    variant_indexes_are_0_to_kinds(all_request_fixtures());
    variant_indexes_are_0_to_kinds(all_response_fixtures());
}

#[test]
fn every_start_position_and_frame_kind_has_a_fixture() {
    let starts: BTreeSet<_> = request_fixtures()
        .iter()
        .filter_map(|(msg, _)| match msg {
            Request::Subscribe(s) => Some(match s.start {
                StartAt::Oldest => "Oldest",
                StartAt::Last(_) => "Last",
                StartAt::ConsumerAck => "ConsumerAck",
                StartAt::Now => "Now",
            }),
            _ => None,
        })
        .collect();
    assert_eq!(
        starts,
        BTreeSet::from(["Oldest", "Last", "ConsumerAck", "Now"])
    );

    let mut kinds = Vec::new();
    for (msg, _) in request_fixtures() {
        if let Request::Append(a) = msg {
            kinds.push(a.kind);
        }
    }
    for (msg, _) in response_fixtures() {
        match msg {
            Response::Durable(d) => kinds.push(d.frame.kind),
            Response::Live(f) => kinds.push(f.kind),
            _ => {}
        }
    }
    for kind in [
        FrameKind::Data,
        FrameKind::Stdout,
        FrameKind::Stderr,
        FrameKind::Event,
        FrameKind::User,
    ] {
        assert!(kinds.contains(&kind), "no fixture carries {kind:?}");
    }
}

/// The numbers behind named constants travel on the wire too.
#[test]
fn error_codes_and_capability_bits_keep_their_numbers() {
    let codes = [
        (ErrorCode::UNSUPPORTED_VERSION, 1, "unsupported_version"),
        (ErrorCode::MALFORMED, 2, "malformed"),
        (ErrorCode::FRAME_TOO_LARGE, 3, "frame_too_large"),
        (ErrorCode::HELLO_REQUIRED, 4, "hello_required"),
        (ErrorCode::INVALID_REQUEST, 5, "invalid_request"),
        (ErrorCode::NOT_FOUND, 6, "not_found"),
        (ErrorCode::STORAGE_FULL, 7, "storage_full"),
        (ErrorCode::STORAGE, 8, "storage"),
        (ErrorCode::TOO_MANY_CONNECTIONS, 9, "too_many_connections"),
        (ErrorCode::SHUTTING_DOWN, 10, "shutting_down"),
        (ErrorCode::PERMISSION_DENIED, 11, "permission_denied"),
        (ErrorCode::INTERNAL, 12, "internal"),
        (ErrorCode::ALREADY_ANSWERED, 13, "already_answered"),
        (ErrorCode::INVALID_ANSWER, 14, "invalid_answer"),
    ];
    for (code, number, name) in codes {
        assert_eq!(code.0, number, "{name}");
        assert_eq!(code.name(), name);
        assert_eq!(code.to_string(), name);
    }
    assert_eq!(ErrorCode(0).name(), "unknown");
    assert_eq!(ErrorCode(15).name(), "unknown");
    assert_eq!(Capabilities::NONE.0, 0);
    assert_eq!(Capabilities::DURABLE.0, 1);
    assert_eq!(Capabilities::APPEND_STAMPED.0, 2);
}

#[test]
fn fixtures_are_for_the_current_protocol_version() {
    assert_eq!(
        PROTOCOL_VERSION, FROZEN_VERSION,
        "PROTOCOL_VERSION changed: re-check every fixture here and set FROZEN_VERSION"
    );
}

// Metrics (`tether metrics`): fixtures of their own, joined to the others
// for the coverage and variant index checks.

fn metrics_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![(Request::Metrics, "00000001 1c")]
}

fn metrics_response_fixtures() -> Vec<(Response, &'static str)> {
    vec![
        (
            Response::Metrics("# EOF\n".into()),
            "00000008 23 06 2320454f460a",
        ),
        (
            Response::MetricsPart("a 1\n".into()),
            "00000006 24 04 6120310a",
        ),
    ]
}

#[test]
fn metrics_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        metrics_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

#[test]
fn metrics_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        metrics_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}

// Removal (`tether rm`, `prune`, `streams rm`): fixtures of their own,
// joined to the others for the coverage and variant index checks.

fn removal_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![
        (
            Request::Remove {
                executions: vec!["e1".into()],
                force: true,
            },
            "00000006 20 01 026531 01",
        ),
        (
            Request::Prune {
                older_than_ms: Some(300),
            },
            "00000004 21 01 ac02",
        ),
        (
            Request::Prune {
                older_than_ms: None,
            },
            "00000002 21 00",
        ),
        (
            Request::RemoveStreams {
                names: vec!["s".into()],
            },
            "00000004 22 01 0173",
        ),
    ]
}

fn removal_response_fixtures() -> Vec<(Response, &'static str)> {
    vec![(
        Response::Removed(vec!["e1".into(), "s".into()]),
        "00000007 26 02 026531 0173",
    )]
}

#[test]
fn removal_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        removal_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

#[test]
fn removal_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        removal_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}

// Human gates and inboxes (`tether ask`, `answer`, `questions`, `send`,
// `recv`): fixtures of their own, joined to the others for the coverage
// and variant index checks.

fn gate_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![
        (
            Request::Ask(AskSpec {
                execution: "e1".into(),
                text: "ok?".into(),
                choices: vec!["y".into(), "n".into()],
                timeout_ms: Some(300),
                default: Some("n".into()),
                key: None,
                nonce: 7,
            }),
            "00000015 23 026531 036f6b3f 02 0179 016e 01ac02 01016e 00 07",
        ),
        (
            Request::AwaitAnswer {
                question: 3,
                wait_ms: 300,
            },
            "00000004 24 03 ac02",
        ),
        (
            Request::Answer(AnswerSpec {
                execution: "e1".into(),
                question: Some(3),
                answer: "y".into(),
            }),
            "00000008 25 026531 0103 0179",
        ),
        (
            Request::ListQuestions {
                all: true,
                execution: None,
                after: 2,
                wait_ms: 0,
            },
            "00000005 26 01 00 02 00",
        ),
        (
            Request::Send {
                execution: "e1".into(),
                message: Bytes::from_static(b"hi"),
            },
            "00000007 27 026531 026869",
        ),
        (
            Request::Recv {
                execution: "e1".into(),
                max: 1,
                wait_ms: 300,
            },
            "00000007 28 026531 01 ac02",
        ),
        (
            Request::Dequeue {
                execution: "e1".into(),
                through: 5,
            },
            "00000005 29 026531 05",
        ),
    ]
}

fn gate_question() -> QuestionInfo {
    QuestionInfo {
        id: 3,
        execution: "e1".into(),
        key: "k".into(),
        text: "ok?".into(),
        choices: vec!["y".into()],
        default: None,
        asked_micros: 1,
        deadline_micros: None,
        attempt: 1,
        seq: 4,
        outcome: Some(QuestionOutcome {
            answer: Some("y".into()),
            by: Answerer::User {
                uid: 0,
                name: Some("root".into()),
            },
            answered_micros: 2,
            seq: 5,
        }),
    }
}

fn gate_response_fixtures() -> Vec<(Response, &'static str)> {
    let open = QuestionInfo {
        outcome: None,
        ..gate_question()
    };
    let timed_out = QuestionInfo {
        outcome: Some(QuestionOutcome {
            answer: None,
            by: Answerer::Timeout,
            answered_micros: 2,
            seq: 5,
        }),
        ..gate_question()
    };
    vec![
        (
            Response::Question(gate_question()),
            "00000021 27 03 026531 016b 036f6b3f 010179 00 01 00 01 04 01 01 0179 00 00 01 04726f6f74 02 05",
        ),
        (
            Response::Questions(vec![open]),
            "00000015 28 01 03 026531 016b 036f6b3f 010179 00 01 00 01 04 00",
        ),
        (
            Response::QuestionsPart(vec![timed_out]),
            "00000019 29 01 03 026531 016b 036f6b3f 010179 00 01 00 01 04 01 00 01 02 05",
        ),
        (Response::Queued { id: 9 }, "00000002 2a 09"),
        (
            Response::Messages(vec![InboxMessage {
                id: 9,
                sent_micros: 1,
                sender_uid: 1000,
                data: Bytes::from_static(b"hi"),
            }]),
            "00000009 2b 01 09 01 e807 026869",
        ),
        (Response::Dequeued(1), "00000002 2c 01"),
    ]
}

#[test]
fn gate_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        gate_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

#[test]
fn gate_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        gate_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}

fn mirror_request_fixtures() -> Vec<(Request, &'static str)> {
    vec![(Request::MirrorStatus, "00000001 2a")]
}

fn mirror_response_fixtures() -> Vec<(Response, &'static str)> {
    let info = MirrorInfo {
        nats_url: "n".into(),
        jetstream_stream: "T".into(),
        source: "h".into(),
        connected: true,
        streams: vec![MirrorStreamInfo {
            stream: "s".into(),
            mirrored_seq: 2,
            last_seq: 3,
        }],
    };
    vec![
        (Response::MirrorStatus(None), "00000002 2d 00"),
        (
            Response::MirrorStatus(Some(info)),
            "0000000e 2d 01 016e 0154 0168 01 01 0173 02 03",
        ),
    ]
}

#[test]
fn mirror_requests_encode_to_their_golden_bytes() {
    check_fixtures(
        mirror_request_fixtures(),
        ClientCodec::new(),
        ServerCodec::new(),
    );
}

#[test]
fn mirror_responses_encode_to_their_golden_bytes() {
    check_fixtures(
        mirror_response_fixtures(),
        ServerCodec::new(),
        ClientCodec::new(),
    );
}
