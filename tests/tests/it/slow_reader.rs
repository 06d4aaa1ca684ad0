//! Guarantee 5: a stalled reader does not make the daemon buffer without
//! bound, and once it runs again it still gets every frame, in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tether_protocol::{Capabilities, Request, Response, StartAt, Subscribe};
use tether_tests::mem::{self, Memory};
use tether_tests::text::{assert_same_lines, wide_lines};
use tether_tests::{cli, raw, RawConn, Sandbox, Signal};

const STREAM: &str = "firehose";
const FRAMES: u64 = 200_000;
/// Bytes per line, newline included: 200,000 frames carry 293 MiB of
/// payload, well over the bound below, so a daemon that queued them in
/// memory for the stopped reader (or loaded the backlog to replay it) would
/// cross the bound.
const WIDTH: usize = 1536;
/// The daemon's resident memory must stay under this. It leaves room for
/// the store's page cache and allocator slack on top of a debug build's
/// baseline (about 160 MiB in all when replaying a large backlog), and is
/// still well below the payload above.
const BOUND_MIB: u64 = 256;
const TIMEOUT: Duration = Duration::from_secs(300);

/// Samples a process's memory every 50 ms until stopped, keeping the peak.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Memory>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = Memory::default();
            while !flag.load(Ordering::Relaxed) {
                let now = mem::read(pid).expect("the daemon is alive while sampled");
                peak.rss_kib = peak.rss_kib.max(now.rss_kib);
                peak.hwm_kib = peak.hwm_kib.max(now.hwm_kib);
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        Self { stop, thread }
    }

    fn finish(self) -> Memory {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler thread panicked")
    }
}

#[test]
fn stopped_reader_keeps_daemon_memory_bounded_and_gets_every_frame_after_sigcont() {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon();
    let input = wide_lines(1..=FRAMES, WIDTH);
    let (first, rest) = input.split_at(WIDTH);
    sb.publish(STREAM, first);

    let mut reader = sb.spawn("reader", &["tail", STREAM, "-f"]);
    reader.wait_stdout_len(WIDTH as u64, TIMEOUT);
    reader.signal(Signal::Stop);

    let sampler = Sampler::start(daemon.pid());
    cli::run(sb.tether(&["publish", STREAM]), rest.as_bytes(), TIMEOUT).assert_success();
    let stalled = sampler.finish();
    raw::assert_stored(&sb.socket(), STREAM, FRAMES);
    assert_eq!(
        reader.stdout_len(),
        WIDTH as u64,
        "the stopped reader printed while stopped"
    );

    let sampler = Sampler::start(daemon.pid());
    reader.signal(Signal::Cont);
    reader.wait_stdout_len(input.len() as u64, TIMEOUT);
    let catching_up = sampler.finish();
    std::thread::sleep(Duration::from_millis(500));
    reader.signal(Signal::Term);
    reader.assert_exit(0, TIMEOUT);

    for (phase, peak) in [
        ("while the reader was stopped", stalled),
        ("while the reader caught up", catching_up),
    ] {
        eprintln!("tetherd memory {phase}: {peak:?}");
        assert!(
            peak.peak_mib() < BOUND_MIB,
            "tetherd's resident memory reached {} MiB {phase} ({peak:?}), over the \
             {BOUND_MIB} MiB bound",
            peak.peak_mib()
        );
    }
    assert_same_lines(&reader.stdout(), &input, "the resumed reader");
}

/// Frames for the protocol-level variant: enough bytes to overflow any
/// per-follower live budget many times over, small enough to be quick.
const RAW_FRAMES: u64 = 60_000;
const RAW_WIDTH: usize = 512;

#[test]
fn stalled_durable_subscriber_receives_contiguous_seqs_then_live_frames() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &wide_lines(1..=1, RAW_WIDTH));

    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::DURABLE);
    conn.send(&Request::Subscribe(Subscribe {
        stream: STREAM.to_owned(),
        start: StartAt::Oldest,
        follow: true,
        consumer: None,
    }))
    .unwrap();
    assert!(
        matches!(conn.expect_response(), Response::Subscribed(_)),
        "expected Subscribed first"
    );
    let mut next = 1;
    expect_seq(&mut conn, &mut next);

    // Not reading while the rest is published is the stall.
    let rest = wide_lines(2..=RAW_FRAMES, RAW_WIDTH);
    cli::run(sb.tether(&["publish", STREAM]), rest.as_bytes(), TIMEOUT).assert_success();
    raw::assert_stored(&sb.socket(), STREAM, RAW_FRAMES);
    while next <= RAW_FRAMES {
        expect_seq(&mut conn, &mut next);
    }
    sb.publish(STREAM, "one more\n");
    expect_seq(&mut conn, &mut next);
}

/// Reads one `Durable` frame and asserts it carries seq `*next`.
fn expect_seq(conn: &mut RawConn, next: &mut u64) {
    match conn.expect_response() {
        Response::Durable(d) => assert_eq!(
            d.seq,
            *next,
            "the daemon skipped from seq {} to {}",
            *next - 1,
            d.seq
        ),
        other => panic!("expected Durable seq {next}, got {other:?}"),
    }
    *next += 1;
}
