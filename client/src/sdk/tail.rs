//! [`Tail`]: a stream read in batches for a binding to hand out one frame
//! at a time.
//!
//! A binding asks for a batch only when it has handed out the last one, so
//! the cost of crossing into async code (and, in Python, of releasing the
//! GIL) is paid per batch, not per frame. What counts as processed is the
//! binding's call: it calls [`Tail::mark_processed`] with a frame's seq
//! once the caller has finished with it (Python: when the next frame is
//! asked for), and only then is the seq written to the cursor file and
//! acked for a consumer. A crash in between reads that frame again; a
//! daemon restart reads nothing twice.

use std::path::PathBuf;

use tether_protocol::Frame;

use crate::cursor;
use crate::error::Result;
use crate::subscriber::{gap_message, Event, Subscriber};

/// What to read and where to start; see [`crate::subscriber::Start::choose`]
/// for which of the starting points wins.
#[derive(Debug, Clone, Default)]
pub struct TailOptions {
    /// The stream to read.
    pub stream: String,
    /// Keep following new frames instead of ending after the last one.
    pub follow: bool,
    /// Start at this seq.
    pub from_seq: Option<u64>,
    /// Start at the last this many frames.
    pub last: Option<u64>,
    /// Resume after the seq kept in this file, and keep it up to date.
    pub cursor_file: Option<PathBuf>,
    /// Read as this durable consumer: resume after its stored ack and ack
    /// what is processed.
    pub consumer: Option<String>,
}

/// One thing a tail hands out, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailItem {
    /// A stored frame and its seq.
    Frame { seq: u64, frame: Frame },
    /// Frames were compacted or lost here; the words say which.
    Gap(String),
}

/// A reader of one stream; see the module docs.
#[derive(Debug)]
pub struct Tail {
    /// `None` once closed or abandoned.
    sub: Option<Subscriber>,
    stream: String,
    cursor_file: Option<PathBuf>,
    acks: bool,
    /// The daemon said the stream has nothing more (without `follow`); the
    /// batch that carried the last frames has been handed out.
    ended: bool,
}

impl Tail {
    pub(super) fn new(sub: Subscriber, options: TailOptions) -> Self {
        Self {
            sub: Some(sub),
            acks: options.consumer.is_some(),
            stream: options.stream,
            cursor_file: options.cursor_file,
            ended: false,
        }
    }

    /// The stream being read.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// True when a processed frame must be recorded somewhere (a cursor
    /// file or a consumer's ack): a binding may skip the call otherwise.
    pub fn records_progress(&self) -> bool {
        self.cursor_file.is_some() || self.acks
    }

    /// Records every frame through `seq` as processed: replaces the cursor
    /// file and, for a consumer, acks (sent with the next read, durable by
    /// [`Tail::close`]).
    pub fn mark_processed(&mut self, seq: u64) -> Result<()> {
        if let Some(path) = &self.cursor_file {
            cursor::write(path, seq)?;
        }
        if let (true, Some(sub)) = (self.acks, self.sub.as_mut()) {
            sub.ack(seq)?;
        }
        Ok(())
    }

    /// Waits for the next frames and returns those ready, at most `max`
    /// (at least one item); `None` when the stream has ended (without
    /// `follow`) or the tail was closed. Survives daemon restarts within
    /// the retry window.
    ///
    /// Cancel-safe: the only wait is for the first item, so a binding may
    /// drop the future (to look at signals) and call again.
    pub async fn next_batch(&mut self, max: usize) -> Result<Option<Vec<TailItem>>> {
        if self.ended {
            self.close().await?;
            return Ok(None);
        }
        let Some(sub) = self.sub.as_mut() else {
            return Ok(None);
        };
        let mut batch = Vec::new();
        let mut next = sub.next().await?;
        loop {
            match next {
                Some(Event::Frame { seq, frame }) => batch.push(TailItem::Frame { seq, frame }),
                Some(Event::Gap(gap)) => batch.push(TailItem::Gap(gap_message(&self.stream, &gap))),
                Some(Event::End { .. }) | None => {
                    self.ended = true;
                    break;
                }
            }
            if batch.len() >= max.max(1) {
                break;
            }
            next = match sub.try_next()? {
                Some(event) => Some(event),
                None => break,
            };
        }
        if batch.is_empty() {
            self.close().await?;
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Ends the reading; for a consumer, once its last ack is durable.
    pub async fn close(&mut self) -> Result<()> {
        if let Some(mut sub) = self.sub.take() {
            if self.acks {
                sub.wait_acked().await?;
            }
        }
        Ok(())
    }

    /// Ends the reading without waiting for anything: what was handed out
    /// but not marked processed is read again next time.
    pub fn abandon(&mut self) {
        self.sub = None;
    }
}
