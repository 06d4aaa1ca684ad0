//! Splitting `tether publish`'s input into lines.
//!
//! Input is read in large chunks, never a syscall per line. Each line is a
//! zero-copy slice of the chunk it came from (only a line that straddles two
//! reads is copied, when the buffer grows), without its `\n`. Nothing else
//! is stripped: a `\r` before the `\n` stays in the payload. A last line
//! without a newline still counts; an empty input has no lines.

use std::io::Read;

use bytes::{Bytes, BytesMut};
use tether::{Error, Result};

/// Bytes asked for per read.
pub const CHUNK: usize = 256 * 1024;

/// Reads `src` to its end and hands complete lines to `emit` in batches,
/// one batch per read. `emit` returns `false` to stop early. A line longer
/// than `max_line` bytes is an error naming its (1-based) number; it is
/// detected without buffering more than `max_line` plus one chunk.
pub fn read_lines<R: Read>(
    mut src: R,
    max_line: usize,
    mut emit: impl FnMut(Vec<Bytes>) -> bool,
) -> Result<()> {
    let mut buf = BytesMut::with_capacity(CHUNK);
    // Reads land in a plain buffer and are copied into `buf`: one memcpy
    // per read is cheaper than zeroing `buf`'s spare room before each read,
    // which safe code would need.
    let mut landing = vec![0u8; CHUNK];
    let mut lines_done: u64 = 0;
    // Bytes at the start of `buf` already known to hold no newline, so a
    // long line is not rescanned after every read.
    let mut scanned = 0;
    loop {
        let n = read_some(&mut src, &mut landing).map_err(|source| Error::Local {
            context: "cannot read stdin".into(),
            source,
        })?;
        buf.extend_from_slice(&landing[..n]);
        if n == 0 {
            if buf.is_empty() {
                return Ok(());
            }
            check_length(buf.len(), max_line, lines_done + 1)?;
            emit(vec![buf.split().freeze()]);
            return Ok(());
        }
        let mut batch = Vec::new();
        while let Some(offset) = buf[scanned..].iter().position(|&b| b == b'\n') {
            let end = scanned + offset;
            check_length(end, max_line, lines_done + 1)?;
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            batch.push(line.freeze());
            lines_done += 1;
            scanned = 0;
        }
        scanned = buf.len();
        check_length(buf.len(), max_line, lines_done + 1)?;
        if !batch.is_empty() && !emit(batch) {
            return Ok(());
        }
    }
}

fn read_some<R: Read>(src: &mut R, into: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match src.read(into) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn check_length(len: usize, max: usize, line: u64) -> Result<()> {
    if len > max {
        return Err(Error::LineTooLong { line, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A reader that returns at most `step` bytes per read, to exercise
    /// lines that straddle reads.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn split(data: &[u8], step: usize, max: usize) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        read_lines(Trickle { data, step }, max, |batch| {
            out.extend(batch.into_iter().map(|b| b.to_vec()));
            true
        })?;
        Ok(out)
    }

    fn lines(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn lines_lose_their_newline_and_nothing_else() {
        let got = split(b"a\nbb\n\nccc\n", CHUNK, 100).unwrap();
        assert_eq!(got, lines(&["a", "bb", "", "ccc"]));
    }

    #[test]
    fn a_last_line_without_newline_still_counts() {
        assert_eq!(split(b"a\nb", CHUNK, 100).unwrap(), lines(&["a", "b"]));
        assert_eq!(split(b"only", CHUNK, 100).unwrap(), lines(&["only"]));
    }

    #[test]
    fn empty_input_has_no_lines_and_a_lone_newline_has_one_empty_line() {
        assert_eq!(split(b"", CHUNK, 100).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(split(b"\n", CHUNK, 100).unwrap(), lines(&[""]));
    }

    #[test]
    fn crlf_is_left_intact() {
        let got = split(b"a\r\nb\r\n", CHUNK, 100).unwrap();
        assert_eq!(got, lines(&["a\r", "b\r"]));
    }

    #[test]
    fn lines_straddling_reads_are_reassembled() {
        let mut data = Vec::new();
        let mut expected = Vec::new();
        for i in 0..500 {
            let line = format!("line number {i} {}", "x".repeat(i % 37));
            data.extend_from_slice(line.as_bytes());
            data.push(b'\n');
            expected.push(line.into_bytes());
        }
        for step in [1, 2, 3, 7, 64, 1000, CHUNK] {
            assert_eq!(split(&data, step, 1000).unwrap(), expected, "step {step}");
        }
    }

    #[test]
    fn large_inputs_come_in_few_batches() {
        let data = "y".repeat(255) + "\n";
        let data = data.repeat(10_000);
        let mut batches = 0;
        let mut count = 0;
        read_lines(data.as_bytes(), 1000, |batch| {
            batches += 1;
            count += batch.len();
            true
        })
        .unwrap();
        assert_eq!(count, 10_000);
        assert!(batches <= 20, "{batches} batches for 2.5 MB");
    }

    #[test]
    fn an_overlong_line_is_named_by_its_number() {
        let err = split(b"ok\nfine\ntoo long line\nok\n", CHUNK, 8).unwrap_err();
        assert!(
            matches!(err, Error::LineTooLong { line: 3, max: 8 }),
            "{err:?}"
        );
        // Also when the line has no end yet and is read in small pieces.
        let err = split(b"ok\nxxxxxxxxxxxxxxxxxxxx", 2, 8).unwrap_err();
        assert!(matches!(err, Error::LineTooLong { line: 2, .. }), "{err:?}");
        // A line of exactly the maximum is fine.
        assert_eq!(split(b"12345678\n", 3, 8).unwrap(), lines(&["12345678"]));
    }

    #[test]
    fn stopping_early_is_honoured() {
        let mut calls = 0;
        read_lines(
            Trickle {
                data: b"a\nb\nc\n",
                step: 2,
            },
            10,
            |_| {
                calls += 1;
                false
            },
        )
        .unwrap();
        assert_eq!(calls, 1);
    }
}
