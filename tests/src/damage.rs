//! Damage done on purpose to a stopped daemon's store files, and proof
//! that nothing changed them afterwards: for the tests of "damage is
//! never silent".
//!
//! * [`records`] parses the write-ahead log (`tether.wal`) as the daemon
//!   writes it: `[body length u32 LE][CRC-32 of number and body u32 LE]
//!   [number u64 LE][body]`, one record after another from byte 0, so
//!   that a test can damage one chosen record.
//!   [`records_holding`] finds the records that logged given bytes.
//! * [`flip_byte`], [`zero`] and [`truncate`] damage a file in place.
//! * [`StateSnapshot`] remembers every byte of the state directory's
//!   files (but the lock file, which each start writes its pid to) and
//!   asserts later that none of them changed, no file appeared and none
//!   went away.
//! * [`start_refused`] and [`check`] run `tetherd` and `tetherd check` on
//!   a sandbox's store to completion.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli::{self, Output};
use crate::daemon;
use crate::sandbox::Sandbox;
use crate::text::lines;

/// The store file in a state directory.
pub const STORE_FILE: &str = "tether.redb";

/// The write-ahead log beside it.
pub const LOG_FILE: &str = "tether.wal";

/// The instance lock: every start writes its pid to it, even one that
/// then refuses a damaged store.
pub const LOCK_FILE: &str = "tetherd.lock";

/// Bytes before a record's body.
pub const HEADER_LEN: u64 = 16;

/// How long a `tetherd` that refuses its store, or a `tetherd check`, may
/// take (debug builds read the log's 256 MiB byte by byte looking for a
/// valid record after a failing one).
const DEADLINE: Duration = Duration::from_secs(180);

/// One record of the log, where it is in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The byte of the file where its header starts.
    pub offset: u64,
    /// Its number (one above the record before it).
    pub number: u64,
    /// The length of its body.
    pub body_len: u64,
}

impl Record {
    /// The byte of the file where its body starts.
    pub fn body_offset(&self) -> u64 {
        self.offset + HEADER_LEN
    }

    /// The byte of the file just after it.
    pub fn end(&self) -> u64 {
        self.body_offset() + self.body_len
    }
}

/// The log's records from byte 0 while each passes its check and is
/// numbered one above the one before: on a log that has not wrapped
/// its file yet, every record written, oldest first.
pub fn records(log: &Path) -> Vec<Record> {
    let file = File::open(log).unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
    let len = file.metadata().unwrap().len();
    let mut out: Vec<Record> = Vec::new();
    let mut at = 0u64;
    let mut body = Vec::new();
    while at + HEADER_LEN <= len {
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut header, at)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", log.display()));
        let body_len = u64::from(u32::from_le_bytes(header[0..4].try_into().unwrap()));
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let number = u64::from_le_bytes(header[8..16].try_into().unwrap());
        if body_len == 0 || at + HEADER_LEN + body_len > len {
            break;
        }
        if out.last().is_some_and(|last| last.number + 1 != number) {
            break;
        }
        body.resize(body_len as usize, 0);
        file.read_exact_at(&mut body, at + HEADER_LEN)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", log.display()));
        let mut hasher = Crc32::new();
        hasher.update(&header[8..16]);
        hasher.update(&body);
        if hasher.finish() != crc {
            break;
        }
        out.push(Record {
            offset: at,
            number,
            body_len,
        });
        at += HEADER_LEN + body_len;
    }
    out
}

/// The body of `record` as the file holds it now.
pub fn body(log: &Path, record: &Record) -> Vec<u8> {
    let mut body = vec![0u8; record.body_len as usize];
    open_rw(log)
        .read_exact_at(&mut body, record.body_offset())
        .unwrap_or_else(|e| {
            panic!(
                "cannot read record {} of {}: {e}",
                record.number,
                log.display()
            )
        });
    body
}

/// How many of the log's [`records`] hold `needle` in their body: a
/// change the daemon logged carries its bytes there as given.
pub fn records_holding(log: &Path, needle: &[u8]) -> usize {
    records(log)
        .iter()
        .filter(|record| {
            body(log, record)
                .windows(needle.len())
                .any(|window| window == needle)
        })
        .count()
}

/// Inverts some bits of the byte at `offset` (XOR 0x5a), in place.
pub fn flip_byte(path: &Path, offset: u64) {
    let file = open_rw(path);
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset)
        .unwrap_or_else(|e| panic!("cannot read byte {offset} of {}: {e}", path.display()));
    byte[0] ^= 0x5a;
    file.write_all_at(&byte, offset)
        .unwrap_or_else(|e| panic!("cannot write byte {offset} of {}: {e}", path.display()));
    file.sync_all().unwrap();
}

/// Overwrites the bytes `from..to` with zeros, the file's length kept: what
/// a crash in the middle of a write over zeros leaves.
pub fn zero(path: &Path, from: u64, to: u64) {
    let file = open_rw(path);
    let zeros = vec![0u8; (to - from) as usize];
    file.write_all_at(&zeros, from)
        .unwrap_or_else(|e| panic!("cannot zero {}: {e}", path.display()));
    file.sync_all().unwrap();
}

/// Cuts the file to `len` bytes.
pub fn truncate(path: &Path, len: u64) {
    let file = open_rw(path);
    file.set_len(len)
        .unwrap_or_else(|e| panic!("cannot truncate {}: {e}", path.display()));
    file.sync_all().unwrap();
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// Runs `tetherd` on the sandbox's socket and state directory to
/// completion: for a store it must refuse, so it exits by itself.
pub fn start_refused(sb: &Sandbox) -> Output {
    let mut cmd = daemon::command(&sb.socket(), &sb.state_dir());
    clean_env(&mut cmd);
    cli::run(cmd, b"", DEADLINE)
}

/// Runs `tetherd check` on the sandbox's state directory (and socket, for
/// when a daemon runs there) to completion.
pub fn check(sb: &Sandbox) -> Output {
    tetherd_command(sb, "check")
}

/// Runs `tetherd repair` on the sandbox's state directory to completion.
pub fn repair(sb: &Sandbox) -> Output {
    tetherd_command(sb, "repair")
}

/// Runs `tetherd COMMAND` with the sandbox's state directory and socket
/// to completion.
fn tetherd_command(sb: &Sandbox, command: &str) -> Output {
    let mut cmd = Command::new(crate::bins::tetherd());
    cmd.arg(command)
        .arg("--state-dir")
        .arg(sb.state_dir())
        .arg("--socket")
        .arg(sb.socket());
    clean_env(&mut cmd);
    cli::run(cmd, b"", DEADLINE)
}

/// A sandbox whose stopped daemon stored lines 1 to `frames` of `stream`
/// (line `n` is seq `n`) from four publishes, so that the log holds a few
/// records.
pub fn small_store(stream: &str, frames: u64) -> Sandbox {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon();
    for part in 0..4 {
        let first = part * frames / 4 + 1;
        sb.publish(stream, &lines(first..=first + frames / 4 - 1));
    }
    crate::raw::assert_stored(&sb.socket(), stream, frames);
    assert!(d.terminate().success());
    sb
}

/// The sandbox's flags must be the only source of paths and settings.
fn clean_env(cmd: &mut Command) {
    for var in [
        "TETHER_SOCKET",
        "TETHER_STATE_DIR",
        "TETHER_CONFIG",
        "TETHER_LOG_CAPACITY",
    ] {
        cmd.env_remove(var);
    }
}

/// Every byte of every file in a state directory but the lock file.
#[derive(Debug)]
pub struct StateSnapshot {
    dir: PathBuf,
    files: BTreeMap<String, FileSnapshot>,
}

/// A file's length and contents. The log is 256 MiB, mostly zeros: only
/// the blocks holding something else are kept.
#[derive(Debug, PartialEq, Eq)]
struct FileSnapshot {
    len: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

/// The unit [`FileSnapshot`] keeps or leaves out.
const BLOCK: usize = 64 * 1024;

impl StateSnapshot {
    /// Reads the files of `dir` now.
    pub fn take(dir: &Path) -> Self {
        let mut files = BTreeMap::new();
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == LOCK_FILE || entry.path().is_dir() {
                continue;
            }
            files.insert(name, FileSnapshot::read(&entry.path()));
        }
        Self {
            dir: dir.to_owned(),
            files,
        }
    }

    /// Asserts that the directory holds the same files with the same bytes
    /// as when the snapshot was taken; `after` says what ran meanwhile.
    pub fn assert_unchanged(&self, after: &str) {
        self.assert_same_as(&self.dir, after);
    }

    /// Asserts that `dir` holds the files of the snapshot, byte for byte
    /// (a copy of them); `after` says what made it.
    pub fn assert_same_as(&self, dir: &Path, after: &str) {
        let now = Self::take(dir);
        let names = |s: &Self| s.files.keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            names(&now),
            names(self),
            "{after} changed which files {} holds",
            self.dir.display()
        );
        for (name, before) in &self.files {
            let now = &now.files[name];
            assert_eq!(
                now.len,
                before.len,
                "{after} changed the length of {name} in {}",
                self.dir.display()
            );
            if now != before {
                let first = before
                    .blocks
                    .keys()
                    .chain(now.blocks.keys())
                    .copied()
                    .filter(|at| before.blocks.get(at) != now.blocks.get(at))
                    .min()
                    .unwrap_or(0);
                panic!(
                    "{after} changed {name} in {} (first in the {} KiB from byte {first})",
                    self.dir.display(),
                    BLOCK / 1024
                );
            }
        }
    }
}

impl FileSnapshot {
    fn read(path: &Path) -> Self {
        let mut file =
            File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        let mut blocks = BTreeMap::new();
        let mut len = 0u64;
        let mut block = vec![0u8; BLOCK];
        loop {
            let mut filled = 0;
            while filled < BLOCK {
                match file.read(&mut block[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => panic!("cannot read {}: {e}", path.display()),
                }
            }
            if filled == 0 {
                break;
            }
            if block[..filled].iter().any(|&b| b != 0) {
                blocks.insert(len, block[..filled].to_vec());
            }
            len += filled as u64;
            if filled < BLOCK {
                break;
            }
        }
        Self { len, blocks }
    }
}

/// CRC-32 (IEEE 802.3, reflected), as the log's records carry it.
#[derive(Debug)]
struct Crc32 {
    table: [u32; 256],
    state: u32,
}

impl Crc32 {
    fn new() -> Self {
        let mut table = [0u32; 256];
        for (n, entry) in (0u32..).zip(table.iter_mut()) {
            let mut c = n;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *entry = c;
        }
        Self { table, state: !0 }
    }

    fn update(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            let index = ((self.state ^ u32::from(byte)) & 0xff) as usize;
            self.state = (self.state >> 8) ^ self.table[index];
        }
    }

    fn finish(&self) -> u32 {
        !self.state
    }
}

/// The lowest and highest `line-NNNNNNN` numbers in `bytes`: a record's
/// frames, by seq (line `n` is seq `n`).
pub fn line_numbers(bytes: &[u8]) -> (u64, u64) {
    let numbers: Vec<u64> = bytes
        .windows(12)
        .filter(|w| w.starts_with(b"line-") && w[5..].iter().all(u8::is_ascii_digit))
        .map(|w| std::str::from_utf8(&w[5..]).unwrap().parse().unwrap())
        .collect();
    let first = *numbers.iter().min().expect("the record holds no line");
    let last = *numbers.iter().max().unwrap();
    (first, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        let mut crc = Crc32::new();
        crc.update(b"1234");
        crc.update(b"56789");
        assert_eq!(crc.finish(), 0xcbf4_3926);
    }
}
