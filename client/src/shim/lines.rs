//! Splitting a worker's output pipe into line frames.
//!
//! Bytes are read into one buffer per pipe and cut into lines without their
//! `\n` (a `\r` before it stays, as in `tether publish`). A line longer than
//! the maximum is cut into pieces of exactly the maximum, never dropped; a
//! line of exactly the maximum is one frame. A piece is cut only once more
//! than the maximum has arrived without a newline, so a line that happens
//! to end on a piece boundary does not leave an empty frame behind. At end
//! of input the unterminated rest, if any, is one last frame.
//!
//! Lines are zero-copy slices of the buffer they were read into.

use bytes::{Bytes, BytesMut};

/// Cuts a byte stream into line frames. See the module docs.
#[derive(Debug)]
pub struct LineSplitter {
    buf: BytesMut,
    max_line: usize,
    /// Bytes at the start of `buf` already known to hold no newline, so a
    /// long line is not rescanned after every read.
    scanned: usize,
}

impl LineSplitter {
    /// A splitter whose frames hold at most `max_line` bytes (at least 1).
    pub fn new(max_line: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max_line: max_line.max(1),
            scanned: 0,
        }
    }

    /// The buffer to read into. Everything appended to it is input.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes received but not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete line or overlong piece, if the input holds one.
    pub fn next_frame(&mut self) -> Option<Bytes> {
        let limit = self.buf.len().min(self.max_line + 1);
        let from = self.scanned.min(limit);
        if let Some(offset) = self.buf[from..limit].iter().position(|&b| b == b'\n') {
            let end = from + offset;
            let mut line = self.buf.split_to(end + 1);
            line.truncate(end);
            self.scanned = 0;
            return Some(line.freeze());
        }
        if self.buf.len() > self.max_line {
            // More than the maximum without a newline: the line is too
            // long for one frame, so its first `max_line` bytes go now.
            self.scanned = 0;
            return Some(self.buf.split_to(self.max_line).freeze());
        }
        self.scanned = self.buf.len();
        None
    }

    /// At end of input: the unterminated last line, if there is one. Call
    /// after [`LineSplitter::next_frame`] has returned `None`.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.scanned = 0;
        if self.buf.is_empty() {
            return None;
        }
        // `next_frame` leaves at most `max_line` bytes behind.
        Some(self.buf.split().freeze())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Feeds `input` in pieces of `step` bytes and collects every frame.
    fn split(input: &[u8], step: usize, max: usize) -> Vec<Vec<u8>> {
        let mut splitter = LineSplitter::new(max);
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            splitter.buffer().extend_from_slice(piece);
            while let Some(frame) = splitter.next_frame() {
                out.push(frame.to_vec());
            }
        }
        out.extend(splitter.finish().map(|f| f.to_vec()));
        out
    }

    fn frames(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn lines_lose_their_newline_and_nothing_else() {
        for step in [1, 2, 3, 100] {
            let got = split(b"a\nbb\n\nc\r\n", step, 100);
            assert_eq!(got, frames(&["a", "bb", "", "c\r"]), "step {step}");
        }
    }

    #[test]
    fn the_unterminated_last_line_is_sent_at_the_end() {
        assert_eq!(split(b"a\nrest", 100, 100), frames(&["a", "rest"]));
        assert_eq!(split(b"", 100, 100), Vec::<Vec<u8>>::new());
        assert_eq!(split(b"\n", 100, 100), frames(&[""]));
    }

    #[test]
    fn long_lines_are_split_into_pieces_of_the_maximum() {
        for step in [1, 3, 4, 5, 100] {
            let got = split(b"abcdefghij\nxy\n", step, 4);
            assert_eq!(got, frames(&["abcd", "efgh", "ij", "xy"]), "step {step}");
        }
    }

    #[test]
    fn a_line_of_exactly_the_maximum_is_one_frame_with_no_empty_tail() {
        for step in [1, 4, 5, 100] {
            assert_eq!(
                split(b"abcd\nabcdefgh\n", step, 4),
                frames(&["abcd", "abcd", "efgh"]),
                "step {step}"
            );
            assert_eq!(
                split(b"abcdefgh", step, 4),
                frames(&["abcd", "efgh"]),
                "step {step}"
            );
        }
    }

    /// What the splitter must produce: every line cut into pieces of the
    /// maximum, an empty line as one empty frame, no frame for the empty
    /// rest after a final newline.
    fn reference(input: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
        let rest = lines.pop().unwrap_or_default();
        let mut out = Vec::new();
        for line in lines {
            if line.is_empty() {
                out.push(Vec::new());
            }
            out.extend(line.chunks(max).map(<[u8]>::to_vec));
        }
        out.extend(rest.chunks(max).map(<[u8]>::to_vec));
        out
    }

    #[test]
    fn any_input_in_any_pieces_matches_the_reference() {
        let mut input = Vec::new();
        for i in 0..300usize {
            input.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, i % 23));
            input.push(b'\n');
        }
        for tail in [&b""[..], b"tail", b"x\n"] {
            let mut input = input.clone();
            input.extend_from_slice(tail);
            for max in [1, 2, 7, 22, 23, 1000] {
                for step in [1, 5, 64, 4096] {
                    assert_eq!(
                        split(&input, step, max),
                        reference(&input, max),
                        "max {max} step {step} tail {tail:?}"
                    );
                }
            }
        }
    }
}
