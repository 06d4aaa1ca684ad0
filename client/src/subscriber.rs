//! A reconnecting reader of one stream that yields each frame exactly once.
//!
//! The subscriber remembers the last seq it yielded. When the session is
//! lost it reconnects (with backoff, within the retry window) and sends
//! `DurableResume { acked_through: last yielded }`, so the daemon continues
//! with the next seq and nothing is yielded twice or skipped.
//!
//! Within a session every frame must carry the seq after the previous one.
//! Anything else is treated as a gap to resync from: the session is dropped
//! and resumed after the last yielded seq. It is never treated as a
//! duplicate to skip, because a wrong seq means the daemon and the client
//! disagree about the position, and only a resume re-establishes it. The
//! one legitimate jump is announced by a `Gap` notice (frames compacted
//! away); after it the next seq is the notice's `first_available`. Gap
//! notices are yielded to the caller, never swallowed.
//!
//! A subscriber opened with a consumer name can acknowledge what it has
//! processed ([`Subscriber::ack`]); acks let the daemon compact, and
//! [`Subscriber::wait_acked`] waits until the last one is durable.

use tether_protocol::{
    validate_name, DurableAck, DurableResume, Frame, Gap, Request, Response, StartAt, Subscribe,
    Subscribed,
};

use crate::conn::{unexpected, Connection, Connector, Link};
use crate::error::{Error, Result};

/// Resyncs in a row without yielding anything before the daemon is deemed
/// to be misbehaving rather than unlucky.
const MAX_RESYNCS: u32 = 5;

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest retained frame.
    Oldest,
    /// The last `n` frames.
    Last(u64),
    /// Right after seq `k`: the first frame is `k + 1` (or a gap notice).
    After(u64),
    /// After the named consumer's stored ack.
    ConsumerAck,
    /// Only frames stored from now on.
    Now,
}

impl Start {
    /// Where a reader starts, first match wins: after the position kept in
    /// its cursor file, at `from_seq`, at the last `last` frames, after
    /// the consumer's stored ack (when it reads as one), else the oldest
    /// retained frame. So a first run can be pointed somewhere and later
    /// runs carry on from the cursor file. `tether tail` and the SDKs
    /// share this order.
    pub fn choose(
        cursor: Option<u64>,
        from_seq: Option<u64>,
        last: Option<u64>,
        consumer: bool,
    ) -> Start {
        if let Some(seq) = cursor {
            Start::After(seq)
        } else if let Some(seq) = from_seq {
            Start::After(seq.saturating_sub(1))
        } else if let Some(n) = last {
            Start::Last(n)
        } else if consumer {
            Start::ConsumerAck
        } else {
            Start::Oldest
        }
    }
}

/// `stream S: frames 5..9 were compacted or lost; continuing at 10`: a gap
/// notice in words, as `tether tail` prints it and the SDKs warn it.
pub fn gap_message(stream: &str, gap: &Gap) -> String {
    let last_missing = gap.first_available.saturating_sub(1);
    let what = if last_missing <= gap.requested {
        format!("frame {} was", gap.requested)
    } else {
        format!("frames {}..{last_missing} were", gap.requested)
    };
    format!(
        "stream {stream}: {what} compacted or lost; continuing at {}",
        gap.first_available
    )
}

/// What to read and how.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// The stream to read.
    pub stream: String,
    /// Where to start.
    pub start: Start,
    /// Keep following new frames instead of ending after the current last.
    pub follow: bool,
    /// Read as this durable consumer: its acks are stored and hold back
    /// compaction. Required for [`Start::ConsumerAck`] and acks.
    pub consumer: Option<String>,
}

/// What a subscriber yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A stored frame.
    Frame {
        /// Its seq in the stream.
        seq: u64,
        /// The frame.
        frame: Frame,
    },
    /// Frames from `requested` up to `first_available - 1` were compacted
    /// away (or lost to damage and recorded so by `tetherd repair`); the
    /// next frame is `first_available`.
    Gap(Gap),
    /// A non-following subscription has yielded everything through
    /// `last_seq`. Nothing follows.
    End {
        /// The stream's last seq when the subscription was opened.
        last_seq: u64,
    },
}

/// Where to pick up after a lost session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// Nothing yielded yet: repeat the original request.
    Original,
    /// Continue after this seq.
    After(u64),
}

/// Reads one stream; see the module docs.
#[derive(Debug)]
pub struct Subscriber {
    link: Link,
    options: SubscribeOptions,
    resume: Resume,
    /// True while the current session's subscription is open.
    subscribed: bool,
    /// The seq the current session must deliver next; `None` until the
    /// first frame when the daemon chose the start (a consumer's ack).
    expect: Option<u64>,
    last_yielded: Option<u64>,
    range: Option<Subscribed>,
    ended: bool,
    resyncs: u32,
    /// Highest ack asked for by the caller.
    ack_wanted: u64,
    /// Highest ack written on the current session.
    ack_sent: u64,
    /// Highest ack the daemon confirmed durable.
    ack_durable: u64,
}

impl Subscriber {
    /// Opens the subscription: connects (retrying within the retry window)
    /// and waits for the daemon to confirm it. A missing stream is an
    /// [`Error::Daemon`] with [`tether_protocol::ErrorCode::NOT_FOUND`].
    pub async fn open(connector: Connector, options: SubscribeOptions) -> Result<Self> {
        validate_name("stream", &options.stream)?;
        if let Some(consumer) = &options.consumer {
            validate_name("consumer", consumer)?;
        }
        if options.start == Start::ConsumerAck && options.consumer.is_none() {
            return Err(Error::Usage(
                "starting at a consumer's ack needs a consumer name".into(),
            ));
        }
        let mut subscriber = Self {
            link: Link::new(connector),
            options,
            resume: Resume::Original,
            subscribed: false,
            expect: None,
            last_yielded: None,
            range: None,
            ended: false,
            resyncs: 0,
            ack_wanted: 0,
            ack_sent: 0,
            ack_durable: 0,
        };
        subscriber.ensure_subscribed().await?;
        Ok(subscriber)
    }

    /// The stream's retained range when the current session subscribed.
    pub fn range(&self) -> Option<Subscribed> {
        self.range
    }

    /// The last seq yielded, if any.
    pub fn last_yielded(&self) -> Option<u64> {
        self.last_yielded
    }

    /// The options the subscription was opened with.
    pub fn options(&self) -> &SubscribeOptions {
        &self.options
    }

    /// The next event, waiting for it if needed; `None` after
    /// [`Event::End`]. Survives lost sessions and daemon restarts within
    /// the retry window.
    ///
    /// Cancel-safe: if the future is dropped (say, in `select!` against a
    /// signal), no event is lost and the next call carries on.
    pub async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if self.ended {
                return Ok(None);
            }
            self.ensure_subscribed().await?;
            self.queue_ack()?;
            let Some(conn) = self.link.connection() else {
                continue;
            };
            let answer = match conn.flush_or_recv().await {
                Ok(Some(response)) => Ok(response),
                Ok(None) => conn.recv().await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(response) => {
                    if let Some(event) = self.absorb(response)? {
                        return Ok(Some(self.yielded(event)));
                    }
                }
                Err(e) => self.lose(e)?,
            }
        }
    }

    /// The next event if it is already available without waiting. `None`
    /// says only that nothing is ready now; it never reconnects.
    pub fn try_next(&mut self) -> Result<Option<Event>> {
        loop {
            if self.ended || !self.subscribed {
                return Ok(None);
            }
            let Some(conn) = self.link.connection() else {
                return Ok(None);
            };
            match conn.try_recv() {
                None => return Ok(None),
                Some(Ok(response)) => {
                    if let Some(event) = self.absorb(response)? {
                        return Ok(Some(self.yielded(event)));
                    }
                }
                Some(Err(e)) => {
                    self.lose(e)?;
                    return Ok(None);
                }
            }
        }
    }

    /// Acknowledges every frame through `through` for the consumer. On a
    /// following subscription the ack is written with the next call to
    /// [`Subscriber::next`]; a non-following one has its session end with
    /// the subscription, so its acks are sent by
    /// [`Subscriber::wait_acked`].
    pub fn ack(&mut self, through: u64) -> Result<()> {
        if self.options.consumer.is_none() {
            return Err(Error::Usage(
                "acks need a subscription opened with a consumer name".into(),
            ));
        }
        match self.last_yielded {
            Some(last) if through <= last => {
                self.ack_wanted = self.ack_wanted.max(through);
                Ok(())
            }
            _ => Err(Error::Usage(format!(
                "cannot ack seq {through}: it has not been yielded yet"
            ))),
        }
    }

    /// The highest ack the daemon has confirmed durable.
    pub fn acked_durable(&self) -> u64 {
        self.ack_durable
    }

    /// Waits until the last ack asked for is durable. It is confirmed on a
    /// short session of its own (which also works after the subscription
    /// has ended), retried within the retry window.
    pub async fn wait_acked(&mut self) -> Result<()> {
        let through = self.ack_wanted;
        if through <= self.ack_durable {
            return Ok(());
        }
        let Some(consumer) = self.options.consumer.clone() else {
            return Ok(());
        };
        let mut link = Link::new(self.link.connector().clone());
        // A following subscription keeps the ack valid for as long as the
        // session lives; the frames it sends meanwhile are ignored.
        let resume = Request::DurableResume(DurableResume {
            stream: self.options.stream.clone(),
            acked_through: through,
            follow: true,
            consumer: Some(consumer),
        });
        let ack = Request::DurableAck(DurableAck {
            through_seq: through,
        });
        loop {
            link.establish().await?;
            let Some(conn) = link.connection() else {
                continue;
            };
            conn.queue(&resume)?;
            conn.queue(&ack)?;
            let confirmed = await_ack(conn, through).await;
            match confirmed {
                Ok(()) => {
                    self.ack_durable = self.ack_durable.max(through);
                    return Ok(());
                }
                Err(e) => link.lose(e)?,
            }
        }
    }

    /// Opens the subscription on a session, reconnecting as needed.
    async fn ensure_subscribed(&mut self) -> Result<()> {
        while !self.subscribed {
            if self.link.connection().is_some() {
                // A subscribe on this session was interrupted midway; its
                // state is unknown, so start over on a new session.
                self.link.lose(Error::Resync {
                    reason: "an interrupted subscribe".into(),
                })?;
            }
            self.link.establish().await?;
            let request = self.subscribe_request();
            let Some(conn) = self.link.connection() else {
                continue;
            };
            match conn.request(&request).await {
                Ok(Response::Subscribed(range)) => self.on_subscribed(range),
                Ok(other) => return Err(unexpected("Subscribed", &other)),
                Err(e) => self.lose(e)?,
            }
        }
        Ok(())
    }

    fn subscribe_request(&self) -> Request {
        let o = &self.options;
        let resume_after = |k: u64| {
            Request::DurableResume(DurableResume {
                stream: o.stream.clone(),
                acked_through: k,
                follow: o.follow,
                consumer: o.consumer.clone(),
            })
        };
        let subscribe = |start: StartAt| {
            Request::Subscribe(Subscribe {
                stream: o.stream.clone(),
                start,
                follow: o.follow,
                consumer: o.consumer.clone(),
            })
        };
        match (self.resume, o.start) {
            (Resume::After(k), _) | (Resume::Original, Start::After(k)) => resume_after(k),
            (Resume::Original, Start::Oldest) => subscribe(StartAt::Oldest),
            (Resume::Original, Start::Last(n)) => subscribe(StartAt::Last(n)),
            (Resume::Original, Start::ConsumerAck) => subscribe(StartAt::ConsumerAck),
            (Resume::Original, Start::Now) => subscribe(StartAt::Now),
        }
    }

    fn on_subscribed(&mut self, range: Subscribed) {
        self.subscribed = true;
        self.range = Some(range);
        self.link.recovered();
        // An ack written on the old session may not have arrived: send the
        // wanted one again on this session.
        self.ack_sent = self.ack_durable;
        self.expect = match (self.resume, self.options.start) {
            (Resume::After(k), _) | (Resume::Original, Start::After(k)) => Some(k + 1),
            (Resume::Original, Start::Oldest) => Some(range.first_seq),
            (Resume::Original, Start::Last(n)) => {
                Some(range.first_seq.max((range.last_seq + 1).saturating_sub(n)))
            }
            (Resume::Original, Start::Now) => Some(range.last_seq + 1),
            (Resume::Original, Start::ConsumerAck) => None,
        };
        // "The last N" and "from now" are positions at the time of the
        // first subscribe; a reconnect must not move them.
        if let (Resume::Original, Start::Last(_) | Start::Now, Some(next)) =
            (self.resume, self.options.start, self.expect)
        {
            self.resume = Resume::After(next - 1);
        }
    }

    /// Writes the wanted ack on a following session if it is not there yet.
    fn queue_ack(&mut self) -> Result<()> {
        if !self.options.follow || self.ack_wanted <= self.ack_sent {
            return Ok(());
        }
        if let Some(conn) = self.link.connection() {
            conn.queue(&Request::DurableAck(DurableAck {
                through_seq: self.ack_wanted,
            }))?;
            self.ack_sent = self.ack_wanted;
        }
        Ok(())
    }

    /// Checks one response against the position and turns it into an
    /// event to yield, if it is one.
    fn absorb(&mut self, response: Response) -> Result<Option<Event>> {
        match response {
            Response::Durable(durable) => {
                if let Some(expected) = self.expect {
                    if durable.seq != expected {
                        let reason =
                            format!("got seq {} where {expected} was expected", durable.seq);
                        self.resync(reason)?;
                        return Ok(None);
                    }
                }
                self.expect = Some(durable.seq + 1);
                Ok(Some(Event::Frame {
                    seq: durable.seq,
                    frame: durable.frame,
                }))
            }
            Response::Gap(gap) => {
                let wrong_start = self.expect.is_some_and(|e| e != gap.requested);
                if wrong_start || gap.first_available < gap.requested {
                    let reason = format!(
                        "a gap notice for {}..{} where seq {:?} was expected",
                        gap.requested, gap.first_available, self.expect
                    );
                    self.resync(reason)?;
                    return Ok(None);
                }
                self.expect = Some(gap.first_available);
                Ok(Some(Event::Gap(gap)))
            }
            Response::End { last_seq } => {
                if let Some(expected) = self.expect.filter(|&e| e <= last_seq) {
                    let reason =
                        format!("End at seq {last_seq} before seq {expected} was delivered");
                    self.resync(reason)?;
                    return Ok(None);
                }
                Ok(Some(Event::End { last_seq }))
            }
            Response::Acked(acked) => {
                self.ack_durable = self.ack_durable.max(acked.through_seq);
                Ok(None)
            }
            other => Err(unexpected("Durable, Gap, End or Acked", &other)),
        }
    }

    /// Bookkeeping for an event handed to the caller.
    fn yielded(&mut self, event: Event) -> Event {
        match &event {
            Event::Frame { seq, .. } => {
                self.resume = Resume::After(*seq);
                self.last_yielded = Some(*seq);
                self.resyncs = 0;
                self.link.progressed();
            }
            Event::Gap(gap) => self.resume = Resume::After(gap.first_available.saturating_sub(1)),
            Event::End { .. } => self.ended = true,
        }
        event
    }

    /// Drops the session so that the next call resumes after the last
    /// yielded seq.
    fn resync(&mut self, reason: String) -> Result<()> {
        self.resyncs += 1;
        if self.resyncs > MAX_RESYNCS {
            return Err(Error::Protocol(format!(
                "stream {:?}: {reason}, again after {MAX_RESYNCS} resumes",
                self.options.stream
            )));
        }
        tracing::debug!(stream = %self.options.stream, "resuming: {reason}");
        self.lose(Error::Resync { reason })
    }

    fn lose(&mut self, cause: Error) -> Result<()> {
        self.subscribed = false;
        self.link.lose(cause)
    }
}

/// Reads answers until an `Acked` covering `through` arrives; everything
/// else on the session is ignored.
async fn await_ack(conn: &mut Connection, through: u64) -> Result<()> {
    loop {
        let response = match conn.flush_or_recv().await? {
            Some(response) => response,
            None => conn.recv().await?,
        };
        if let Response::Acked(acked) = response {
            if acked.through_seq >= through {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_messages_name_the_missing_range_and_the_next_seq() {
        let gap = Gap {
            requested: 5,
            first_available: 10,
        };
        assert_eq!(
            gap_message("s", &gap),
            "stream s: frames 5..9 were compacted or lost; continuing at 10"
        );
        let gap = Gap {
            requested: 5,
            first_available: 6,
        };
        assert_eq!(
            gap_message("s", &gap),
            "stream s: frame 5 was compacted or lost; continuing at 6"
        );
    }

    #[test]
    fn a_cursor_wins_then_from_seq_then_last_then_the_consumer() {
        assert_eq!(
            Start::choose(Some(7), Some(3), Some(2), true),
            Start::After(7)
        );
        assert_eq!(Start::choose(None, Some(3), Some(2), true), Start::After(2));
        assert_eq!(Start::choose(None, Some(0), None, false), Start::After(0));
        assert_eq!(Start::choose(None, None, Some(2), true), Start::Last(2));
        assert_eq!(Start::choose(None, None, None, true), Start::ConsumerAck);
        assert_eq!(Start::choose(None, None, None, false), Start::Oldest);
    }
}
