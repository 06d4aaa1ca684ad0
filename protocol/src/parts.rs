//! Answers in several messages. The daemon never sends a message over its
//! maximum size, so a list too long for one message goes as leading parts
//! (`StreamsPart`, `ExecutionsPart`, `CheckpointsPart`, `StepsPart`,
//! `CheckpointsFullPart`, `ExecutionsFullPart`) followed by the
//! usual final answer (`Streams`, ...) with the rest, and a checkpoint too
//! large for one message as `CheckpointPart` pieces of its data followed by
//! the `Checkpoint` (or `CheckpointFull`) with its metadata and the last
//! piece. Metrics text too large for one message goes as `MetricsPart`
//! pieces followed by the `Metrics` with the rest. [`Joiner`] puts
//! such an answer back together, so that a reader sees one `Streams` (or
//! `Checkpoint`) whatever its size.
//!
//! A daemon that predates the parts never sends them; a client that
//! predates them reads a part as a message type newer than itself, and
//! fails clearly, which is all it could do with an answer that the daemon
//! may no longer send in one message.

use bytes::{Bytes, BytesMut};

use crate::Response;

/// Gathers the parts of one answer. Feed it each response read after a
/// request, in order, until [`Joiner::push`] returns the whole answer.
#[derive(Debug, Default)]
pub struct Joiner {
    /// The parts so far, as the part variant holding all of them.
    gathered: Option<Response>,
    /// A checkpoint's pieces are kept apart and copied once, at the end.
    pieces: Vec<Bytes>,
}

impl Joiner {
    /// A joiner with nothing gathered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next response of the answer: `Ok(None)` for a part (more
    /// follows), `Ok(Some(answer))` for the end of it, with every part
    /// joined in. A response that is not a part, with nothing gathered, is
    /// the whole answer as it is. A part followed by anything but another
    /// part or the final answer of its kind is an error.
    pub fn push(&mut self, response: Response) -> Result<Option<Response>, crate::Error> {
        use Response::*;
        let gathered = self.gathered.take();
        let joined = match (gathered, response) {
            (None, CheckpointPart(piece)) => {
                self.pieces.push(piece);
                return Ok(None);
            }
            (None, Checkpoint(mut checkpoint)) if !self.pieces.is_empty() => {
                self.pieces.push(checkpoint.data);
                checkpoint.data = concat(std::mem::take(&mut self.pieces));
                Checkpoint(checkpoint)
            }
            (None, CheckpointFull(mut checkpoint)) if !self.pieces.is_empty() => {
                self.pieces.push(checkpoint.data);
                checkpoint.data = concat(std::mem::take(&mut self.pieces));
                CheckpointFull(checkpoint)
            }
            (
                None,
                part @ (StreamsPart(_)
                | ExecutionsPart(_)
                | CheckpointsPart(_)
                | StepsPart(_)
                | CheckpointsFullPart(_)
                | ExecutionsFullPart(_)),
            ) => {
                self.gathered = Some(part);
                return Ok(None);
            }
            (None, part @ MetricsPart(_)) => {
                self.gathered = Some(part);
                return Ok(None);
            }
            (Some(MetricsPart(mut all)), MetricsPart(more)) => {
                all.push_str(&more);
                self.gathered = Some(MetricsPart(all));
                return Ok(None);
            }
            (Some(MetricsPart(mut all)), Metrics(rest)) => {
                all.push_str(&rest);
                Metrics(all)
            }
            (None, whole) if self.pieces.is_empty() => whole,
            (None, got) => {
                return Err(crate::Error::UnfinishedAnswer {
                    part: "CheckpointPart",
                    got: got.name(),
                })
            }
            (Some(StreamsPart(mut all)), StreamsPart(more)) => {
                all.extend(more);
                self.gathered = Some(StreamsPart(all));
                return Ok(None);
            }
            (Some(ExecutionsPart(mut all)), ExecutionsPart(more)) => {
                all.extend(more);
                self.gathered = Some(ExecutionsPart(all));
                return Ok(None);
            }
            (Some(CheckpointsPart(mut all)), CheckpointsPart(more)) => {
                all.extend(more);
                self.gathered = Some(CheckpointsPart(all));
                return Ok(None);
            }
            (Some(StepsPart(mut all)), StepsPart(more)) => {
                all.extend(more);
                self.gathered = Some(StepsPart(all));
                return Ok(None);
            }
            (Some(CheckpointsFullPart(mut all)), CheckpointsFullPart(more)) => {
                all.extend(more);
                self.gathered = Some(CheckpointsFullPart(all));
                return Ok(None);
            }
            (Some(ExecutionsFullPart(mut all)), ExecutionsFullPart(more)) => {
                all.extend(more);
                self.gathered = Some(ExecutionsFullPart(all));
                return Ok(None);
            }
            (Some(ExecutionsFullPart(mut all)), ExecutionsFull(rest)) => {
                all.extend(rest);
                ExecutionsFull(all)
            }
            (Some(StepsPart(mut all)), Steps(rest)) => {
                all.extend(rest);
                Steps(all)
            }
            (Some(CheckpointsFullPart(mut all)), CheckpointsFull(rest)) => {
                all.extend(rest);
                CheckpointsFull(all)
            }
            (Some(StreamsPart(mut all)), Streams(rest)) => {
                all.extend(rest);
                Streams(all)
            }
            (Some(ExecutionsPart(mut all)), Executions(rest)) => {
                all.extend(rest);
                Executions(all)
            }
            (Some(CheckpointsPart(mut all)), Checkpoints(rest)) => {
                all.extend(rest);
                Checkpoints(all)
            }
            (Some(part), got) => {
                return Err(crate::Error::UnfinishedAnswer {
                    part: part.name(),
                    got: got.name(),
                })
            }
        };
        Ok(Some(joined))
    }
}

/// The pieces of a checkpoint's data as one buffer.
fn concat(pieces: Vec<Bytes>) -> Bytes {
    let mut data = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
    for piece in pieces {
        data.extend_from_slice(&piece);
    }
    data.freeze()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{Checkpoint, CheckpointMeta, StreamInfo};

    fn stream(name: &str) -> StreamInfo {
        StreamInfo {
            name: name.into(),
            first_seq: 1,
            last_seq: 0,
            frames: 0,
            bytes: 0,
            consumers: vec![],
        }
    }

    fn names(response: &Response) -> Vec<String> {
        match response {
            Response::Streams(list) => list.iter().map(|s| s.name.clone()).collect(),
            other => panic!("expected Streams, got {}", other.name()),
        }
    }

    #[test]
    fn parts_are_joined_in_order_with_the_final_answer() {
        let mut joiner = Joiner::new();
        let parts = [
            Response::StreamsPart(vec![stream("a"), stream("b")]),
            Response::StreamsPart(vec![stream("c")]),
        ];
        for part in parts {
            assert!(joiner.push(part).unwrap().is_none());
        }
        let whole = joiner
            .push(Response::Streams(vec![stream("d")]))
            .unwrap()
            .unwrap();
        assert_eq!(names(&whole), ["a", "b", "c", "d"]);
        // The joiner is empty again: the next answer stands alone.
        let next = joiner.push(Response::Streams(vec![])).unwrap().unwrap();
        assert!(names(&next).is_empty());
    }

    #[test]
    fn an_answer_in_one_message_passes_through() {
        let mut joiner = Joiner::new();
        let whole = joiner
            .push(Response::Streams(vec![stream("x")]))
            .unwrap()
            .unwrap();
        assert_eq!(names(&whole), ["x"]);
    }

    #[test]
    fn checkpoint_pieces_are_joined_in_front_of_the_last() {
        let mut joiner = Joiner::new();
        for piece in ["ab", "cd"] {
            let part = Response::CheckpointPart(Bytes::from_static(piece.as_bytes()));
            assert!(joiner.push(part).unwrap().is_none());
        }
        let meta = CheckpointMeta {
            id: 1,
            seq: 2,
            schema_version: 3,
            size: 5,
            created_micros: 4,
            valid: true,
        };
        let last = Response::Checkpoint(Checkpoint {
            meta: meta.clone(),
            data: Bytes::from_static(b"e"),
        });
        let whole = joiner.push(last).unwrap().unwrap();
        assert_eq!(
            whole,
            Response::Checkpoint(Checkpoint {
                meta,
                data: Bytes::from_static(b"abcde"),
            })
        );
    }

    #[test]
    fn metrics_pieces_are_joined_in_front_of_the_rest() {
        let mut joiner = Joiner::new();
        for piece in ["a 1\n", "b 2\n"] {
            let part = Response::MetricsPart(piece.into());
            assert!(joiner.push(part).unwrap().is_none());
        }
        let whole = joiner
            .push(Response::Metrics("# EOF\n".into()))
            .unwrap()
            .unwrap();
        assert_eq!(whole, Response::Metrics("a 1\nb 2\n# EOF\n".into()));
    }

    #[test]
    fn a_part_followed_by_another_answer_is_refused() {
        let mut joiner = Joiner::new();
        joiner.push(Response::StreamsPart(vec![])).unwrap();
        let err = joiner.push(Response::Checkpoints(vec![])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a StreamsPart message was followed by Checkpoints, not the rest of its answer"
        );
        let mut joiner = Joiner::new();
        joiner.push(Response::CheckpointPart(Bytes::new())).unwrap();
        let err = joiner.push(Response::Streams(vec![])).unwrap_err();
        assert!(err.to_string().contains("CheckpointPart"), "{err}");
    }
}
