//! `tether metrics` and `[metrics] listen`: Prometheus text whose every
//! line is well formed, with exact counts of what was published, per
//! stream for the streams `[metrics] streams` names and summed for the
//! rest; the same text over HTTP at `/metrics`, and 404 elsewhere.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tether_tests::wait::wait_until;
use tether_tests::Sandbox;

use crate::systemd_support::{tetherd, Tetherd};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Parses the whole text strictly: every line is `# HELP name text`,
/// `# TYPE name type`, the final `# EOF`, or `name{labels} value`.
/// Returns the samples by `name{labels}` as written.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the text must end with # EOF");
    assert!(text.ends_with('\n'));
    for (i, line) in lines.iter().enumerate() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("EOF"), None, None) => assert_eq!(i, lines.len() - 1, "# EOF before the end"),
                (Some("HELP"), Some(name), Some(_)) => assert!(is_name(name), "{line}"),
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(is_name(name), "{line}");
                    assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                }
                _ => panic!("a malformed comment line: {line:?}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a line with no value: {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("not a number in {line:?}")),
        };
        let name = match series.split_once('{') {
            None => series,
            Some((name, labels)) => {
                let labels = labels
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                assert_labels(labels, line);
                name
            }
        };
        assert!(is_name(name), "a bad metric name in {line:?}");
        let old = samples.insert(series.to_owned(), value);
        assert!(old.is_none(), "{series} appears twice");
    }
    samples
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `k="v",k2="v2"`, with `\"`, `\\` and `\n` escapes in values.
fn assert_labels(mut labels: &str, line: &str) {
    loop {
        let (key, rest) = labels
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a bad label in {line:?}"));
        assert!(is_name(key), "a bad label name in {line:?}");
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => {
                    chars.next();
                }
                Some((i, '"')) => break i,
                Some(_) => {}
                None => panic!("an unclosed label value in {line:?}"),
            }
        };
        labels = &rest[end + 1..];
        if labels.is_empty() {
            return;
        }
        labels = labels
            .strip_prefix(',')
            .unwrap_or_else(|| panic!("labels not separated by commas in {line:?}"));
    }
}

fn config(sb: &Sandbox, text: &str) -> String {
    let path = sb.file("tetherd.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn metrics(sb: &Sandbox) -> BTreeMap<String, f64> {
    let out = sb.run(&["metrics"]);
    out.assert_success();
    assert_eq!(out.stderr, "");
    parse(&out.stdout)
}

/// `METHOD path` over HTTP/1.1: the status code and the body.
fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

/// The port the daemon logged for `[metrics] listen`.
fn metrics_port(daemon: &Tetherd) -> u16 {
    let mut port = None;
    wait_until(TIMEOUT, "the metrics listener to be logged", || {
        port = daemon.log().lines().find_map(|line| {
            let (_, rest) = line.split_once("serving metrics at http://127.0.0.1:")?;
            rest.split('/').next()?.parse().ok()
        });
        port.is_some()
    });
    port.unwrap()
}

#[test]
fn metrics_count_exactly_what_was_published_per_chosen_stream() {
    let sb = Sandbox::new();
    let file = config(
        &sb,
        "[metrics]\nstreams = [\"keep-*\"]\nlisten = \"127.0.0.1:0\"\n",
    );
    let daemon = Tetherd::start(tetherd(&sb, "d.log", &["--config", &file]), &sb, "d.log");
    sb.publish("keep-a", "one\ntwo\nthree\n");
    sb.publish("keep-b", "four\nfive\n");
    sb.publish("other-1", "a\nbb\nccc\ndddd\n");
    sb.publish("other-2", "eeeee\n");

    // Sessions that ended may still be closing: wait for this one alone.
    let mut m = BTreeMap::new();
    wait_until(TIMEOUT, "only the metrics session to be open", || {
        m = metrics(&sb);
        m.get("tether_connections") == Some(&1.0)
    });
    let expect = [
        ("tether_frames_appended_total{stream=\"keep-a\"}", 3.0),
        ("tether_frames_appended_total{stream=\"keep-b\"}", 2.0),
        (
            "tether_frames_appended_total{stream=\"(other streams)\"}",
            5.0,
        ),
        ("tether_bytes_appended_total{stream=\"keep-a\"}", 11.0),
        ("tether_bytes_appended_total{stream=\"keep-b\"}", 8.0),
        (
            "tether_bytes_appended_total{stream=\"(other streams)\"}",
            15.0,
        ),
        ("tether_executions{state=\"running\"}", 0.0),
        ("tether_executions{state=\"failed\"}", 0.0),
        ("tether_restarts_total", 0.0),
        ("tether_storage_degraded", 0.0),
        ("tether_connections", 1.0),
    ];
    for (series, value) in expect {
        assert_eq!(m.get(series), Some(&value), "{series} in {m:#?}");
    }
    // No series for a stream outside the globs.
    assert!(!m.keys().any(|k| k.contains("other-1")), "{m:#?}");
    let commits = m["tether_commits_total"];
    assert!(commits >= 4.0, "four publishes, {commits} commits");
    assert_eq!(m["tether_commit_seconds_count"], commits);
    assert_eq!(m["tether_commit_seconds_bucket{le=\"+Inf\"}"], commits);
    assert!(m["tether_fsync_seconds_count"] >= 1.0);

    let port = metrics_port(&daemon);
    let (code, body) = http(port, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    let over_http = parse(&body);
    for (series, value) in expect {
        if series != "tether_connections" {
            assert_eq!(over_http.get(series), Some(&value), "{series} in {body}");
        }
    }
    assert_eq!(
        over_http.keys().collect::<Vec<_>>(),
        m.keys().collect::<Vec<_>>(),
        "HTTP shows other series than tether metrics"
    );
    // Counts, never payloads.
    for payload in ["three", "dddd", "eeeee"] {
        assert!(!body.contains(payload), "a payload in {body}");
    }
    for path in ["/", "/metrics/x", "/other"] {
        let (code, _) = http(port, "GET", path);
        assert_eq!(code, 404, "{path}");
    }
    let (code, _) = http(port, "POST", "/metrics");
    assert_eq!(code, 405);
}

#[test]
fn metrics_are_off_http_unless_configured_and_sum_beyond_the_globs() {
    let sb = Sandbox::new();
    let daemon = Tetherd::start(tetherd(&sb, "d.log", &[]), &sb, "d.log");
    sb.publish("a", "x\n");
    let m = metrics(&sb);
    // By default every stream (fewer than the 1000 busiest) has its own.
    assert_eq!(m["tether_frames_appended_total{stream=\"a\"}"], 1.0);
    assert_eq!(
        m["tether_frames_appended_total{stream=\"(other streams)\"}"],
        0.0
    );
    assert!(!daemon.log().contains("serving metrics"));
}
