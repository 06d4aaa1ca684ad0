//! The payloads of `ask` and `answer` frames: one JSON object each, as
//! `tether tail` shows them and tools parse them.

use std::fmt::Write;

use bytes::Bytes;
use tether_protocol::{Answerer, QuestionOutcome};

use super::QuestionRecord;

/// `{"question":ID,"text":...,"choices":[...],"key":...,"default":...,"timeout_ms":...}`
pub(super) fn ask(record: &QuestionRecord) -> Bytes {
    let info = &record.info;
    let mut out = format!("{{\"question\":{},\"text\":", info.id);
    string(&mut out, &info.text);
    out.push_str(",\"choices\":[");
    for (i, choice) in info.choices.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(&mut out, choice);
    }
    out.push_str("],\"key\":");
    string(&mut out, &info.key);
    out.push_str(",\"default\":");
    optional(&mut out, info.default.as_deref());
    out.push_str(",\"timeout_ms\":");
    match record.timeout_ms {
        Some(ms) => {
            let _ = write!(out, "{ms}");
        }
        None => out.push_str("null"),
    }
    out.push('}');
    Bytes::from(out)
}

/// `{"question":ID,"answer":"yes"|null,"by":{"uid":0,"user":"root"}|"timeout"}`
pub(super) fn answer(id: u64, outcome: &QuestionOutcome) -> Bytes {
    let mut out = format!("{{\"question\":{id},\"answer\":");
    optional(&mut out, outcome.answer.as_deref());
    out.push_str(",\"by\":");
    match &outcome.by {
        Answerer::Timeout => out.push_str("\"timeout\""),
        Answerer::User { uid, name } => {
            let _ = write!(out, "{{\"uid\":{uid},\"user\":");
            optional(&mut out, name.as_deref());
            out.push('}');
        }
    }
    out.push('}');
    Bytes::from(out)
}

fn optional(out: &mut String, value: Option<&str>) {
    match value {
        Some(value) => string(out, value),
        None => out.push_str("null"),
    }
}

/// `value` as a JSON string.
fn string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use tether_protocol::QuestionInfo;

    use super::*;

    #[test]
    fn payloads_are_the_documented_json() {
        let record = QuestionRecord {
            info: QuestionInfo {
                id: 3,
                execution: "e".into(),
                key: "Deploy?#0".into(),
                text: "Deploy \"prod\"?\n".into(),
                choices: vec!["yes".into(), "no".into()],
                default: None,
                asked_micros: 1,
                deadline_micros: None,
                attempt: 1,
                seq: 0,
                outcome: None,
            },
            timeout_ms: Some(5000),
            asks: vec![(1, 9)],
        };
        assert_eq!(
            ask(&record),
            r#"{"question":3,"text":"Deploy \"prod\"?\n","choices":["yes","no"],"key":"Deploy?#0","default":null,"timeout_ms":5000}"#
        );
        let by_user = QuestionOutcome {
            answer: Some("yes".into()),
            by: Answerer::User {
                uid: 0,
                name: Some("root".into()),
            },
            answered_micros: 2,
            seq: 0,
        };
        assert_eq!(
            answer(3, &by_user),
            r#"{"question":3,"answer":"yes","by":{"uid":0,"user":"root"}}"#
        );
        let timed_out = QuestionOutcome {
            answer: None,
            by: Answerer::Timeout,
            answered_micros: 2,
            seq: 0,
        };
        assert_eq!(
            answer(3, &timed_out),
            r#"{"question":3,"answer":null,"by":"timeout"}"#
        );
    }
}
