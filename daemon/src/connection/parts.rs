//! Answers too large for one message, split into several that each fit the
//! configured maximum (see `tether_protocol::parts`, which joins them
//! again). A list goes as leading `...Part` messages and then its usual
//! answer with the rest; a checkpoint as `CheckpointPart` pieces of its
//! data and then the `Checkpoint` with its metadata and the last piece.
//!
//! Each item's encoded size is measured as it is added, so a part is as
//! full as it can be and never over the maximum. An answer that fits in one
//! message is sent as it always was.

use bytes::Bytes;
use serde::Serialize;
use tether_protocol::codec::encoded_len;
use tether_protocol::{
    Checkpoint, CheckpointEntry, CheckpointFull, CheckpointMeta, ExecutionDetail, ExecutionInfo,
    QuestionInfo, Response, StepInfo, StreamInfo,
};

use crate::{Error, Result};

/// What a list message holds besides its items: the variant's index and
/// the list's length, varints of at most 5 and 10 bytes.
const LIST_OVERHEAD: usize = 5 + 10;

/// What a message of data holds besides the bytes: the variant's index
/// and the data's length, varints of at most 5 and 10 bytes.
const DATA_OVERHEAD: usize = 5 + 10;

/// `streams` as messages of at most `max` bytes each.
pub(super) fn streams(streams: Vec<StreamInfo>, max: usize) -> Result<Vec<Response>> {
    split_list(streams, max, Response::StreamsPart, Response::Streams)
}

/// `executions` as messages of at most `max` bytes each.
pub(super) fn executions(executions: Vec<ExecutionInfo>, max: usize) -> Result<Vec<Response>> {
    split_list(
        executions,
        max,
        Response::ExecutionsPart,
        Response::Executions,
    )
}

/// `executions` with their details as messages of at most `max` bytes each.
pub(super) fn executions_full(
    executions: Vec<ExecutionDetail>,
    max: usize,
) -> Result<Vec<Response>> {
    split_list(
        executions,
        max,
        Response::ExecutionsFullPart,
        Response::ExecutionsFull,
    )
}

/// `checkpoints` as messages of at most `max` bytes each.
pub(super) fn checkpoints(checkpoints: Vec<CheckpointMeta>, max: usize) -> Result<Vec<Response>> {
    split_list(
        checkpoints,
        max,
        Response::CheckpointsPart,
        Response::Checkpoints,
    )
}

/// `entries` (checkpoints with their user metadata) as messages of at
/// most `max` bytes each.
pub(super) fn checkpoints_full(entries: Vec<CheckpointEntry>, max: usize) -> Result<Vec<Response>> {
    split_list(
        entries,
        max,
        Response::CheckpointsFullPart,
        Response::CheckpointsFull,
    )
}

/// `steps` as messages of at most `max` bytes each.
pub(super) fn steps(steps: Vec<StepInfo>, max: usize) -> Result<Vec<Response>> {
    split_list(steps, max, Response::StepsPart, Response::Steps)
}

/// `questions` as messages of at most `max` bytes each.
pub(super) fn questions(questions: Vec<QuestionInfo>, max: usize) -> Result<Vec<Response>> {
    split_list(questions, max, Response::QuestionsPart, Response::Questions)
}

/// `items` in order, as `part` messages and then one `last` message (which
/// may be empty), each of at most `max` bytes. An item that does not fit in
/// a message on its own is refused as too large, naming its size.
fn split_list<T: Serialize>(
    items: Vec<T>,
    max: usize,
    part: fn(Vec<T>) -> Response,
    last: fn(Vec<T>) -> Response,
) -> Result<Vec<Response>> {
    let what = match part(Vec::new()) {
        Response::StreamsPart(_) => "a stream's entry",
        Response::ExecutionsPart(_) | Response::ExecutionsFullPart(_) => "an execution's entry",
        Response::CheckpointsFullPart(_) => "a checkpoint's entry",
        Response::StepsPart(_) => "a step's entry",
        Response::QuestionsPart(_) => "a question",
        _ => "an entry of the list",
    };
    let room = max.saturating_sub(LIST_OVERHEAD);
    let mut messages = Vec::new();
    let mut current = Vec::new();
    let mut used = 0;
    for item in items {
        let len = encoded_len(&item)?;
        if len > room {
            return Err(Error::AnswerTooLarge {
                what,
                len: len + LIST_OVERHEAD,
                max,
            });
        }
        if used + len > room {
            messages.push(part(std::mem::take(&mut current)));
            used = 0;
        }
        used += len;
        current.push(item);
    }
    messages.push(last(current));
    Ok(messages)
}

/// `checkpoint` as messages of at most `max` bytes each: its data in
/// `CheckpointPart` pieces from the front, then the `Checkpoint` with the
/// metadata and what is left. The pieces share the checkpoint's buffer.
pub(super) fn checkpoint(checkpoint: Checkpoint, max: usize) -> Result<Vec<Response>> {
    let Checkpoint { meta, data } = checkpoint;
    split_data(data, max, |data| {
        Response::Checkpoint(Checkpoint {
            meta: meta.clone(),
            data,
        })
    })
}

/// [`checkpoint`] for one with its user metadata.
pub(super) fn checkpoint_full(checkpoint: CheckpointFull, max: usize) -> Result<Vec<Response>> {
    let CheckpointFull {
        meta,
        user_meta,
        data,
    } = checkpoint;
    split_data(data, max, |data| {
        Response::CheckpointFull(CheckpointFull {
            meta: meta.clone(),
            user_meta: user_meta.clone(),
            data,
        })
    })
}

/// `data` as `CheckpointPart` pieces from the front, then `last` with the
/// rest: every message of at most `max` bytes.
fn split_data(
    mut data: Bytes,
    max: usize,
    last: impl Fn(Bytes) -> Response,
) -> Result<Vec<Response>> {
    let envelope = encoded_len(&last(Bytes::new()))?;
    // The empty data's length took one byte; a longer one may take five.
    let last_room = max.saturating_sub(envelope + 4);
    let piece_room = max.saturating_sub(DATA_OVERHEAD);
    if last_room == 0 || piece_room == 0 {
        return Err(Error::AnswerTooLarge {
            what: "a checkpoint's metadata",
            len: envelope,
            max,
        });
    }
    let mut messages = Vec::new();
    while data.len() > last_room {
        // The last piece rides with the metadata; everything before it is
        // cut into pieces as large as a message allows.
        let piece = data.split_to(piece_room.min(data.len()));
        messages.push(Response::CheckpointPart(piece));
    }
    messages.push(last(data));
    Ok(messages)
}

/// The metrics `text` as `MetricsPart` pieces and then `Metrics` with the
/// rest, each of at most `max` bytes. Pieces end at line ends, so that
/// each is whole lines of text; a single line longer than a message (a
/// stream name is at most 255 bytes, so never in practice) is cut at a
/// character boundary.
pub(super) fn metrics(text: String, max: usize) -> Result<Vec<Response>> {
    let room = max.saturating_sub(DATA_OVERHEAD);
    if text.len() <= room {
        return Ok(vec![Response::Metrics(text)]);
    }
    if room < 4 {
        return Err(Error::AnswerTooLarge {
            what: "the metrics text",
            len: text.len(),
            max,
        });
    }
    let mut messages = Vec::new();
    let mut rest = text.as_str();
    while rest.len() > room {
        let mut cut = rest[..room].rfind('\n').map_or(0, |i| i + 1);
        if cut == 0 {
            cut = room;
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
        }
        messages.push(Response::MetricsPart(rest[..cut].to_owned()));
        rest = &rest[cut..];
    }
    messages.push(Response::Metrics(rest.to_owned()));
    Ok(messages)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tether_protocol::codec::encode_frame;
    use tether_protocol::parts::Joiner;
    use tether_protocol::ConsumerInfo;

    use super::*;

    fn stream(i: usize, consumers: usize) -> StreamInfo {
        StreamInfo {
            name: format!("stream-{i:05}-{}", "x".repeat(i % 200)),
            first_seq: i as u64,
            last_seq: u64::MAX - i as u64,
            frames: i as u64 * 1000,
            bytes: u64::MAX,
            consumers: (0..consumers)
                .map(|c| ConsumerInfo {
                    name: format!("c{c}"),
                    acked_through: u64::MAX,
                })
                .collect(),
        }
    }

    /// Every message's body fits in `max`, and joining gives back `whole`.
    fn assert_fits_and_joins(messages: Vec<Response>, max: usize, whole: &Response) {
        let mut joiner = Joiner::new();
        let count = messages.len();
        for (i, message) in messages.into_iter().enumerate() {
            let len = encode_frame(&message).unwrap().len() - 4;
            assert!(len <= max, "message {i} has {len} bytes, over {max}");
            match joiner.push(message).unwrap() {
                None => assert!(i + 1 < count, "the last message is a part"),
                Some(joined) => {
                    assert_eq!(i + 1, count, "an answer ended before its last message");
                    assert_eq!(&joined, whole);
                }
            }
        }
    }

    #[test]
    fn a_list_that_fits_goes_as_one_message_as_before() {
        let list: Vec<_> = (0..10).map(|i| stream(i, 1)).collect();
        let messages = streams(list.clone(), 64 * 1024).unwrap();
        assert_eq!(messages, [Response::Streams(list)]);
        assert_eq!(
            streams(vec![], 1024).unwrap(),
            [Response::Streams(vec![])],
            "an empty list is one empty answer"
        );
    }

    #[test]
    fn a_long_list_is_split_into_full_parts_that_each_fit() {
        let list: Vec<_> = (0..3000).map(|i| stream(i, i % 3)).collect();
        let whole = Response::Streams(list.clone());
        let total = encode_frame(&whole).unwrap().len();
        for max in [1024, 4096, 64 * 1024] {
            let messages = streams(list.clone(), max).unwrap();
            // Parts are filled: no more messages than twice the minimum.
            assert!(messages.len() >= total / max, "{max}: {}", messages.len());
            assert!(messages.len() <= 2 * total / max + 1, "{max}");
            assert_fits_and_joins(messages, max, &whole);
        }
    }

    #[test]
    fn a_message_filled_to_the_byte_still_fits() {
        // Items of one size, with room for exactly three.
        let list: Vec<_> = (0..10).map(|_| stream(7, 0)).collect();
        let item = encoded_len(&list[0]).unwrap();
        let max = 3 * item + LIST_OVERHEAD;
        let messages = streams(list.clone(), max).unwrap();
        assert_eq!(messages.len(), 4);
        assert_fits_and_joins(messages, max, &Response::Streams(list));
    }

    #[test]
    fn executions_and_checkpoint_lists_split_the_same_way() {
        let metas: Vec<_> = (0..2000)
            .map(|i| CheckpointMeta {
                id: i,
                seq: i * 7,
                schema_version: 1,
                size: i * 1000,
                created_micros: 1_700_000_000_000_000 + i,
                valid: i % 5 != 0,
            })
            .collect();
        let messages = checkpoints(metas.clone(), 1024).unwrap();
        assert!(messages.len() > 10);
        assert!(matches!(messages[0], Response::CheckpointsPart(_)));
        assert_fits_and_joins(messages, 1024, &Response::Checkpoints(metas));
        let messages = executions(vec![], 1024).unwrap();
        assert_eq!(messages, [Response::Executions(vec![])]);
    }

    #[test]
    fn an_item_larger_than_a_message_is_refused() {
        let err = streams(vec![stream(1, 0), stream(2, 200)], 1024).unwrap_err();
        assert_eq!(err.code(), tether_protocol::ErrorCode::FRAME_TOO_LARGE);
        let len = encoded_len(&stream(2, 200)).unwrap() + LIST_OVERHEAD;
        assert_eq!(
            err.to_string(),
            format!(
                "cannot answer: a stream's entry takes {len} bytes, more than the maximum \
                 message size of 1024 bytes (max_frame_len)"
            )
        );
    }

    fn checkpoint_of(len: usize) -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                id: 9,
                seq: 300,
                schema_version: 2,
                size: len as u64,
                created_micros: 1_700_000_000_000_000,
                valid: true,
            },
            data: (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into(),
        }
    }

    #[test]
    fn a_checkpoint_that_fits_goes_whole() {
        let small = checkpoint_of(100);
        let messages = checkpoint(small.clone(), 1024).unwrap();
        assert_eq!(messages, [Response::Checkpoint(small)]);
    }

    #[test]
    fn a_large_checkpoint_goes_in_pieces_that_each_fit() {
        for (len, max) in [
            (8 * 1024 * 1024, 64 * 1024),
            (100_000, 1024),
            (1024, 1024),
            (2048, 1024),
            (5000, 4096),
        ] {
            let large = checkpoint_of(len);
            let whole = Response::Checkpoint(large.clone());
            let messages = checkpoint(large, max).unwrap();
            assert!(messages.len() > 1, "{len} in {max}");
            assert!(messages.len() <= len / (max / 2) + 2, "{len} in {max}");
            assert_fits_and_joins(messages, max, &whole);
        }
    }

    #[test]
    fn every_size_around_a_message_boundary_fits() {
        let max = 1024;
        for len in 900..1100 {
            let cp = checkpoint_of(len);
            let whole = Response::Checkpoint(cp.clone());
            assert_fits_and_joins(checkpoint(cp, max).unwrap(), max, &whole);
        }
    }

    #[test]
    fn metrics_text_is_cut_at_line_ends_and_joins_again() {
        let text: String = (0..2000)
            .map(|i| format!("tether_frames_appended_total{{stream=\"s{i}\"}} {i}\n"))
            .collect::<String>()
            + "# EOF\n";
        let max = 4096;
        let messages = metrics(text.clone(), max).unwrap();
        assert!(messages.len() > 10);
        for message in &messages[..messages.len() - 1] {
            match message {
                Response::MetricsPart(piece) => assert!(piece.ends_with('\n')),
                other => panic!("expected MetricsPart, got {}", other.name()),
            }
        }
        assert_fits_and_joins(messages, max, &Response::Metrics(text));
    }
}
