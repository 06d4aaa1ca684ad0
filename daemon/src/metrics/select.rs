//! Which streams get series of their own. A daemon may hold millions of
//! streams; a series per stream would make every scrape as large, so only
//! the streams matching `[metrics] streams` (globs), or by default the
//! [`DEFAULT_BUSIEST`] busiest, are shown one by one, and the rest summed.

use super::StreamCounts;

/// Streams shown one by one when `[metrics] streams` is not set: the
/// busiest, by frames appended since the start.
pub const DEFAULT_BUSIEST: usize = 1000;

/// The label value of the series summing every other stream. Stream names
/// cannot hold spaces, so it names no stream.
pub const OTHER_STREAMS: &str = "(other streams)";

/// The streams shown one by one, in name order, and the sum of the rest.
pub fn split(
    mut counts: Vec<(String, StreamCounts)>,
    globs: &[String],
) -> (Vec<(String, StreamCounts)>, StreamCounts) {
    let mut rest = StreamCounts::default();
    let mut shown = if globs.is_empty() {
        // Busiest first; equal ones by name, so that the choice is stable.
        counts.sort_by(|(a, x), (b, y)| y.frames.cmp(&x.frames).then_with(|| a.cmp(b)));
        let others = counts.split_off(counts.len().min(DEFAULT_BUSIEST));
        for (_, c) in others {
            add(&mut rest, c);
        }
        counts
    } else {
        let (shown, others): (Vec<_>, Vec<_>) = counts
            .into_iter()
            .partition(|(name, _)| globs.iter().any(|g| glob_matches(g, name)));
        for (_, c) in others {
            add(&mut rest, c);
        }
        shown
    };
    shown.sort_by(|(a, _), (b, _)| a.cmp(b));
    (shown, rest)
}

fn add(sum: &mut StreamCounts, counts: StreamCounts) {
    sum.frames += counts.frames;
    sum.bytes += counts.bytes;
}

/// Whether `name` matches `glob`: `*` stands for any run of characters
/// (`/` included, as stream names have no hierarchy), `?` for one, and
/// `[abc]`/`[a-z]`/`[!a]` for one of a set; anything else for itself.
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let name: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point for the last `*`: linear
    // in practice, and never exponential.
    let (mut g, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        let step = match glob.get(g) {
            Some('*') => {
                star = Some((g, n));
                g += 1;
                continue;
            }
            Some('?') => Some(g + 1),
            Some('[') => class(&glob, g, name[n]),
            Some(c) if *c == name[n] => Some(g + 1),
            _ => None,
        };
        match (step, star) {
            (Some(next), _) => {
                g = next;
                n += 1;
            }
            (None, Some((star_g, star_n))) => {
                g = star_g + 1;
                n = star_n + 1;
                star = Some((star_g, star_n + 1));
            }
            (None, None) => return false,
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// Matches `c` against the class opening at `glob[open]`: the index after
/// the class when it matches. An unclosed `[` matches itself only.
fn class(glob: &[char], open: usize, c: char) -> Option<usize> {
    let Some(close) = glob[open + 1..]
        .iter()
        .skip(1)
        .position(|x| *x == ']')
        .map(|i| open + 2 + i)
    else {
        return (c == '[').then_some(open + 1);
    };
    let mut body = &glob[open + 1..close];
    let negated = matches!(body.first(), Some('!' | '^'));
    if negated {
        body = &body[1..];
    }
    let mut found = false;
    let mut i = 0;
    while i < body.len() {
        if i + 2 < body.len() && body[i + 1] == '-' {
            found |= body[i] <= c && c <= body[i + 2];
            i += 3;
        } else {
            found |= body[i] == c;
            i += 1;
        }
    }
    (found != negated).then_some(close + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_in_a_shell() {
        for (glob, name, expected) in [
            ("build-*", "build-1", true),
            ("build-*", "build-", true),
            ("build-*", "test-1", false),
            ("*", "anything", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*-log", "x-y-log", true),
            ("*-log", "x-y-logs", false),
            ("job[0-9]", "job7", true),
            ("job[0-9]", "jobx", false),
            ("job[!0-9]", "jobx", true),
            ("[", "[", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_matches(glob, name), expected, "{glob} vs {name}");
        }
    }

    fn counts(list: &[(&str, u64)]) -> Vec<(String, StreamCounts)> {
        list.iter()
            .map(|(n, f)| {
                let counts = StreamCounts {
                    frames: *f,
                    bytes: *f * 10,
                };
                (n.to_string(), counts)
            })
            .collect()
    }

    #[test]
    fn globs_choose_the_streams_and_the_rest_is_summed() {
        let (shown, rest) = split(
            counts(&[("b-1", 1), ("a-2", 2), ("c", 3), ("d", 4)]),
            &["a-*".into(), "b-*".into()],
        );
        let names: Vec<&str> = shown.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a-2", "b-1"]);
        assert_eq!(
            rest,
            StreamCounts {
                frames: 7,
                bytes: 70
            }
        );
    }

    #[test]
    fn by_default_only_the_busiest_are_shown() {
        let many: Vec<(String, u64)> = (0..DEFAULT_BUSIEST as u64 + 5)
            .map(|i| (format!("s{i:05}"), i + 1))
            .collect();
        let list: Vec<(&str, u64)> = many.iter().map(|(n, f)| (n.as_str(), *f)).collect();
        let (shown, rest) = split(counts(&list), &[]);
        assert_eq!(shown.len(), DEFAULT_BUSIEST);
        // The five quietest (1 to 5 frames) are summed.
        assert_eq!(rest.frames, 1 + 2 + 3 + 4 + 5);
        assert!(shown.iter().all(|(n, _)| n.as_str() >= "s00005"));
    }
}
