//! Reading the records back: the replay when the store opens, the checks
//! for damage before anything is written, and reading on past damage for
//! `tetherd repair`.

use std::io;

use super::{Layout, Wal, HEADER_LEN};
use crate::{Error, Result};

/// Where a replay stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// The number of the last record read, or the applied one if that is
    /// further.
    pub last: u64,
    /// Where the records read end.
    pub end: u64,
    /// The record the replay stopped at when it failed its check although
    /// the record after it passes: (its number, where it starts). A
    /// crash can leave that (the kernel wrote the later record's page
    /// first, and neither was synced, so neither was acknowledged), and so
    /// can damage to a synced log: the store warns either way.
    pub stopped_before: Option<(u64, u64)>,
    /// The record due when the replay ended, when it was there but failed
    /// its check (its number, where it starts), rather than the log simply
    /// ending (zeros, the file's end, an older record). A crash that cut
    /// the last write short leaves that; so does damage, which then shows
    /// as a valid later record somewhere after it ([`Wal::find_valid_after`]).
    pub ended_at_damage: Option<(u64, u64)>,
}

/// What the bytes at a position of the log hold.
pub(super) enum Record {
    /// A record whose check passes.
    Valid { number: u64, end: u64 },
    /// A header that could start a record (its length fits the log) but
    /// whose body is cut short or fails the check.
    Damaged { number: u64, end: u64 },
    /// Zeros, the end of the file, or a length past the log's end.
    None,
}

/// Reading the records back (see [`crate::wal`], "Recovery").
impl Wal {
    /// Shows `apply` each record numbered above `applied`, in order, as
    /// (its number, its position, its body) (see [`crate::wal`],
    /// "Recovery", for where the log ends). `from`: wrapping, where the
    /// store's durable mark says the record after `applied` went (it must
    /// be there, or at the start of the file's next lap); `None` reads
    /// from the file's start, skipping records the store holds.
    pub fn replay(
        &self,
        applied: u64,
        from: Option<u64>,
        mut apply: impl FnMut(u64, u64, &[u8]) -> Result<()>,
    ) -> Result<Replayed> {
        let layout = Layout::of_resume(from);
        let mut pos = from.unwrap_or(0);
        let mut last: Option<u64> = None;
        let mut body = Vec::new();
        let mut next_lap = Vec::new();
        let mut stopped_before = None;
        let mut ended_at_damage = None;
        loop {
            let due = last.map_or(applied + 1, |l| l + 1);
            let mut physical = layout.file_offset(pos, self.capacity);
            let mut found = self.read_record(physical, &mut body)?;
            if layout == Layout::Wrapping
                && physical != 0
                && !matches!(found, Record::Valid { number, .. } if number == due)
            {
                // A record that did not fit before the file's end went to
                // its start.
                if let Record::Valid { number, end } = self.read_record(0, &mut next_lap)? {
                    if number == due {
                        pos = self.next_lap(pos);
                        physical = 0;
                        found = Record::Valid { number, end };
                        std::mem::swap(&mut body, &mut next_lap);
                    }
                }
            }
            let (number, end) = match found {
                Record::Valid { number, .. } if last.is_some() && number != due => break,
                // Wrapping, an older record where the next was due is
                // the log's end.
                Record::Valid { number, .. } if layout == Layout::Wrapping && number < due => break,
                Record::Valid { number, end } => (number, end),
                Record::Damaged { number, end } => {
                    // Reported only when it was the record due and the
                    // next one follows it: otherwise it is the log's end.
                    if number == due
                        && matches!(self.read_record(end, &mut body)?,
                            Record::Valid { number: next, .. } if next == number + 1)
                    {
                        stopped_before = Some((number, pos));
                    } else if number == due {
                        ended_at_damage = Some((number, pos));
                    }
                    break;
                }
                Record::None => break,
            };
            if last.is_none() && number > applied + 1 {
                return Err(Error::CorruptStore {
                    path: self.path.to_path_buf(),
                    detail: format!(
                        "the log starts at record {number}, but the store holds records \
                         through {applied} only: records are missing"
                    ),
                    source: None,
                });
            }
            if number > applied {
                apply(number, pos, &body)?;
            }
            last = Some(number);
            pos += end - physical;
        }
        Ok(Replayed {
            last: last.map_or(applied, |l| l.max(applied)),
            end: pos,
            stopped_before,
            ended_at_damage,
        })
    }

    /// Reads the record at `pos` into `body`.
    pub(super) fn read_record(&self, pos: u64, body: &mut Vec<u8>) -> Result<Record> {
        let mut header = [0u8; HEADER_LEN];
        if pos + HEADER_LEN as u64 > self.capacity || !self.read_exact_at(&mut header, pos)? {
            return Ok(Record::None);
        }
        let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let mut number_bytes = [0u8; 8];
        number_bytes.copy_from_slice(&header[8..16]);
        let number = u64::from_le_bytes(number_bytes);
        let end = pos + HEADER_LEN as u64 + u64::from(body_len);
        if body_len == 0 || end > self.capacity {
            return Ok(Record::None);
        }
        body.resize(body_len as usize, 0);
        if !self.read_exact_at(body, pos + HEADER_LEN as u64)? {
            return Ok(Record::Damaged { number, end });
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&number_bytes);
        hasher.update(body);
        if hasher.finalize() != crc {
            return Ok(Record::Damaged { number, end });
        }
        Ok(Record::Valid { number, end })
    }

    /// Reads `buf.len()` bytes at `pos`; false at the end of the file.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> Result<bool> {
        match self.file.read_exact_at(buf, pos) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(Error::io(
                format!("cannot read the log {}", self.path.display()),
                e,
            )),
        }
    }
}

/// Checks for damage (see `crate::store::verify`), reading only.
impl Wal {
    /// The bytes the log file holds.
    pub fn file_len(&self) -> u64 {
        self.filled
    }

    /// Where the byte at log position `pos` is in the file, laid out as
    /// `layout` (as the store's marks say: checks run before
    /// [`Wal::prepare`] decides it for this run).
    pub fn file_offset(&self, pos: u64, layout: Layout) -> u64 {
        layout.file_offset(pos, self.capacity)
    }

    /// Searches the file, from just after the record at position `pos` to
    /// where it wraps back to it (or its end), for a record that passes
    /// its check and is numbered above `above` (and not absurdly so):
    /// (its number, its byte in the file). Only asked after a record
    /// failed its check: a valid later record after it means the failed
    /// one was damaged rather than cut short by a crash, even when the
    /// damage hid where the next record starts. Reads the file in pieces;
    /// a candidate header is checked in full only when its number and
    /// length are plausible.
    pub fn find_valid_after(
        &self,
        pos: u64,
        above: u64,
        layout: Layout,
    ) -> Result<Option<(u64, u64)>> {
        self.find_valid_from(self.file_offset(pos, layout) + 1, above, layout)
    }

    /// [`Wal::find_valid_after`] from the file's byte `start` on, that
    /// byte included.
    fn find_valid_from(
        &self,
        start: u64,
        above: u64,
        layout: Layout,
    ) -> Result<Option<(u64, u64)>> {
        let end = self.filled.min(self.capacity);
        let ranges = match layout {
            Layout::Flat => vec![(start, end)],
            Layout::Wrapping => vec![(start, end), (0, start.saturating_sub(1))],
        };
        let mut piece = vec![0u8; SCAN_PIECE + HEADER_LEN];
        let mut body = Vec::new();
        for (from, to) in ranges {
            let mut at = from;
            while at + HEADER_LEN as u64 <= to {
                let len = ((to - at) as usize).min(piece.len());
                if !self.read_exact_at(&mut piece[..len], at)? {
                    break;
                }
                let last_start = len.saturating_sub(HEADER_LEN).min(SCAN_PIECE - 1);
                let mut i = 0;
                while i <= last_start {
                    let header = &piece[i..i + HEADER_LEN];
                    if header[..4] == [0; 4] {
                        // A record's length is not 0, so one of its first
                        // four bytes is not either: skip zeros (a log
                        // filled ahead is mostly zeros) to three bytes
                        // before the next byte that is not.
                        let next = piece[i..=last_start + 3]
                            .iter()
                            .position(|&b| b != 0)
                            .map_or(last_start + 1, |n| i + n.saturating_sub(3).max(1));
                        i = next;
                        continue;
                    }
                    let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                    let mut number = [0u8; 8];
                    number.copy_from_slice(&header[8..16]);
                    let number = u64::from_le_bytes(number);
                    let plausible = body_len > 0
                        && number > above
                        && number - above <= PLAUSIBLE_NUMBERS_AHEAD
                        && at + i as u64 + HEADER_LEN as u64 + u64::from(body_len) <= to;
                    if plausible {
                        let candidate = at + i as u64;
                        if let Record::Valid { number, .. } =
                            self.read_record(candidate, &mut body)?
                        {
                            return Ok(Some((number, candidate)));
                        }
                    }
                    i += 1;
                }
                at += SCAN_PIECE as u64;
            }
        }
        Ok(None)
    }

    /// Wrapping: checks that the records from `tail` (where the oldest
    /// chunk the store reads from the log is) up to `resume` (where the
    /// record after the last one the store holds goes) are whole and
    /// numbered one after another: the store reads their chunks. A record
    /// that did not fit before the file's end went to its start, leaving
    /// stale bytes behind it, which are not damage. Returns the byte of
    /// the file where a record is missing or fails its check.
    pub fn verify_kept(&self, tail: u64, resume: u64) -> Result<Option<u64>> {
        let mut at = tail;
        let mut expected: Option<u64> = None;
        let mut body = Vec::new();
        while at < resume {
            let physical = at % self.capacity;
            match self.read_record(physical, &mut body)? {
                Record::Valid { number, end } if expected.is_none_or(|e| e == number) => {
                    expected = Some(number + 1);
                    at += end - physical;
                }
                _ => {
                    // Stale bytes up to the file's end, if the next
                    // record is at the next lap's start.
                    let next = self.next_lap(at);
                    if next > resume {
                        return Ok(Some(physical));
                    }
                    match self.read_record(0, &mut body)? {
                        Record::Valid { number, end } if expected.is_none_or(|e| e == number) => {
                            expected = Some(number + 1);
                            at = next + end;
                        }
                        _ => return Ok(Some(physical)),
                    }
                }
            }
        }
        Ok(None)
    }
}

/// Records lost to damage, as [`Wal::salvage`] found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostRecords {
    /// The first record number missing.
    pub first: u64,
    /// The last record number missing.
    pub last: u64,
    /// The bytes of the log they took: the most their frames can have been.
    pub bytes: u64,
}

/// What [`Wal::salvage`] read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Salvaged {
    /// The number of the last record read, or the applied one.
    pub last: u64,
    /// The records that were lost between those read, in order.
    pub lost: Vec<LostRecords>,
}

/// Reading past damage (`tetherd repair`).
impl Wal {
    /// Hands `apply` every record numbered above `applied` that passes its
    /// check, in order, as [`Wal::replay`] does from `from`, but going on
    /// past damage: after a record that fails its check (or where the
    /// log seems to end), the file is searched for a later record, and
    /// reading goes on from there. The records skipped are returned. A
    /// failing last record with nothing valid after it is a torn tail, as
    /// at start-up, and is not counted lost.
    pub fn salvage(
        &self,
        applied: u64,
        from: Option<u64>,
        mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Salvaged> {
        let mut salvaged = Salvaged {
            last: applied,
            lost: Vec::new(),
        };
        let mut from = from;
        loop {
            // Once a later record was found, reading goes on from it as
            // from a durable mark: wrapping.
            let layout = Layout::of_resume(from);
            let start = from.unwrap_or(0);
            // Where reading stopped, and the first byte that may hold a
            // later record.
            let (stopped, search) =
                match self.replay(salvaged.last, from, |number, _, body| apply(number, body)) {
                    Ok(replayed) => {
                        salvaged.last = replayed.last;
                        let at = replayed
                            .stopped_before
                            .or(replayed.ended_at_damage)
                            .map_or(replayed.end, |(_, at)| at);
                        let at = self.file_offset(at, layout);
                        (at, at + 1)
                    }
                    // The first record there is numbered past the one due:
                    // the records between are missing.
                    Err(Error::CorruptStore { .. }) => {
                        let at = self.file_offset(start, Layout::Wrapping);
                        (at, at)
                    }
                    Err(e) => return Err(e),
                };
            let Some((number, at)) = self.find_valid_from(search, salvaged.last, layout)? else {
                return Ok(salvaged);
            };
            let bytes = if at > stopped {
                at - stopped
            } else {
                self.capacity - stopped + at
            };
            if number > salvaged.last + 1 {
                salvaged.lost.push(LostRecords {
                    first: salvaged.last + 1,
                    last: number - 1,
                    bytes,
                });
            }
            salvaged.last = number - 1;
            from = Some(at);
        }
    }
}

/// How much of the file [`Wal::find_valid_after`] reads at a time.
const SCAN_PIECE: usize = 1024 * 1024;

/// How far above the record that failed a later record's number may be
/// and still be taken for one (a header's number field is 8 bytes: any
/// bytes at all would otherwise pass as a number above it).
const PLAUSIBLE_NUMBERS_AHEAD: u64 = 1 << 32;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    use super::*;
    use crate::store_io::OsOpener;
    use crate::wal::tests::{chunk, five_records, read_all, record, PAYLOAD};
    use crate::wal::Op;

    #[test]
    fn records_come_back_in_order_from_above_the_applied_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.wal");
        let mut wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        wal.restart(5).unwrap();
        for i in 0..4u64 {
            let payload = vec![i as u8; 100];
            let mut r = record(&[chunk(1, i * 10 + 1, &payload), Op::NextStreamId(i)]);
            wal.append(&mut r).unwrap();
        }
        let wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        assert_eq!(
            read_all(&wal, 4).unwrap(),
            (8, vec![(5, 2), (6, 2), (7, 2), (8, 2)])
        );
        assert_eq!(read_all(&wal, 6).unwrap(), (8, vec![(7, 2), (8, 2)]));
        assert_eq!(read_all(&wal, 8).unwrap(), (8, vec![]));
        assert_eq!(read_all(&wal, 20).unwrap(), (20, vec![]));
        let err = read_all(&wal, 2).unwrap_err();
        assert!(
            err.to_string().contains("starts at record 5") && err.to_string().contains("through 2"),
            "{err}"
        );
    }

    #[test]
    fn salvage_reads_on_past_damaged_records_and_names_them() {
        let (_dir, path, written) = five_records();
        drop(written);
        let record_len = (HEADER_LEN + wal_body_len()) as u64;
        let flip = |at: u64| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, at).unwrap();
            file.write_all_at(&[byte[0] ^ 0xff], at).unwrap();
        };
        // Record 2's body and record 4's length: both fail, and the
        // records after each are found by searching on.
        flip(record_len + HEADER_LEN as u64 + 10);
        flip(3 * record_len + 1);
        let wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        let mut seen = Vec::new();
        let salvaged = wal
            .salvage(0, None, |number, _| {
                seen.push(number);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, vec![1, 3, 5]);
        assert_eq!(
            salvaged,
            Salvaged {
                last: 5,
                lost: vec![
                    LostRecords {
                        first: 2,
                        last: 2,
                        bytes: record_len
                    },
                    LostRecords {
                        first: 4,
                        last: 4,
                        bytes: record_len
                    },
                ],
            }
        );
        // From above the applied record, nothing before it counts.
        let salvaged = wal.salvage(3, None, |_, _| Ok(())).unwrap();
        assert_eq!(salvaged.lost.len(), 1);
        assert_eq!(salvaged.last, 5);
    }

    /// The body length of each of [`five_records`]' records.
    fn wal_body_len() -> usize {
        record(&[chunk(1, 0, &PAYLOAD)]).len() - HEADER_LEN
    }

    /// Flips one byte of the body of the `index`th of [`five_records`].
    fn damage_record(path: &Path, wal: &Wal, index: u64) -> u64 {
        let all = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(all.last, 5);
        let at = all.end / 5 * index;
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(&[0xff], at + HEADER_LEN as u64 + 5)
            .unwrap();
        at
    }

    #[test]
    fn a_damaged_record_with_a_good_one_after_it_is_reported() {
        let (_dir, path, wal) = five_records();
        let at = damage_record(&path, &wal, 2);
        let replayed = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(replayed.last, 2);
        assert_eq!(replayed.end, at);
        assert_eq!(replayed.stopped_before, Some((3, at)));
    }

    #[test]
    fn a_damaged_last_record_is_a_torn_tail_and_not_reported() {
        let (_dir, path, wal) = five_records();
        let at = damage_record(&path, &wal, 4);
        let replayed = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(
            replayed,
            Replayed {
                last: 4,
                end: at,
                stopped_before: None,
                ended_at_damage: Some((5, at)),
            }
        );
    }

    #[test]
    fn a_torn_or_stale_tail_ends_the_log() {
        let (_dir, path, mut wal) = five_records();
        // Two new records over the old ones, as after a crash whose replay
        // went on from the start.
        wal.resume(Replayed {
            last: 5,
            end: 0,
            stopped_before: None,
            ended_at_damage: None,
        });
        wal.append(&mut record(&[chunk(1, 50, &PAYLOAD)])).unwrap();
        wal.append(&mut record(&[chunk(1, 51, &PAYLOAD)])).unwrap();
        // The old third record follows them, numbered 3: not 8.
        assert_eq!(read_all(&wal, 5).unwrap(), (7, vec![(6, 1), (7, 1)]));

        // A torn second record: its last byte never made it.
        let second_end = wal.pos;
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xAA], second_end - 1).unwrap();
        assert_eq!(read_all(&wal, 5).unwrap(), (6, vec![(6, 1)]));
        // Zeros where nothing was written end it too.
        file.set_len(0).unwrap();
        file.set_len(4096).unwrap();
        assert_eq!(read_all(&wal, 5).unwrap(), (5, vec![]));
    }
}
