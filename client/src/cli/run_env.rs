//! The environment `tether run` gives a worker: the caller's own, less the
//! variables of the caller's session or service, with `--env-file` and
//! `--env` on top.
//!
//! The caller's `TETHER_*` variables (its socket, its own execution when it
//! is a worker itself), `NOTIFY_SOCKET`, `LISTEN_*`, `WATCHDOG_*`,
//! `JOURNAL_STREAM` and `INVOCATION_ID` describe where the caller runs, not
//! where the worker will: a worker holding them could notify the caller's
//! service manager or pass for the caller's execution. The shim sets the
//! worker's own `TETHER_*` variables.

use std::ffi::OsString;
use std::path::Path;

use tether::{Error, Result};

/// True for a variable that belongs to the caller's session or service.
pub fn is_callers_own(key: &str) -> bool {
    ["TETHER_", "LISTEN_", "WATCHDOG_"]
        .iter()
        .any(|prefix| key.starts_with(prefix))
        || matches!(key, "NOTIFY_SOCKET" | "JOURNAL_STREAM" | "INVOCATION_ID")
}

/// The caller's environment as a worker gets it: without the caller's own
/// variables, and without any that is not UTF-8 (the wire carries text),
/// each of which is named on stderr.
pub fn callers(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, value) in vars {
        match (key.into_string(), value.into_string()) {
            (Ok(key), Ok(value)) => {
                if !is_callers_own(&key) {
                    out.push((key, value));
                }
            }
            (Ok(key), Err(_)) => {
                eprintln!(
                    "tether: leaving {key} out of the worker's environment: its value is not UTF-8"
                );
            }
            (Err(key), _) => eprintln!(
                "tether: leaving {} out of the worker's environment: its name is not UTF-8",
                key.to_string_lossy()
            ),
        }
    }
    out
}

/// The `KEY=VALUE` lines of an env file, in order. Blank lines and lines
/// starting with `#` are skipped; the value is taken as it is, up to the
/// end of the line (no quotes are removed). A missing file, or a line that
/// is not `KEY=VALUE`, is an error naming the file (and the line number).
pub fn read_file(path: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Local {
        context: format!("cannot read env file {}", path.display()),
        source,
    })?;
    parse_file(&text, path)
}

fn parse_file(text: &str, path: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let bad = |why: &str| {
            Error::Usage(format!(
                "{}:{}: {why}, expected KEY=VALUE: {line:?}",
                path.display(),
                index + 1
            ))
        };
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(bad("no '='"));
        };
        if key.is_empty() {
            return Err(bad("the name is empty"));
        }
        if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("the name has whitespace in it"));
        }
        if value.contains('\0') {
            return Err(bad("the value has a NUL byte in it"));
        }
        out.push((key.to_owned(), value.to_owned()));
    }
    Ok(out)
}

/// `base` with each of `overrides` set in turn: a variable already there
/// keeps its place and takes the new value, a new one goes at the end.
pub fn merge(
    mut base: Vec<(String, String)>,
    overrides: Vec<(String, String)>,
) -> Vec<(String, String)> {
    for (key, value) in overrides {
        match base.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => base.push((key, value)),
        }
    }
    base
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::ffi::OsStringExt;

    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_callers_own_variables_are_left_out() {
        let vars = [
            "PATH",
            "TETHER_SOCKET",
            "TETHER_EXECUTION_ID",
            "NOTIFY_SOCKET",
            "LISTEN_FDS",
            "LISTEN_PID",
            "WATCHDOG_USEC",
            "JOURNAL_STREAM",
            "INVOCATION_ID",
            "HOME",
            "MY_TETHER_X",
        ]
        .map(|k| (OsString::from(k), OsString::from("v")));
        let mut vars = vars.to_vec();
        vars.push((OsString::from("BAD"), OsString::from_vec(vec![0xff])));
        let kept: Vec<String> = callers(vars).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kept, ["PATH", "HOME", "MY_TETHER_X"]);
    }

    #[test]
    fn env_files_take_comments_blank_lines_and_literal_values() {
        let text = "# settings\n\nA=1\n  # indented comment\nB=x=y \"q\"\nEMPTY=\n";
        assert_eq!(
            parse_file(text, Path::new("f.env")).unwrap(),
            pairs(&[("A", "1"), ("B", "x=y \"q\""), ("EMPTY", "")])
        );
    }

    #[test]
    fn a_bad_line_names_the_file_and_the_line_number() {
        let err = parse_file("A=1\n\nnot a pair\n", Path::new("dir/f.env")).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("dir/f.env:3:"), "{text}");
        assert!(text.contains("not a pair"), "{text}");
        let err = parse_file("=v\n", Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("f:1: the name is empty"), "{err}");
        let err = read_file(Path::new("/nonexistent/f.env")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/f.env"), "{err}");
    }

    #[test]
    fn overrides_replace_in_place_or_append() {
        let merged = merge(
            pairs(&[("A", "1"), ("B", "2")]),
            pairs(&[("B", "3"), ("C", "4"), ("A", "5")]),
        );
        assert_eq!(merged, pairs(&[("A", "5"), ("B", "3"), ("C", "4")]));
    }
}
