//! Answers larger than one message: `streams`, `ps --all` and `checkpoint
//! list` print the whole list whatever its size, and a checkpoint larger
//! than one message is saved and loaded back whole. The daemon sends no
//! message over its configured maximum: a long answer comes in parts that
//! the CLI joins. Guards against a 20 MiB `streams` answer breaking the
//! client for good (the daemon wrote it as one message over the limit).

use std::path::Path;

use bytes::Bytes;
use serde_json::Value;
use tether_protocol::codec::encode_frame;
use tether_protocol::{Append, Capabilities, CheckpointSave, FrameKind, Request, Response};
use tether_tests::{RawConn, Sandbox};

use crate::checkpoint_support::FlaggedDaemon;

/// The small maximum message size the daemons here run with.
const MAX: usize = 8 * 1024;

fn flagged(sb: &Sandbox, max: usize, extra: &[&str]) -> FlaggedDaemon {
    let max = max.to_string();
    let mut flags = vec!["--max-frame-len", max.as_str()];
    flags.extend_from_slice(extra);
    FlaggedDaemon::start(sb, &flags)
}

/// A session that has said Hello.
fn session(socket: &Path) -> RawConn {
    let mut conn = RawConn::open(socket);
    conn.hello(Capabilities::DURABLE);
    conn
}

/// Sends every request, pipelined, while reading one answer to each,
/// which must be what `want` accepts.
fn pipeline(socket: &Path, requests: Vec<Request>, want: fn(&Response) -> bool) {
    let count = requests.len();
    let mut conn = session(socket);
    let mut writer = conn.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for request in &requests {
            writer.send(request).unwrap();
        }
    });
    for i in 0..count {
        let response = conn.expect_response();
        assert!(want(&response), "answer {i}: {response:?}");
    }
    sender.join().unwrap();
}

/// Creates one stream per name, each with one frame.
fn create_streams(socket: &Path, names: &[String]) {
    let appends = names
        .iter()
        .map(|name| {
            Request::Append(Append {
                stream: name.clone(),
                producer: "p".into(),
                producer_seq: 1,
                kind: FrameKind::Data,
                payload: Bytes::from_static(b"x"),
            })
        })
        .collect();
    // One `Appended` per append: every append names another stream.
    pipeline(socket, appends, |r| matches!(r, Response::Appended(_)));
}

/// The messages of the answer to `request`, each checked to be at most
/// `max` bytes, as read off the socket.
fn messages_of(socket: &Path, request: &Request, max: usize) -> Vec<Response> {
    let mut conn = session(socket);
    conn.send(request).unwrap();
    let mut messages = Vec::new();
    loop {
        let response = conn.expect_response();
        let len = encode_frame(&response).unwrap().len() - 4;
        assert!(len <= max, "a message of {len} bytes, over {max}");
        let last = !matches!(
            response,
            Response::StreamsPart(_)
                | Response::ExecutionsPart(_)
                | Response::CheckpointsPart(_)
                | Response::CheckpointPart(_)
        );
        messages.push(response);
        if last {
            return messages;
        }
    }
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn streams_prints_a_list_of_many_messages_whole_and_in_order() {
    let sb = Sandbox::new();
    let daemon = flagged(&sb, MAX, &[]);
    let names: Vec<String> = (0..150)
        .map(|i| format!("s{i:03}-{}", "n".repeat(200)))
        .collect();
    create_streams(&sb.socket(), &names);

    let messages = messages_of(&sb.socket(), &Request::ListStreams, MAX);
    assert!(messages.len() >= 3, "{} messages", messages.len());

    let out = sb.run(&["streams", "--json"]);
    out.assert_success();
    let listed: Vec<String> = json_lines(&out.stdout)
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, names);
    let table = sb.run(&["streams"]);
    table.assert_success();
    assert_eq!(table.stdout.lines().count(), names.len() + 1);
    drop(daemon);
}

#[test]
fn ps_all_prints_a_list_of_many_messages_whole_and_in_order() {
    let sb = Sandbox::new();
    let daemon = flagged(&sb, MAX, &[]);
    let long_arg = "a".repeat(2000);
    let mut ids = Vec::new();
    for i in 0..16 {
        let name = format!("r{i:02}");
        let out = sb.run(&["run", "--json", "--name", &name, "--", "true", &long_arg]);
        out.assert_success();
        let value: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        ids.push(value["id"].as_str().unwrap().to_owned());
    }
    let messages = messages_of(&sb.socket(), &Request::ListExecutions { all: true }, MAX);
    assert!(messages.len() >= 3, "{} messages", messages.len());

    let out = sb.run(&["ps", "--all", "--json"]);
    out.assert_success();
    let listed: Vec<String> = json_lines(&out.stdout)
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ids, "every execution, oldest first");
    drop(daemon);
}

#[test]
fn checkpoint_list_prints_a_list_of_many_messages_whole_and_in_order() {
    const SAVES: u64 = 1200;
    let sb = Sandbox::new();
    let daemon = flagged(&sb, MAX, &["--checkpoint-keep", "5000"]);
    let out = sb.run(&["run", "--json", "--", "true"]);
    out.assert_success();
    let id = serde_json::from_str::<Value>(out.stdout.trim()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let saves: Vec<Request> = (0..SAVES)
        .map(|i| {
            Request::CheckpointSave(CheckpointSave {
                execution: id.clone(),
                schema_version: 1,
                data: Bytes::from(i.to_string()),
            })
        })
        .collect();
    pipeline(&sb.socket(), saves, |r| {
        matches!(r, Response::CheckpointSaved(_))
    });

    let request = Request::CheckpointList {
        execution: id.clone(),
    };
    let messages = messages_of(&sb.socket(), &request, MAX);
    assert!(messages.len() >= 3, "{} messages", messages.len());

    let out = sb.run(&["checkpoint", "list", "--json", &id]);
    out.assert_success();
    let listed: Vec<Value> = json_lines(&out.stdout);
    assert_eq!(listed.len() as u64, SAVES);
    let sizes: Vec<u64> = listed.iter().map(|c| c["size"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (0..SAVES)
        .rev()
        .map(|i| i.to_string().len() as u64)
        .collect();
    assert_eq!(sizes, want, "newest first");
    let ids: Vec<u64> = listed.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "ids fall: {ids:?}");
    drop(daemon);
}

#[test]
fn a_checkpoint_larger_than_a_message_is_saved_and_loaded_whole() {
    let sb = Sandbox::new();
    let daemon = flagged(&sb, MAX, &[]);
    let out = sb.run(&["run", "--json", "--", "true"]);
    out.assert_success();
    let id = serde_json::from_str::<Value>(out.stdout.trim()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let data: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let out = sb.run_with_stdin(
        &["checkpoint", "save", "--force", "--execution", &id],
        &data,
    );
    out.assert_success();

    let request = Request::CheckpointLoad {
        execution: id.clone(),
    };
    let messages = messages_of(&sb.socket(), &request, MAX);
    assert!(
        messages.len() > data.len() / MAX,
        "{} messages",
        messages.len()
    );

    let out = sb.run(&["checkpoint", "load", "--execution", &id]);
    out.assert_success();
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout.as_bytes() == data.as_slice(), "the bytes differ");
    drop(daemon);
}

#[test]
fn a_frame_at_the_payload_limit_is_delivered_and_one_over_is_refused() {
    let sb = Sandbox::new();
    let daemon = flagged(&sb, MAX, &[]);
    let limit = tether_protocol::max_payload_len(MAX);
    let line = "z".repeat(limit);
    sb.publish("edge", &format!("{line}\n"));
    let out = sb.run(&["tail", "edge"]);
    out.assert_success();
    assert_eq!(out.stdout, format!("{line}\n"));

    let mut conn = session(&sb.socket());
    conn.send(&Request::Append(Append {
        stream: "edge".into(),
        producer: "q".into(),
        producer_seq: 1,
        kind: FrameKind::Data,
        payload: Bytes::from(vec![b'z'; limit + 1]),
    }))
    .unwrap();
    let refused = conn.expect_error();
    assert_eq!(
        refused.message,
        format!(
            "a payload of {} bytes for stream \"edge\" exceeds the limit of {limit} bytes \
             (the maximum message size less 1024 bytes)",
            limit + 1
        )
    );
    drop(daemon);
}

#[test]
fn a_20_mib_streams_answer_at_the_default_maximum_is_printed_whole() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    // 255-byte names: about 262 bytes a stream on the wire.
    let count = 20 * 1024 * 1024 / 262 + 1;
    let names: Vec<String> = (0..count)
        .map(|i| format!("{i:06}-{}", "w".repeat(248)))
        .collect();
    create_streams(&sb.socket(), &names);

    let out = sb.run(&["streams", "--json"]);
    out.assert_success();
    let listed: Vec<String> = json_lines(&out.stdout)
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed.len(), names.len());
    assert!(listed == names, "the names differ");
    let answer = Response::Streams(tether_tests::raw::list_streams(&sb.socket()).unwrap());
    let len = encode_frame(&answer).unwrap().len();
    assert!(len > 20 * 1024 * 1024, "the answer is {len} bytes");
}
