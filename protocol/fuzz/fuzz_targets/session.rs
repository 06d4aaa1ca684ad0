//! Drives a real in-process daemon through sequences of valid and invalid
//! requests over a real unix socket.
//!
//! The input is decoded by hand (with `arbitrary::Unstructured`) into a
//! list of steps: a Hello (right version, wrong version, or none at all),
//! then requests of every kind with names drawn from a small pool that
//! mixes good names with empty, spaced and over-long ones, seqs near the
//! edges, and now and then raw garbage bytes that break the framing.
//! The steps are written from one thread while another reads every answer
//! until the daemon closes the connection.
//!
//! Properties checked, for every input:
//!
//! * nothing in the daemon panics (libFuzzer's panic hook aborts on a panic
//!   in any thread, the daemon's tasks included);
//! * every answer is a well-formed frame; an `Error` frame carries a known
//!   code and a message, and nothing follows it (it ends the session);
//! * the session ends once the client has closed its side;
//! * afterwards a fresh client still gets `Status`, lists the streams, and
//!   reads a stream back with seqs that have no gaps and no repeats.
#![no_main]

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use tether_protocol::codec::{decode_message, encode_frame};
use tether_protocol::{
    Append, Capabilities, CheckpointSave, DurableAck, DurableResume, ErrorCode, ExitStatus,
    FrameKind, Hello, Request, Response, RestartPolicy, RunSpec, ShimHello, StartAt, Subscribe,
    WorkerExited, PROTOCOL_VERSION,
};
use tokio_util::sync::CancellationToken;

/// Longest an answer may take before the daemon counts as hung.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Frames kept per stream: small, so that compaction and gap notices are
/// exercised as the fuzzer appends.
const RETENTION_FRAMES: u64 = 64;

/// Largest frame the daemon under test accepts; a small limit makes the
/// "frame too large" refusal reachable from small inputs.
const MAX_FRAME_LEN: usize = 4096;

/// Steps taken from one input at most.
const MAX_STEPS: usize = 48;

/// The daemon shared by every input: starting one per input would measure
/// redb's file creation rather than the session code.
struct Daemon {
    socket: PathBuf,
}

fn daemon() -> &'static Daemon {
    static DAEMON: OnceLock<Daemon> = OnceLock::new();
    DAEMON.get_or_init(start_daemon)
}

fn start_daemon() -> Daemon {
    // Leaked on purpose: the directory must outlive every input.
    let dir = tempfile::Builder::new()
        .prefix("tfz")
        .tempdir_in("/tmp")
        .expect("cannot create the daemon's directory")
        .keep();
    let socket = dir.join("s");
    let mut config = tetherd::Config::new(socket.clone(), dir.join("state"));
    config.max_frame_len = MAX_FRAME_LEN;
    config.retention.max_frames = Some(RETENTION_FRAMES);
    // No worker is ever started: `Run` requests exercise the supervisor's
    // bookkeeping and its failure path, not process spawning.
    config.shim = Some(dir.join("no-such-shim"));
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("cannot start the daemon's runtime");
        let result = runtime.block_on(tetherd::run(config, CancellationToken::new()));
        panic!("the daemon stopped: {result:?}");
    });
    for _ in 0..1000 {
        if status_ok(&socket).is_ok() {
            return Daemon { socket };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the in-process daemon did not start serving");
}

fuzz_target!(|data: &[u8]| {
    let daemon = daemon();
    let mut u = Unstructured::new(data);
    let Ok(steps) = steps(&mut u) else {
        return;
    };
    let answers = exchange(&daemon.socket, steps);
    check_answers(&answers);
    check_daemon_healthy(&daemon.socket);
});

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/// One thing written to the socket.
#[derive(Debug)]
enum Step {
    Request(Request),
    /// Bytes that are probably not a frame at all.
    Garbage(Vec<u8>),
}

fn steps(u: &mut Unstructured<'_>) -> ArbResult<Vec<Step>> {
    let mut steps = Vec::new();
    // Most sessions open properly, so that the fuzzer spends its time past
    // the handshake; some do not, or open with another version.
    match u.int_in_range(0..=9u8)? {
        0 => {}
        1 => {
            let version = u.arbitrary()?;
            steps.push(Step::Request(hello(u, version)?));
        }
        _ => steps.push(Step::Request(hello(u, PROTOCOL_VERSION)?)),
    }
    while steps.len() < MAX_STEPS && !u.is_empty() {
        let step = if u.ratio(1u8, 24)? {
            Step::Garbage(u.arbitrary()?)
        } else {
            Step::Request(request(u)?)
        };
        steps.push(step);
    }
    Ok(steps)
}

fn hello(u: &mut Unstructured<'_>, version: u32) -> ArbResult<Request> {
    Ok(Request::Hello(Hello {
        version,
        capabilities: Capabilities(u.arbitrary()?),
        client: "fuzz".to_owned(),
    }))
}

fn request(u: &mut Unstructured<'_>) -> ArbResult<Request> {
    Ok(match u.int_in_range(0..=16u8)? {
        0 => hello(u, PROTOCOL_VERSION)?,
        1..=4 => Request::Append(Append {
            stream: name(u)?,
            producer: name(u)?,
            producer_seq: seq(u)?,
            kind: kind(u)?,
            payload: payload(u)?,
        }),
        5 => Request::Subscribe(Subscribe {
            stream: name(u)?,
            start: match u.int_in_range(0..=3u8)? {
                0 => StartAt::Oldest,
                1 => StartAt::Last(seq(u)?),
                2 => StartAt::ConsumerAck,
                _ => StartAt::Now,
            },
            follow: u.arbitrary()?,
            consumer: optional_name(u)?,
        }),
        6 => Request::DurableResume(DurableResume {
            stream: name(u)?,
            acked_through: seq(u)?,
            follow: u.arbitrary()?,
            consumer: optional_name(u)?,
        }),
        7 => Request::DurableAck(DurableAck {
            through_seq: seq(u)?,
        }),
        8 => Request::ListStreams,
        9 => Request::Status,
        10 => Request::Run(RunSpec {
            name: optional_name(u)?,
            command: if u.arbitrary()? {
                Vec::new()
            } else {
                vec!["true".to_owned()]
            },
            cwd: None,
            env: Vec::new(),
            restart: RestartPolicy::Never,
            max_restarts: Some(0),
            deadline_ms: None,
        }),
        11 => Request::ListExecutions {
            all: u.arbitrary()?,
        },
        12 => Request::Stop {
            execution: name(u)?,
            timeout_ms: u.int_in_range(0..=50)?,
        },
        13 => {
            if u.arbitrary()? {
                Request::ShimHello(ShimHello {
                    execution: name(u)?,
                    attempt: u.arbitrary()?,
                    shim_pid: u.arbitrary()?,
                    shim_start_ticks: u.arbitrary()?,
                    worker_pid: u.arbitrary()?,
                    worker_start_ticks: u.arbitrary()?,
                    boot_id: name(u)?,
                })
            } else {
                Request::WorkerExited(WorkerExited {
                    execution: name(u)?,
                    attempt: u.arbitrary()?,
                    status: ExitStatus::Code(u.arbitrary()?),
                })
            }
        }
        14 => Request::CheckpointSave(CheckpointSave {
            execution: name(u)?,
            schema_version: u.arbitrary()?,
            data: payload(u)?,
        }),
        15 => {
            if u.arbitrary()? {
                Request::CheckpointLoad {
                    execution: name(u)?,
                }
            } else {
                Request::CheckpointList {
                    execution: name(u)?,
                }
            }
        }
        _ => {
            if u.arbitrary()? {
                Request::StepGet {
                    execution: name(u)?,
                    step: name(u)?,
                }
            } else {
                Request::StepPut {
                    execution: name(u)?,
                    step: name(u)?,
                    result: payload(u)?,
                }
            }
        }
    })
}

/// Mostly a few valid names, so that requests meet each other's state;
/// sometimes one the daemon must refuse.
fn name(u: &mut Unstructured<'_>) -> ArbResult<String> {
    Ok(match u.int_in_range(0..=11u8)? {
        0..=2 => "a".to_owned(),
        3..=5 => "b".to_owned(),
        6 => "c-1".to_owned(),
        7 => String::new(),
        8 => "has space".to_owned(),
        9 => "x".repeat(256),
        10 => "bell\u{7}".to_owned(),
        _ => u.arbitrary::<String>()?,
    })
}

fn optional_name(u: &mut Unstructured<'_>) -> ArbResult<Option<String>> {
    Ok(if u.arbitrary()? { Some(name(u)?) } else { None })
}

/// A seq near the interesting edges: 0, small, around what is stored, huge.
fn seq(u: &mut Unstructured<'_>) -> ArbResult<u64> {
    Ok(match u.int_in_range(0..=4u8)? {
        0 => 0,
        1 => u.int_in_range(1..=8)?,
        2 => u.int_in_range(1..=2000)?,
        3 => u64::MAX - u64::from(u.int_in_range(0..=2u8)?),
        _ => u.arbitrary()?,
    })
}

fn kind(u: &mut Unstructured<'_>) -> ArbResult<FrameKind> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => FrameKind::Data,
        1 => FrameKind::Stdout,
        2 => FrameKind::Stderr,
        _ => FrameKind::Event,
    })
}

fn payload(u: &mut Unstructured<'_>) -> ArbResult<Bytes> {
    let bytes: Vec<u8> = if u.ratio(1u8, 32)? {
        // Over the daemon's frame limit once encoded.
        vec![b'p'; MAX_FRAME_LEN + 1]
    } else {
        u.arbitrary()?
    };
    Ok(Bytes::from(bytes))
}

// ---------------------------------------------------------------------------
// The session
// ---------------------------------------------------------------------------

/// Writes every step from a thread of its own (so that neither side can
/// stall on a full socket buffer), closes the write side, and returns every
/// answer read until the daemon closed the connection.
fn exchange(socket: &PathBuf, steps: Vec<Step>) -> Vec<Response> {
    let mut conn = UnixStream::connect(socket).expect("cannot connect to the daemon");
    conn.set_read_timeout(Some(READ_TIMEOUT))
        .expect("cannot set a read timeout");
    let mut writer = conn.try_clone().expect("cannot clone the connection");
    let writing = std::thread::spawn(move || {
        for step in steps {
            let bytes = match step {
                Step::Request(request) => match encode_frame(&request) {
                    Ok(frame) => frame.to_vec(),
                    // Too large for the client-side codec: skip it.
                    Err(_) => continue,
                },
                Step::Garbage(bytes) => bytes,
            };
            // The daemon may close the connection after refusing a step;
            // what is left unwritten then does not matter.
            if writer.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut answers = Vec::new();
    loop {
        match read_response(&mut conn) {
            Ok(Some(answer)) => answers.push(answer),
            Ok(None) => break,
            // The daemon closes with unread input still queued, which the
            // kernel reports as a reset; that is an ending, not a failure.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the daemon's answers failed after {answers:?}: {e}"),
        }
    }
    writing.join().expect("the writer thread panicked");
    answers
}

/// One frame off the socket; `Ok(None)` at end-of-file between frames.
fn read_response(conn: &mut UnixStream) -> io::Result<Option<Response>> {
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < prefix.len() {
        match conn.read(&mut prefix[filled..])? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(io::Error::other("the daemon cut a length prefix short")),
            n => filled += n,
        }
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > 64 * 1024 * 1024 {
        return Err(io::Error::other(format!("absurd answer length {len}")));
    }
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body)?;
    decode_message(&body)
        .map(Some)
        .map_err(|e| io::Error::other(format!("the daemon sent an undecodable answer: {e}")))
}

fn check_answers(answers: &[Response]) {
    for (i, answer) in answers.iter().enumerate() {
        let Response::Error(error) = answer else {
            continue;
        };
        assert_ne!(
            error.code.name(),
            "unknown",
            "error frame with an unknown code: {error:?}"
        );
        assert!(
            !error.message.trim().is_empty(),
            "error frame without a message: {error:?}"
        );
        assert_ne!(
            error.code,
            ErrorCode::INTERNAL,
            "the daemon reported a bug: {error:?}"
        );
        assert_eq!(
            i + 1,
            answers.len(),
            "answers followed an error frame: {answers:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Afterwards
// ---------------------------------------------------------------------------

/// A fresh client can still ask for the status and read every stream.
fn check_daemon_healthy(socket: &PathBuf) {
    status_ok(socket).unwrap_or_else(|e| panic!("Status failed after the session: {e}"));
    let mut conn = session(socket, Capabilities::NONE).expect("fresh session");
    send(&mut conn, &Request::ListStreams).expect("send ListStreams");
    let streams = match read_response(&mut conn) {
        Ok(Some(Response::Streams(streams))) => streams,
        other => panic!("ListStreams answered {other:?}"),
    };
    for info in streams.iter().filter(|s| s.name == "a") {
        read_back(socket, &info.name, info.first_seq, info.last_seq);
    }
}

/// Reads the whole retained stream as a durable subscriber and checks that
/// the seqs run without gaps or repeats from the first retained one.
fn read_back(socket: &PathBuf, stream: &str, first: u64, last: u64) {
    let mut conn = session(socket, Capabilities::DURABLE).expect("durable session");
    let subscribe = Request::Subscribe(Subscribe {
        stream: stream.to_owned(),
        start: StartAt::Oldest,
        follow: false,
        consumer: None,
    });
    send(&mut conn, &subscribe).expect("send Subscribe");
    let mut expected: Option<u64> = None;
    loop {
        match read_response(&mut conn) {
            Ok(Some(Response::Subscribed(range))) => {
                assert!(range.first_seq >= first, "{range:?} before {first}");
                expected = Some(range.first_seq);
            }
            Ok(Some(Response::Durable(d))) => {
                let want = expected.expect("a frame before Subscribed");
                // Compaction may run between the listing and the read; a
                // later start is explained by a gap notice, never silent.
                assert_eq!(d.seq, want, "stream {stream}: seq out of order");
                expected = Some(want + 1);
            }
            Ok(Some(Response::Gap(gap))) => expected = Some(gap.first_available),
            Ok(Some(Response::End { last_seq })) => {
                assert!(last_seq >= last, "End at {last_seq}, listed last {last}");
                return;
            }
            other => panic!("reading {stream} back: unexpected {other:?}"),
        }
    }
}

fn session(socket: &PathBuf, capabilities: Capabilities) -> io::Result<UnixStream> {
    let mut conn = UnixStream::connect(socket)?;
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    let hello = Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities,
        client: "fuzz-check".to_owned(),
    });
    send(&mut conn, &hello)?;
    match read_response(&mut conn)? {
        Some(Response::HelloOk(_)) => Ok(conn),
        other => Err(io::Error::other(format!("Hello answered {other:?}"))),
    }
}

fn status_ok(socket: &PathBuf) -> io::Result<()> {
    let mut conn = session(socket, Capabilities::NONE)?;
    send(&mut conn, &Request::Status)?;
    match read_response(&mut conn)? {
        Some(Response::Status(_)) => Ok(()),
        other => Err(io::Error::other(format!("Status answered {other:?}"))),
    }
}

fn send(conn: &mut UnixStream, request: &Request) -> io::Result<()> {
    let frame = encode_frame(request).map_err(|e| io::Error::other(e.to_string()))?;
    conn.write_all(&frame)
}
