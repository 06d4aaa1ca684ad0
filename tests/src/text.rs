//! Test input made of numbered lines, and comparison of large outputs.
//!
//! Every line has the same width, so an output's byte length tells how many
//! lines it holds without reading it, and line `n` of a stream published
//! from an empty start has seq `n`.

use std::ops::RangeInclusive;

/// Bytes per line made by [`lines`], newline included.
pub const LINE_LEN: u64 = 13;

/// One line per number, `line-NNNNNNN\n`.
pub fn lines(range: RangeInclusive<u64>) -> String {
    let mut out = String::with_capacity(range.clone().count() * LINE_LEN as usize);
    for n in range {
        out.push_str(&line(n));
    }
    out
}

/// Line `n` as made by [`lines`].
pub fn line(n: u64) -> String {
    format!("line-{n:07}\n")
}

/// One line per number, each padded with `x` to `width` bytes (newline
/// included), for tests that need volume.
pub fn wide_lines(range: RangeInclusive<u64>, width: usize) -> String {
    let mut out = String::with_capacity(range.clone().count() * width);
    for n in range {
        let head = format!("wide-{n:09}-");
        out.push_str(&head);
        out.extend(std::iter::repeat_n(
            'x',
            width.saturating_sub(head.len() + 1),
        ));
        out.push('\n');
    }
    out
}

/// The payload bytes of [`line`]`(n)`: the line without its newline.
pub fn payload_len(n: u64) -> u64 {
    line(n).len() as u64 - 1
}

/// Asserts `actual == expected` for outputs too large to print whole: on a
/// mismatch it reports the line counts, the first differing line and a few
/// lines around it.
pub fn assert_same_lines(actual: &str, expected: &str, what: &str) {
    if actual == expected {
        return;
    }
    let got: Vec<&str> = actual.split_inclusive('\n').collect();
    let want: Vec<&str> = expected.split_inclusive('\n').collect();
    let first_diff = got
        .iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let from = first_diff.saturating_sub(2);
    let show = |v: &[&str]| -> String {
        v.iter()
            .skip(from)
            .take(6)
            .map(|l| format!("    {l:?}\n"))
            .collect()
    };
    panic!(
        "{what}: output differs from the expected lines\n\
         got {} lines ({} bytes), expected {} lines ({} bytes)\n\
         first difference at line {} (1-based)\n  got:\n{}  expected:\n{}",
        got.len(),
        actual.len(),
        want.len(),
        expected.len(),
        first_diff + 1,
        show(&got),
        show(&want),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn lines_have_fixed_width() {
        let text = lines(1..=3);
        assert_eq!(text, "line-0000001\nline-0000002\nline-0000003\n");
        assert_eq!(text.len() as u64, 3 * LINE_LEN);
    }

    #[test]
    fn wide_lines_have_the_requested_width() {
        let text = wide_lines(7..=8, 32);
        assert_eq!(text.len(), 64);
        assert!(text.starts_with("wide-000000007-xxx"));
        assert!(text.ends_with("x\n"));
    }

    #[test]
    fn identical_outputs_pass() {
        assert_same_lines("a\nb\n", "a\nb\n", "same");
    }

    #[test]
    #[should_panic(expected = "first difference at line 2")]
    fn a_mismatch_names_the_first_differing_line() {
        assert_same_lines("a\nx\n", "a\nb\n", "differs");
    }
}
