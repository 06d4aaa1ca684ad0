//! Slow and hostile clients. 500 durable followers of one stream, 100 of
//! which never read a byte: the daemon's memory stays bounded (guarantee 5)
//! and the 400 that read get every frame in order. And a client that opens
//! 10,000 connections meets the connection limit as a clear
//! `too_many_connections` error frame while the daemon goes on serving.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use tether_protocol::codec::{decode_message, encode_frame};
use tether_protocol::{
    Capabilities, ErrorCode, Hello, Request, Response, StartAt, Subscribe, PROTOCOL_VERSION,
};
use tether_tests::process::StdinFeeder;
use tether_tests::text::wide_lines;
use tether_tests::{raw, Background, RawConn, Sandbox};

const FOLLOWERS: usize = 500;
const STALLED: usize = 100;
const READER_THREADS: usize = 8;
const FRAMES: u64 = 20_000;
const WIDTH: usize = 1000;
/// The bound on the daemon's peak resident memory while 20 MB go through
/// with 500 followers, 100 of them stalled. Memory per follower is bounded
/// by construction, not by the stream's length: a follower holds at most
/// its live budget in the hub (256 KiB), one subscription event (a store
/// read of at most 256 KiB, or a live batch) waiting for the socket and
/// one being written, so about 1 MiB. Measured: 85-128 MiB peak for the
/// daemon with store reads of 128 KiB, 99 MiB with 256 KiB (it was 1.6 GB
/// before the budgets were cut and store chunks were capped at 64 KiB);
/// buffering the stalled followers' backlog would take 2 GB.
const RSS_BOUND_MIB: u64 = 256;

#[test]
fn five_hundred_followers_with_a_hundred_stalled_keep_memory_bounded_and_readers_current() {
    let sb = Sandbox::new();
    let socket = sb.socket();
    let d = sb.start_daemon();
    sb.publish("hot", "first\n");

    let mut conns: Vec<UnixStream> = (0..FOLLOWERS).map(|_| follow(&socket)).collect();
    let readers = conns.split_off(STALLED);
    let stalled = conns;
    let per_thread = readers.len().div_ceil(READER_THREADS);
    let mut threads = Vec::new();
    let mut readers = readers.into_iter();
    for _ in 0..READER_THREADS {
        let group: Vec<UnixStream> = readers.by_ref().take(per_thread).collect();
        threads.push(std::thread::spawn(move || read_all(group, FRAMES + 1)));
    }

    let mut publisher = Background::spawn(
        "publisher",
        sb.tether(&["publish", "hot", "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(wide_lines(1..=FRAMES, WIDTH));
    feeder.finish();
    let mut peak = 0;
    while publisher.is_running() {
        peak = peak.max(d.memory().peak_mib());
        std::thread::sleep(Duration::from_millis(100));
    }
    publisher.assert_exit(0, Duration::from_secs(1));
    for t in threads {
        t.join().expect("a reader thread failed");
    }
    peak = peak.max(d.memory().peak_mib());
    eprintln!("tetherd peak RSS with {FOLLOWERS} followers ({STALLED} stalled): {peak} MiB");
    assert!(
        peak < RSS_BOUND_MIB,
        "tetherd peaked at {peak} MiB, over the {RSS_BOUND_MIB} MiB bound"
    );
    raw::status(&socket).expect("status with stalled followers connected");
    drop(stalled);
}

/// A connection that has sent Hello (durable) and a following Subscribe
/// to the start of "hot", and has read nothing yet.
fn follow(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).unwrap();
    let hello = Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::DURABLE,
        client: "fault-clients".to_owned(),
    });
    let subscribe = Request::Subscribe(Subscribe {
        stream: "hot".to_owned(),
        start: StartAt::Oldest,
        follow: true,
        consumer: None,
    });
    for request in [hello, subscribe] {
        stream.write_all(&encode_frame(&request).unwrap()).unwrap();
    }
    stream
}

/// Reads durable frames from every connection of `group` (round-robin,
/// non-blocking) until each has seen seqs 1..=`last` in order.
fn read_all(group: Vec<UnixStream>, last: u64) {
    let mut states: Vec<(UnixStream, Vec<u8>, u64)> = group
        .into_iter()
        .map(|s| {
            s.set_nonblocking(true).unwrap();
            (s, Vec::new(), 0)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut chunk = vec![0u8; 256 * 1024];
    while states.iter().any(|(_, _, seen)| *seen < last) {
        assert!(Instant::now() < deadline, "readers fell behind for 240 s");
        let mut idle = true;
        for (stream, buf, seen) in &mut states {
            match stream.read(&mut chunk) {
                Ok(0) => panic!("the daemon closed a reader's connection at seq {seen}"),
                Ok(n) => {
                    idle = false;
                    buf.extend_from_slice(&chunk[..n]);
                    drain_frames(buf, seen);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("reading a follower failed: {e}"),
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Decodes whole frames off the front of `buf`, checking that durable
/// frames come in seq order.
fn drain_frames(buf: &mut Vec<u8>, seen: &mut u64) {
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
        if buf.len() - at - 4 < len {
            break;
        }
        let body = &buf[at + 4..at + 4 + len];
        match decode_message::<Response>(body).unwrap() {
            Response::Durable(d) => {
                assert_eq!(d.seq, *seen + 1, "a follower skipped or repeated a frame");
                *seen = d.seq;
            }
            Response::HelloOk(_) | Response::Subscribed(_) => {}
            other => panic!("a follower got {other:?}"),
        }
        at += 4 + len;
    }
    buf.drain(..at);
}

#[test]
fn ten_thousand_connections_meet_a_clear_limit_and_the_daemon_keeps_serving() {
    let sb = Sandbox::new();
    let socket = sb.socket();
    // The default limit (4096) with one more connection than fits is the
    // same code path; a small limit keeps the test quick.
    let mut daemon = Background::spawn(
        "tetherd",
        {
            let mut cmd = tether_tests::daemon::command(&socket, &sb.state_dir());
            cmd.arg("--max-connections").arg("200");
            cmd
        },
        sb.path(),
    );
    tether_tests::wait::wait_until(Duration::from_secs(60), "the daemon", || {
        raw::status(&socket).is_ok()
    });
    let mut open = Vec::new();
    let mut refused = 0usize;
    let mut refusal = None;
    for i in 0..10_000 {
        let mut conn = match RawConn::connect(&socket) {
            Ok(c) => c,
            Err(e) => panic!("connection {i} could not even connect: {e}"),
        };
        if open.len() < 200 {
            // A session, not a silent connection, which the daemon would
            // close after 5 s without a Hello, freeing its slot.
            conn.hello(Capabilities::NONE);
            open.push(conn);
            continue;
        }
        // Over the limit: the daemon answers at once, without a Hello.
        match conn.recv() {
            Ok(Some(Response::Error(e))) => {
                assert_eq!(e.code, ErrorCode::TOO_MANY_CONNECTIONS, "{e:?}");
                refused += 1;
                refusal.get_or_insert(e.message);
            }
            other => panic!("connection {i} over the limit got {other:?}"),
        }
    }
    assert_eq!(refused, 10_000 - 200);
    let message = refusal.unwrap();
    assert!(message.contains("maximum of 200"), "{message}");
    drop(open);
    tether_tests::wait::wait_until(Duration::from_secs(30), "the daemon serving again", || {
        raw::status(&socket).is_ok()
    });
    assert!(daemon.is_running(), "the daemon died: {}", daemon.stderr());
    daemon.signal(tether_tests::Signal::Term);
    daemon.assert_exit(0, Duration::from_secs(30));
}

/// Regression: with an open-file limit below the connection limit, the
/// connections past the descriptor limit could not be accepted (EMFILE)
/// and their clients waited without an answer. The daemon now serves no
/// more sessions than its descriptors allow and refuses the rest clearly.
#[test]
fn a_low_open_file_limit_still_refuses_extra_connections_clearly() {
    let sb = Sandbox::new();
    let socket = sb.socket();
    let mut cmd = tether_tests::daemon::command(&socket, &sb.state_dir());
    limit_open_files(&mut cmd, 256);
    let mut daemon = Background::spawn("tetherd", cmd, sb.path());
    tether_tests::wait::wait_until(Duration::from_secs(60), "the daemon", || {
        raw::status(&socket).is_ok()
    });
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..400 {
        let mut conn = RawConn::connect(&socket)
            .unwrap_or_else(|e| panic!("connection {i} could not connect: {e}"));
        // An accepted session answers its Hello; a refused connection has
        // its error frame waiting instead (and may be closed before the
        // Hello is written, so a failed write is fine). Neither may go
        // unanswered.
        let _ = conn.send(&Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::NONE,
            client: "fault-clients".to_owned(),
        }));
        match conn.recv() {
            Ok(Some(Response::HelloOk(_))) => open.push(conn),
            Ok(Some(Response::Error(e))) => {
                assert_eq!(e.code, ErrorCode::TOO_MANY_CONNECTIONS, "{e:?}");
                refused += 1;
            }
            other => panic!("connection {i} got {other:?} instead of an answer"),
        }
    }
    assert!(
        refused > 0,
        "no connection was refused under a 256-file limit"
    );
    assert!(daemon.is_running(), "the daemon died: {}", daemon.stderr());
    drop(open);
    daemon.signal(tether_tests::Signal::Term);
    daemon.assert_exit(0, Duration::from_secs(30));
}

/// Sets `RLIMIT_NOFILE` of the spawned process to `n`.
#[allow(unsafe_code)]
fn limit_open_files(cmd: &mut std::process::Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls
    // setrlimit(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}
