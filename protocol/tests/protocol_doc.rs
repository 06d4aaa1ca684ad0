//! `PROTOCOL.md` checked against the code, so that the document a client
//! in another language is written from cannot drift from the wire:
//!
//! * each fenced `hex` block is the exact frame of the value named (as its
//!   `Debug` text, in backticks) on the line before it, both ways;
//! * the tables of requests, responses, types, enums and error codes list
//!   exactly the variants, fields (in wire order) and codes of this build.
//!
//! Variant and field names come from the types' own `Deserialize`, asked
//! through a deserializer that only records what it is asked for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::Serialize;
use tether_protocol::codec::encode_frame;
use tether_protocol::{
    Append, Appended, Capabilities, CheckpointEntry, CheckpointMeta, CheckpointRef, ClientCodec,
    ConsumerInfo, Durable, ErrorCode, ErrorFrame, ExecState, ExecutionInfo, ExitStatus, Frame,
    FrameKind, Hello, HelloOk, Request, Response, RestartPolicy, ServerCodec, StartAt, StepInfo,
    StorageFault, StreamInfo, Subscribe, WorkerExited, DEFAULT_MAX_FRAME_LEN, FRAME_ENVELOPE,
    PROTOCOL_VERSION,
};
use tokio_util::codec::Decoder;

const DOC: &str = include_str!("../PROTOCOL.md");

// ---------------------------------------------------------------------------
// The worked examples
// ---------------------------------------------------------------------------

fn request_examples() -> Vec<Request> {
    vec![
        Request::Hello(Hello {
            version: 1,
            capabilities: Capabilities::DURABLE,
            client: "py 0.1".into(),
        }),
        Request::Append(Append {
            stream: "jobs".into(),
            producer: "p1".into(),
            producer_seq: 300,
            kind: FrameKind::Stdout,
            payload: Bytes::from_static(b"hi\n"),
        }),
        Request::Subscribe(Subscribe {
            stream: "jobs".into(),
            start: StartAt::Last(10),
            follow: false,
            consumer: Some("c".into()),
        }),
        Request::WorkerExited(WorkerExited {
            execution: "e1".into(),
            attempt: 2,
            status: ExitStatus::Code(-1),
        }),
    ]
}

fn response_examples() -> Vec<Response> {
    vec![
        Response::HelloOk(HelloOk {
            version: 1,
            capabilities: Capabilities::DURABLE,
            daemon: "0.1.0".into(),
        }),
        Response::Appended(Appended {
            stream: "jobs".into(),
            producer: "p1".into(),
            producer_seq: 300,
            seq: 42,
        }),
        Response::Durable(Durable {
            seq: 42,
            frame: Frame {
                ts_micros: 1_700_000_000_000_000,
                kind: FrameKind::Data,
                payload: Bytes::from_static(b"ok"),
            },
        }),
        Response::Error(ErrorFrame {
            code: ErrorCode::HELLO_REQUIRED,
            message: "no Hello within 5s".into(),
        }),
    ]
}

/// A `hex` block of the document: the label on the line before it and the
/// bytes it spells (everything after a `#` on a line is a comment).
struct HexBlock {
    label: String,
    bytes: Vec<u8>,
}

fn hex_blocks() -> Vec<HexBlock> {
    let lines: Vec<&str> = DOC.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "```hex" {
            i += 1;
            continue;
        }
        let before = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .expect("a hex block with nothing before it");
        let (first, last) = (before.find('`'), before.rfind('`'));
        let label = match (first, last) {
            (Some(a), Some(b)) if a < b => before[a + 1..b].to_owned(),
            _ => panic!("the line before a hex block names no value in backticks: {before}"),
        };
        let mut digits = String::new();
        i += 1;
        while lines[i].trim() != "```" {
            let code = lines[i].split('#').next().unwrap();
            digits.extend(code.chars().filter(|c| !c.is_whitespace()));
            i += 1;
        }
        assert!(
            digits.len().is_multiple_of(2),
            "odd number of hex digits for {label}"
        );
        let bytes = (0..digits.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(&digits[k..k + 2], 16).expect("not hex"))
            .collect();
        blocks.push(HexBlock { label, bytes });
        i += 1;
    }
    blocks
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The example's label, its frame, and whether `decode` reads it back.
fn example<T, D>(enum_name: &str, value: T, mut decoder: D) -> (String, Vec<u8>)
where
    T: Serialize + Debug + PartialEq,
    D: Decoder<Item = T, Error = tether_protocol::Error>,
{
    let label = format!("{enum_name}::{value:?}");
    let frame = encode_frame(&value).unwrap().to_vec();
    let mut buf = BytesMut::from(&frame[..]);
    let decoded = decoder.decode(&mut buf).unwrap().unwrap();
    assert_eq!(decoded, value, "{label} does not decode to itself");
    (label, frame)
}

#[test]
fn every_hex_example_is_the_frame_of_the_value_it_names() {
    let mut examples: Vec<(String, Vec<u8>)> = request_examples()
        .into_iter()
        .map(|r| example("Request", r, ServerCodec::new()))
        .collect();
    examples.extend(
        response_examples()
            .into_iter()
            .map(|r| example("Response", r, ClientCodec::new())),
    );
    let blocks = hex_blocks();
    let mut failures = Vec::new();
    for block in &blocks {
        match examples.iter().find(|(label, _)| *label == block.label) {
            None => failures.push(format!(
                "no example in this test has the label {}",
                block.label
            )),
            Some((_, frame)) if *frame != block.bytes => failures.push(format!(
                "{}:\n  document {}\n  codec    {}",
                block.label,
                hex(&block.bytes),
                hex(frame)
            )),
            Some(_) => {}
        }
    }
    for (label, _) in &examples {
        let shown = blocks.iter().filter(|b| b.label == *label).count();
        if shown != 1 {
            failures.push(format!("{label} is shown {shown} times, not once"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_limits_and_version_are_the_codes() {
    for text in [
        format!("default 16 MiB = {DEFAULT_MAX_FRAME_LEN}"),
        format!("`max_frame_len - {FRAME_ENVELOPE}`"),
        format!("`version` is {PROTOCOL_VERSION}"),
        format!("bit 0 (`DURABLE`, value {})", Capabilities::DURABLE.0),
    ] {
        assert!(DOC.contains(&text), "PROTOCOL.md does not say {text:?}");
    }
}

// ---------------------------------------------------------------------------
// The tables
// ---------------------------------------------------------------------------

/// What a type's `Deserialize` asked for.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    Enum(&'static [&'static str]),
    Struct(&'static str, &'static [&'static str]),
    Seq,
    /// A variant without content.
    Unit,
    /// A variant with named fields.
    Fields(&'static [&'static str]),
    /// A variant with several unnamed values.
    Tuple,
    Other,
}

/// The error a probe ends every deserialization with, once it has seen
/// what it wanted.
#[derive(Debug)]
struct Seen;

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("seen")
    }
}

impl std::error::Error for Seen {}

impl de::Error for Seen {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Seen
    }
}

/// A deserializer that records the shape it is asked for; with `pick`, it
/// goes into that variant of an enum and records the variant's content.
struct Probe<'a> {
    seen: &'a mut Shape,
    pick: Option<u32>,
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Seen;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Seen> {
        *self.seen = Shape::Other;
        Err(Seen)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Seen> {
        *self.seen = Shape::Seq;
        Err(Seen)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Seen> {
        *self.seen = Shape::Struct(name, fields);
        Err(Seen)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Seen> {
        match self.pick {
            None => {
                *self.seen = Shape::Enum(variants);
                Err(Seen)
            }
            Some(index) => visitor.visit_enum(Pick {
                seen: self.seen,
                index,
            }),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct tuple
        tuple_struct map identifier ignored_any
    }
}

/// Chooses variant `index` of an enum being probed.
struct Pick<'a> {
    seen: &'a mut Shape,
    index: u32,
}

impl<'de, 'a> de::EnumAccess<'de> for Pick<'a> {
    type Error = Seen;
    type Variant = Pick<'a>;

    fn variant_seed<S: de::DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), Seen> {
        let deserializer: de::value::U32Deserializer<Seen> = self.index.into_deserializer();
        Ok((seed.deserialize(deserializer)?, self))
    }
}

impl<'de> de::VariantAccess<'de> for Pick<'_> {
    type Error = Seen;

    fn unit_variant(self) -> Result<(), Seen> {
        *self.seen = Shape::Unit;
        Ok(())
    }

    fn newtype_variant_seed<S: de::DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, Seen> {
        seed.deserialize(Probe {
            seen: self.seen,
            pick: None,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Seen> {
        *self.seen = Shape::Tuple;
        Err(Seen)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Seen> {
        *self.seen = Shape::Fields(fields);
        Err(Seen)
    }
}

fn shape_of<T: DeserializeOwned>(pick: Option<u32>) -> Shape {
    let mut seen = Shape::Other;
    let _ = T::deserialize(Probe {
        seen: &mut seen,
        pick,
    });
    seen
}

fn variants<T: DeserializeOwned>() -> &'static [&'static str] {
    match shape_of::<T>(None) {
        Shape::Enum(variants) => variants,
        other => panic!("not an enum: {other:?}"),
    }
}

fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    match shape_of::<T>(None) {
        Shape::Struct(_, fields) => fields,
        other => panic!("not a struct: {other:?}"),
    }
}

/// The rows of the first table after `heading`, header and rule left out,
/// as their cells.
fn table(heading: &str) -> Vec<Vec<String>> {
    let start = DOC
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("PROTOCOL.md has no heading {heading:?}"));
    table_at(&DOC[start..])
}

fn table_at(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split('|').map(|c| c.trim().to_owned()).collect()
        })
        .collect()
}

/// The words in backticks in `cell`, in order.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The field names a cell lists: the quoted words in snake case.
fn field_names(cell: &str) -> Vec<&str> {
    quoted(cell)
        .into_iter()
        .filter(|w| {
            w.starts_with(|c: char| c.is_ascii_lowercase())
                && w.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .collect()
}

/// Checks a table of messages against the variants of `T`: one row per
/// variant in index order, each listing the variant's fields.
fn check_messages<T: DeserializeOwned>(heading: &str) -> Vec<String> {
    let names = variants::<T>();
    let rows = table(heading);
    let mut failures = Vec::new();
    let listed: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r[0].clone(), r[1].trim_matches('`').to_owned()))
        .collect();
    let expected: Vec<(String, String)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (i.to_string(), (*n).to_owned()))
        .collect();
    for k in 0..listed.len().max(expected.len()) {
        let (doc, code) = (listed.get(k), expected.get(k));
        if doc != code {
            failures.push(format!(
                "{heading}: row {k} is {doc:?}; the code has {code:?}"
            ));
        }
    }
    for (index, row) in rows.iter().enumerate().take(names.len()) {
        let name = names[index];
        let cell = &row[2];
        let listed = field_names(cell);
        let shape = shape_of::<T>(Some(u32::try_from(index).unwrap()));
        let ok = match &shape {
            Shape::Fields(fields) => listed == *fields,
            Shape::Struct(type_name, fields) => {
                listed == *fields || (listed.is_empty() && quoted(cell).contains(type_name))
            }
            Shape::Unit | Shape::Seq | Shape::Tuple | Shape::Other => listed.is_empty(),
            Shape::Enum(_) => false,
        };
        if !ok {
            failures.push(format!(
                "{heading}: {name} lists fields {listed:?}; the code has {shape:?}"
            ));
        }
    }
    failures
}

#[test]
fn the_message_tables_list_every_variant_and_its_fields_in_wire_order() {
    let mut failures = check_messages::<Request>("## Requests");
    failures.extend(check_messages::<Response>("## Responses"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_type_tables_list_every_field_and_variant_in_wire_order() {
    let (types, enums) = {
        let start = DOC.find("\n## Types\n").expect("no Types section");
        let section = &DOC[start..];
        let second = section.find("| enum |").expect("no table of enums");
        (table_at(section), table_at(&section[second..]))
    };
    let mut failures = Vec::new();
    for row in &types {
        let name = row[0].trim_matches('`');
        let code: &[&str] = match name {
            "Frame" => fields::<Frame>(),
            "StreamInfo" => fields::<StreamInfo>(),
            "ConsumerInfo" => fields::<ConsumerInfo>(),
            "ExecutionInfo" => fields::<ExecutionInfo>(),
            "CheckpointRef" => fields::<CheckpointRef>(),
            "CheckpointMeta" => fields::<CheckpointMeta>(),
            "StorageFault" => fields::<StorageFault>(),
            "CheckpointEntry" => fields::<CheckpointEntry>(),
            "StepInfo" => fields::<StepInfo>(),
            "ExecutionDetail" => fields::<tether_protocol::ExecutionDetail>(),
            "QuestionInfo" => fields::<tether_protocol::QuestionInfo>(),
            "QuestionOutcome" => fields::<tether_protocol::QuestionOutcome>(),
            "InboxMessage" => fields::<tether_protocol::InboxMessage>(),
            "MirrorInfo" => fields::<tether_protocol::MirrorInfo>(),
            "MirrorStreamInfo" => fields::<tether_protocol::MirrorStreamInfo>(),
            other => {
                failures.push(format!("type {other} is not known to this test"));
                continue;
            }
        };
        if field_names(&row[1]) != code {
            failures.push(format!(
                "{name}: the table lists {:?}, the code has {code:?}",
                field_names(&row[1])
            ));
        }
    }
    for row in &enums {
        let name = row[0].trim_matches('`');
        let code: &[&str] = match name {
            "FrameKind" => variants::<FrameKind>(),
            "StartAt" => variants::<StartAt>(),
            "RestartPolicy" => variants::<RestartPolicy>(),
            "ExecState" => variants::<ExecState>(),
            "ExitStatus" => variants::<ExitStatus>(),
            "Answerer" => variants::<tether_protocol::Answerer>(),
            other => {
                failures.push(format!("enum {other} is not known to this test"));
                continue;
            }
        };
        let listed: Vec<&str> = quoted(&row[1]);
        let numbered = code
            .iter()
            .enumerate()
            .all(|(i, v)| row[1].contains(&format!("{i} `{v}`")));
        if listed != code || !numbered {
            failures.push(format!(
                "{name}: the table lists {listed:?}, the code has {code:?} (numbered from 0)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_error_table_lists_every_code_with_its_name_and_transience() {
    let rows = table("## Errors");
    let mut expected = Vec::new();
    for code in 1.. {
        let code = ErrorCode(code);
        if code.name() == "unknown" {
            break;
        }
        let transient = if code.is_transient() { "yes" } else { "no" };
        expected.push((code.0.to_string(), format!("`{}`", code.name()), transient));
    }
    let listed: Vec<(String, String, &str)> = rows
        .iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[2].as_str()))
        .collect();
    assert_eq!(listed, expected);
}
