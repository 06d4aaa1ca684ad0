//! `floors`: what this machine allows without tetherd in the way, so the
//! daemon's figures can be read against them: fdatasync latency, durable raw
//! appends, redb commits and scans, unix-socket throughput, and round trips
//! to another process (directly, and through one thread hop inside it).
//!
//! Each measurement is one function returning its rows. `--only` runs one,
//! `--json` prints one JSON object per row, `--quick` does a tenth of the
//! work of each (for a check run; its figures are not worth reading).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use tether_bench::{percentile, BoxError};

/// The machine's own limits, for comparison with tetherd.
#[derive(Debug, Parser)]
#[command(name = "floors")]
struct Args {
    /// Directory for the files; a temporary directory is made inside it and
    /// removed at the end [default: the system's temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Run this measurement alone.
    #[arg(long, value_enum, value_name = "NAME")]
    only: Option<Floor>,
    /// Print one JSON object per figure instead of a table.
    #[arg(long)]
    json: bool,
    /// Do a tenth of every count: a quick check that everything runs.
    #[arg(long)]
    quick: bool,
    /// Serve round trips on this socket (the child half of `round-trip`).
    #[arg(long, value_name = "SOCKET", hide = true)]
    echo_server: Option<PathBuf>,
    /// With --echo-server: pass each message through a second thread.
    #[arg(long, hide = true, requires = "echo_server")]
    hop: bool,
}

/// One measurement, as named by `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Floor {
    Fdatasync,
    Append,
    Redb,
    Socket,
    RoundTrip,
}

impl Floor {
    const ALL: [Floor; 5] = [
        Floor::Fdatasync,
        Floor::Append,
        Floor::Redb,
        Floor::Socket,
        Floor::RoundTrip,
    ];

    fn name(self) -> &'static str {
        match self {
            Floor::Fdatasync => "fdatasync",
            Floor::Append => "append",
            Floor::Redb => "redb",
            Floor::Socket => "socket",
            Floor::RoundTrip => "round-trip",
        }
    }
}

/// How much work each measurement does.
#[derive(Debug, Clone, Copy)]
struct Counts {
    sync_samples: usize,
    append_frames: usize,
    redb_rows: u64,
    socket_frames: usize,
    round_trips: usize,
}

impl Counts {
    fn new(quick: bool) -> Counts {
        let divisor = if quick { 10 } else { 1 };
        Counts {
            sync_samples: 2_000 / divisor,
            append_frames: 1_000_000 / divisor,
            redb_rows: 1_000_000 / divisor as u64,
            socket_frames: 5_000_000 / divisor,
            round_trips: 10_000 / divisor,
        }
    }
}

/// One line of the report.
#[derive(Debug)]
struct Row {
    floor: Floor,
    name: &'static str,
    figure: Figure,
}

#[derive(Debug)]
enum Figure {
    /// Milliseconds per operation, warm-up excluded.
    Latency {
        samples: usize,
        p50_ms: f64,
        p99_ms: f64,
    },
    /// `count` items of `unit` in `seconds`.
    Rate {
        count: u64,
        unit: &'static str,
        seconds: f64,
    },
}

impl Figure {
    fn latency(mut times: Vec<f64>) -> Figure {
        times.sort_by(f64::total_cmp);
        Figure::Latency {
            samples: times.len(),
            p50_ms: percentile(&times, 0.50),
            p99_ms: percentile(&times, 0.99),
        }
    }

    fn per_second(count: u64, seconds: f64) -> f64 {
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    }
}

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Figure::Latency { p50_ms, p99_ms, .. } => {
                write!(f, "p50 {p50_ms:.3} ms  p99 {p99_ms:.3} ms")
            }
            Figure::Rate {
                count,
                unit,
                seconds,
            } => write!(
                f,
                "{:.0} {unit}/s  ({count} in {seconds:.3} s)",
                Figure::per_second(count, seconds)
            ),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.echo_server {
        Some(socket) => echo_server(socket, args.hop),
        None => run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floors: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    let temp = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)
            .map_err(|e| format!("cannot make a directory in {}: {e}", dir.display()))?,
        None => {
            tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?
        }
    };
    let counts = Counts::new(args.quick);
    if !args.json {
        println!("{:<30} figure", "floor");
    }
    for floor in Floor::ALL {
        if args.only.is_some_and(|only| only != floor) {
            continue;
        }
        for row in measure(floor, temp.path(), counts)? {
            print_row(&row, args.json);
        }
    }
    Ok(())
}

fn measure(floor: Floor, dir: &Path, counts: Counts) -> Result<Vec<Row>, BoxError> {
    match floor {
        Floor::Fdatasync => fdatasync(dir, counts.sync_samples),
        Floor::Append => append(dir, counts.append_frames),
        Floor::Redb => redb(dir, counts.redb_rows),
        Floor::Socket => socket(counts.socket_frames),
        Floor::RoundTrip => round_trip(dir, counts.round_trips),
    }
}

fn print_row(row: &Row, json: bool) {
    if !json {
        println!("{:<30} {}", row.name, row.figure);
        return;
    }
    let object = match row.figure {
        Figure::Latency {
            samples,
            p50_ms,
            p99_ms,
        } => serde_json::json!({
            "floor": row.floor.name(),
            "name": row.name,
            "samples": samples,
            "p50_ms": p50_ms,
            "p99_ms": p99_ms,
        }),
        Figure::Rate {
            count,
            unit,
            seconds,
        } => serde_json::json!({
            "floor": row.floor.name(),
            "name": row.name,
            "count": count,
            "unit": unit,
            "seconds": seconds,
            "per_second": Figure::per_second(count, seconds),
        }),
    };
    println!("{object}");
}

/// The block size of the fdatasync measurements.
const BLOCK: usize = 4096;
/// Payload bytes of one frame.
const FRAME: usize = 256;
/// Bytes of a frame's length prefix (a big-endian `u32`, as on the wire).
const PREFIX: usize = 4;
/// Frames per write (and per fdatasync), rows per redb commit.
const BATCH: usize = 1024;
/// Bytes of one round-trip request, and of its reply.
const MESSAGE: usize = 300;

/// An `io::Error` mapper naming what failed and on which path.
fn failed<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BoxError + 'a {
    move |e| format!("{what} {}: {e}", path.display()).into()
}

fn ms(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e3
}

/// A new file; one left from an earlier run would skew the figures.
fn create(path: &Path) -> Result<File, BoxError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(failed("cannot create", path))
}

/// Latency of one 4 KiB write + fdatasync, appended and overwritten.
fn fdatasync(dir: &Path, samples: usize) -> Result<Vec<Row>, BoxError> {
    let append = sync_append_times(&dir.join("sync-append.dat"), samples)?;
    let overwrite = sync_overwrite_times(&dir.join("sync-overwrite.dat"), samples)?;
    Ok(vec![
        Row {
            floor: Floor::Fdatasync,
            name: "fdatasync 4 KiB append",
            figure: Figure::latency(append),
        },
        Row {
            floor: Floor::Fdatasync,
            name: "fdatasync 4 KiB overwrite",
            figure: Figure::latency(overwrite),
        },
    ])
}

/// Milliseconds per append + fdatasync. The file grows each time, so every
/// fdatasync also has to record a new size and block.
fn sync_append_times(path: &Path, samples: usize) -> Result<Vec<f64>, BoxError> {
    let mut file = create(path)?;
    let warmup = samples / 10;
    let mut times = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        let block = [(i % 251) as u8; BLOCK];
        let started = Instant::now();
        file.write_all(&block)
            .map_err(failed("cannot write", path))?;
        file.sync_data().map_err(failed("cannot fdatasync", path))?;
        if i >= warmup {
            times.push(ms(started.elapsed()));
        }
    }
    Ok(times)
}

/// Milliseconds per overwrite + fdatasync. The file is first written with
/// zeros and synced (not merely allocated, which would leave extents to
/// convert on the first write), so the timed fdatasyncs carry data only.
fn sync_overwrite_times(path: &Path, samples: usize) -> Result<Vec<f64>, BoxError> {
    let file = create(path)?;
    let warmup = samples / 10;
    let blocks = warmup + samples;
    let zeros = vec![0u8; BLOCK * blocks];
    file.write_all_at(&zeros, 0)
        .map_err(failed("cannot write", path))?;
    file.sync_all().map_err(failed("cannot fsync", path))?;
    let mut times = Vec::with_capacity(samples);
    for i in 0..blocks {
        // Non-zero bytes, so no layer can skip the write as unchanged.
        let block = [(i % 251 + 1) as u8; BLOCK];
        let started = Instant::now();
        file.write_all_at(&block, (i * BLOCK) as u64)
            .map_err(failed("cannot write", path))?;
        file.sync_data().map_err(failed("cannot fdatasync", path))?;
        if i >= warmup {
            times.push(ms(started.elapsed()));
        }
    }
    Ok(times)
}

/// Appends frame number `i` (prefix and payload) to `buf`.
fn push_frame(buf: &mut Vec<u8>, i: usize) {
    buf.extend_from_slice(&(FRAME as u32).to_be_bytes());
    buf.resize(buf.len() + FRAME, (i % 251) as u8);
}

/// `batch` cleared and filled with frames `first..first + n`.
fn fill_batch(batch: &mut Vec<u8>, first: usize, n: usize) {
    batch.clear();
    for i in first..first + n {
        push_frame(batch, i);
    }
}

/// Durable appends with nothing but a file: frames written and fdatasynced
/// a batch at a time, the most a log on this disk could take.
fn append(dir: &Path, frames: usize) -> Result<Vec<Row>, BoxError> {
    let path = dir.join("append.log");
    let mut file = create(&path)?;
    let mut batch = Vec::with_capacity(BATCH * (PREFIX + FRAME));
    let started = Instant::now();
    let mut written = 0;
    while written < frames {
        let n = BATCH.min(frames - written);
        fill_batch(&mut batch, written, n);
        file.write_all(&batch)
            .map_err(failed("cannot write", &path))?;
        file.sync_data()
            .map_err(failed("cannot fdatasync", &path))?;
        written += n;
    }
    Ok(vec![Row {
        floor: Floor::Append,
        name: "append 256 B x1024, fdatasync",
        figure: Figure::Rate {
            count: frames as u64,
            unit: "frames",
            seconds: started.elapsed().as_secs_f64(),
        },
    }])
}

/// The table of the redb measurement: row number to a 256-byte value.
const ROWS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("rows");

/// redb alone: durable commits of a batch of rows each, then one scan.
fn redb(dir: &Path, rows: u64) -> Result<Vec<Row>, BoxError> {
    let path = dir.join("floors.redb");
    let db =
        Database::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let write_seconds = redb_write(&db, rows)?;
    let scan_seconds = redb_scan(&db, rows)?;
    Ok(vec![
        Row {
            floor: Floor::Redb,
            name: "redb commit 1024 rows",
            figure: Figure::Rate {
                count: rows,
                unit: "rows",
                seconds: write_seconds,
            },
        },
        Row {
            floor: Floor::Redb,
            name: "redb scan",
            figure: Figure::Rate {
                count: rows,
                unit: "rows",
                seconds: scan_seconds,
            },
        },
    ])
}

/// Seconds to insert `rows` rows, `BATCH` per durable commit.
fn redb_write(db: &Database, rows: u64) -> Result<f64, BoxError> {
    let mut value = [0u8; FRAME];
    let started = Instant::now();
    let mut next = 0;
    while next < rows {
        let end = rows.min(next + BATCH as u64);
        let mut txn = db
            .begin_write()
            .map_err(|e| format!("redb begin_write: {e}"))?;
        // Immediate is redb's default; it is set anyway because the figure
        // is only meaningful for commits that are durable on return.
        txn.set_durability(Durability::Immediate)
            .map_err(|e| format!("redb set_durability: {e}"))?;
        {
            let mut table = txn
                .open_table(ROWS)
                .map_err(|e| format!("redb open_table: {e}"))?;
            for key in next..end {
                value[..8].copy_from_slice(&key.to_be_bytes());
                table
                    .insert(key, value.as_slice())
                    .map_err(|e| format!("redb insert: {e}"))?;
            }
        }
        txn.commit().map_err(|e| format!("redb commit: {e}"))?;
        next = end;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds to read every row in one read transaction; the rows and bytes
/// seen are checked, which also keeps the reads from being optimised away.
fn redb_scan(db: &Database, rows: u64) -> Result<f64, BoxError> {
    let started = Instant::now();
    let txn = db
        .begin_read()
        .map_err(|e| format!("redb begin_read: {e}"))?;
    let table = txn
        .open_table(ROWS)
        .map_err(|e| format!("redb open_table: {e}"))?;
    let (mut count, mut bytes) = (0u64, 0u64);
    for entry in table.iter().map_err(|e| format!("redb iter: {e}"))? {
        let (_key, value) = entry.map_err(|e| format!("redb scan: {e}"))?;
        bytes += value.value().len() as u64;
        count += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    if count != rows || bytes != rows * FRAME as u64 {
        return Err(format!(
            "redb scan saw {count} rows of {bytes} bytes, expected {rows} of {FRAME} bytes each"
        )
        .into());
    }
    Ok(seconds)
}

/// Frames through a unix socket pair: one thread writes batches, this one
/// reads and counts.
fn socket(frames: usize) -> Result<Vec<Row>, BoxError> {
    let (mut tx, rx) =
        UnixStream::pair().map_err(|e| format!("cannot make a unix socket pair: {e}"))?;
    let started = Instant::now();
    let writer = thread::spawn(move || -> io::Result<()> {
        let mut batch = Vec::with_capacity(BATCH * (PREFIX + FRAME));
        let mut sent = 0;
        while sent < frames {
            let n = BATCH.min(frames - sent);
            fill_batch(&mut batch, sent, n);
            tx.write_all(&batch)?;
            sent += n;
        }
        // Dropping `tx` here is what ends the reader's stream.
        Ok(())
    });
    let counted = count_frames(rx)?;
    let seconds = started.elapsed().as_secs_f64();
    writer
        .join()
        .map_err(|_| "the socket writer thread panicked")?
        .map_err(|e| format!("socket write: {e}"))?;
    if counted != frames {
        return Err(format!("socket: counted {counted} frames, sent {frames}").into());
    }
    Ok(vec![Row {
        floor: Floor::Socket,
        name: "unix socket 256 B frames",
        figure: Figure::Rate {
            count: frames as u64,
            unit: "frames",
            seconds,
        },
    }])
}

/// Reads length-prefixed frames until the stream ends and counts them.
fn count_frames(mut stream: UnixStream) -> Result<usize, BoxError> {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut start, mut end) = (0, 0);
    let mut count = 0;
    loop {
        while end - start >= PREFIX {
            let len =
                u32::from_be_bytes([buf[start], buf[start + 1], buf[start + 2], buf[start + 3]])
                    as usize;
            // Checked so a corrupt prefix is reported, not waited on forever.
            if len > FRAME {
                return Err(format!("socket: frame of {len} bytes, expected {FRAME}").into());
            }
            if end - start < PREFIX + len {
                break;
            }
            start += PREFIX + len;
            count += 1;
        }
        // The partial frame left moves to the front, to be completed.
        buf.copy_within(start..end, 0);
        end -= start;
        start = 0;
        let n = match stream.read(&mut buf[end..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("socket read: {e}").into()),
        };
        if n == 0 {
            if end != 0 {
                return Err("socket: stream ended inside a frame".into());
            }
            return Ok(count);
        }
        end += n;
    }
}

/// Request/reply latency with a child process, then with one thread hop
/// inside the child (tetherd's shape: connection task, then writer thread).
fn round_trip(dir: &Path, trips: usize) -> Result<Vec<Row>, BoxError> {
    let direct = echo_times(&dir.join("echo.sock"), trips, false)?;
    let hop = echo_times(&dir.join("echo-hop.sock"), trips, true)?;
    Ok(vec![
        Row {
            floor: Floor::RoundTrip,
            name: "round trip 300 B",
            figure: Figure::latency(direct),
        },
        Row {
            floor: Floor::RoundTrip,
            name: "round trip 300 B + thread hop",
            figure: Figure::latency(hop),
        },
    ])
}

/// Milliseconds per round trip to a fresh echo server on `socket`.
fn echo_times(socket: &Path, trips: usize, hop: bool) -> Result<Vec<f64>, BoxError> {
    let mut server = EchoServer::start(socket, hop)?;
    let mut stream = server.connect(socket, Duration::from_secs(10))?;
    let warmup = trips / 10;
    let mut request = [0u8; MESSAGE];
    let mut reply = [0u8; MESSAGE];
    let mut times = Vec::with_capacity(trips);
    for i in 0..warmup + trips {
        request[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let started = Instant::now();
        stream
            .write_all(&request)
            .map_err(|e| format!("round trip write: {e}"))?;
        stream
            .read_exact(&mut reply)
            .map_err(|e| format!("round trip read: {e}"))?;
        let elapsed = started.elapsed();
        if reply != request {
            return Err(format!("round trip {i}: the reply differs from the request").into());
        }
        if i >= warmup {
            times.push(ms(elapsed));
        }
    }
    // Closing the connection is the server's cue to exit.
    drop(stream);
    server.finish()?;
    Ok(times)
}

/// This executable started as an echo server; killed when dropped, however
/// the measurement ends.
#[derive(Debug)]
struct EchoServer(Child);

impl EchoServer {
    fn start(socket: &Path, hop: bool) -> Result<EchoServer, BoxError> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
        let mut command = Command::new(&exe);
        command
            .arg("--echo-server")
            .arg(socket)
            .stdin(Stdio::null())
            // Its stdout is not ours to share: it would corrupt `--json`.
            .stdout(Stdio::null());
        if hop {
            command.arg("--hop");
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        Ok(EchoServer(child))
    }

    /// Connects once the server listens, or fails if it exits first or is
    /// not listening within `patience`.
    fn connect(&mut self, socket: &Path, patience: Duration) -> Result<UnixStream, BoxError> {
        let deadline = Instant::now() + patience;
        loop {
            let error = match UnixStream::connect(socket) {
                Ok(stream) => return Ok(stream),
                Err(e) => e,
            };
            let exited = self
                .0
                .try_wait()
                .map_err(|e| format!("cannot check on the echo server: {e}"))?;
            if let Some(status) = exited {
                return Err(format!("the echo server exited ({status}) before accepting").into());
            }
            if Instant::now() >= deadline {
                return Err(format!("cannot connect to {}: {error}", socket.display()).into());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the server to exit and checks that it succeeded.
    fn finish(&mut self) -> Result<(), BoxError> {
        let status = self
            .0
            .wait()
            .map_err(|e| format!("cannot wait for the echo server: {e}"))?;
        if !status.success() {
            return Err(format!("the echo server failed ({status})").into());
        }
        Ok(())
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The child half of `round-trip`: accepts one connection on `socket` and
/// echoes each message until the client closes it.
fn echo_server(socket: &Path, hop: bool) -> Result<(), BoxError> {
    let listener =
        UnixListener::bind(socket).map_err(|e| format!("cannot bind {}: {e}", socket.display()))?;
    let (stream, _) = listener
        .accept()
        .map_err(|e| format!("cannot accept on {}: {e}", socket.display()))?;
    if hop {
        echo_through_thread(stream)
    } else {
        echo(stream)
    }
}

fn echo(mut stream: UnixStream) -> Result<(), BoxError> {
    let mut message = [0u8; MESSAGE];
    while read_message(&mut stream, &mut message).map_err(|e| format!("echo read: {e}"))? {
        stream
            .write_all(&message)
            .map_err(|e| format!("echo write: {e}"))?;
    }
    Ok(())
}

/// Each message goes to a second thread and comes back before the reply is
/// written, as a request goes from tetherd's connection task to its writer
/// thread and back.
fn echo_through_thread(mut stream: UnixStream) -> Result<(), BoxError> {
    let (to_worker, worker_inbox) = mpsc::channel::<Vec<u8>>();
    let (to_connection, connection_inbox) = mpsc::channel::<Vec<u8>>();
    let worker = thread::spawn(move || {
        for message in worker_inbox {
            if to_connection.send(message).is_err() {
                break;
            }
        }
    });
    let mut message = vec![0u8; MESSAGE];
    while read_message(&mut stream, &mut message).map_err(|e| format!("echo read: {e}"))? {
        to_worker
            .send(message)
            .map_err(|_| "the echo worker thread stopped")?;
        message = connection_inbox
            .recv()
            .map_err(|_| "the echo worker thread stopped")?;
        stream
            .write_all(&message)
            .map_err(|e| format!("echo write: {e}"))?;
    }
    drop(to_worker);
    worker
        .join()
        .map_err(|_| "the echo worker thread panicked")?;
    Ok(())
}

/// Fills `message`; false when the client has closed the connection.
fn read_message(stream: &mut UnixStream, message: &mut [u8]) -> io::Result<bool> {
    match stream.read_exact(message) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}
