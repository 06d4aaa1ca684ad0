//! The session's subscription: opening or resuming it, and streaming its
//! events to the socket.
//!
//! A subscription runs in a pump task of its own that feeds a channel of
//! capacity [`SUBSCRIPTION_BACKLOG`], so reading from the store never has to
//! be cancelled by `select!`, and a slow client holds at most that many
//! batches here; everything else waits in the store.

use futures_util::SinkExt;
use tether_protocol::{
    validate_name, DurableResume, ErrorCode, Response, StartAt, Subscribe, Subscribed,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::write::write_failed;
use super::{Refusal, Session};
use crate::engine::Queue;
use crate::subscription::{SubEvent, Subscription, WireForm};
use crate::Error;

/// Subscription events buffered between the pump and the socket.
const SUBSCRIPTION_BACKLOG: usize = 1;

/// The open subscription of a session.
pub(super) struct ActiveSubscription {
    pub(super) stream: String,
    pub(super) consumer: Option<String>,
    durable: bool,
    /// `None` once a non-following subscription has sent `End`; the
    /// subscription still names the consumer its acks are for.
    pub(super) events: Option<mpsc::Receiver<crate::Result<SubEvent>>>,
    _pump: AbortOnDropHandle<()>,
}

impl Session {
    pub(super) async fn open_subscription(&mut self, req: Subscribe) -> Result<(), Refusal> {
        self.check_subscribable(&req.stream, req.consumer.as_deref())?;
        let queue = &self.shared.queue;
        let (first, last) = range_of(queue, &req.stream)?;
        if !self.durable {
            // Plain clients get live frames from now on and no replay.
            let sub = queue.subscribe_live(&req.stream)?;
            return self.attach(sub, req.stream, None, first, last).await;
        }
        let stored_ack = match &req.consumer {
            Some(consumer) => Some(queue.open_consumer(&req.stream, consumer).await?),
            None => None,
        };
        let after = match req.start {
            StartAt::Oldest => first.saturating_sub(1),
            StartAt::Last(n) => last.saturating_sub(n).max(first.saturating_sub(1)),
            StartAt::Now => last,
            StartAt::ConsumerAck => stored_ack.ok_or_else(|| {
                Refusal::new(
                    ErrorCode::INVALID_REQUEST,
                    "StartAt::ConsumerAck needs a consumer name",
                )
            })?,
        };
        let sub = queue.subscribe(&req.stream, after, req.follow)?;
        self.attach(sub, req.stream, req.consumer, first, last)
            .await
    }

    pub(super) async fn resume_subscription(&mut self, req: DurableResume) -> Result<(), Refusal> {
        if !self.durable {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                "DurableResume needs the durable capability in Hello",
            ));
        }
        self.check_subscribable(&req.stream, req.consumer.as_deref())?;
        let queue = &self.shared.queue;
        let (first, last) = range_of(queue, &req.stream)?;
        if let Some(consumer) = &req.consumer {
            queue.open_consumer(&req.stream, consumer).await?;
        }
        let sub = queue.subscribe(&req.stream, req.acked_through, req.follow)?;
        self.attach(sub, req.stream, req.consumer, first, last)
            .await
    }

    fn check_subscribable(&self, stream: &str, consumer: Option<&str>) -> Result<(), Refusal> {
        if let Some(sub) = &self.subscription {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "this connection already has a subscription (stream {:?}); open another connection",
                    sub.stream
                ),
            ));
        }
        validate_name("stream", stream)?;
        if let Some(consumer) = consumer {
            validate_name("consumer", consumer)?;
        }
        Ok(())
    }

    /// Starts the pump task for `sub` and confirms the subscription.
    async fn attach(
        &mut self,
        mut sub: Subscription,
        stream: String,
        consumer: Option<String>,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<(), Refusal> {
        sub.encode_as(if self.durable {
            WireForm::Durable
        } else {
            WireForm::Live
        });
        let (tx, events) = mpsc::channel(SUBSCRIPTION_BACKLOG);
        let pump = tokio::spawn(async move {
            loop {
                let event = sub.next().await;
                let last = matches!(event, Ok(SubEvent::End { .. }) | Err(_));
                if tx.send(event).await.is_err() || last {
                    break;
                }
            }
        });
        self.subscription = Some(ActiveSubscription {
            stream,
            consumer,
            durable: self.durable,
            events: Some(events),
            _pump: AbortOnDropHandle::new(pump),
        });
        self.send_all(vec![Response::Subscribed(Subscribed {
            first_seq,
            last_seq,
        })])
        .await
    }

    pub(super) async fn deliver(
        &mut self,
        event: Option<crate::Result<SubEvent>>,
    ) -> Result<(), Refusal> {
        let durable = self.subscription.as_ref().is_some_and(|s| s.durable);
        match event {
            Some(Ok(SubEvent::Encoded { wire, .. })) => {
                // Whatever the codec holds goes first; the read's frames
                // then go to the socket as they are.
                self.out.flush().await.map_err(write_failed)?;
                self.out
                    .get_mut()
                    .write_all(&wire)
                    .await
                    .map_err(|e| write_failed(e.into()))
            }
            // A plain (non-durable) client has no seqs to make sense of a
            // gap; it simply sees the next live frame.
            Some(Ok(SubEvent::Gap(_))) if !durable => Ok(()),
            Some(Ok(SubEvent::Gap(gap))) => self.send_all(vec![Response::Gap(gap)]).await,
            Some(Ok(SubEvent::End { last_seq })) => {
                // Nothing more will be delivered, but the session stays
                // open and the consumer may still ack what it received.
                if let Some(sub) = &mut self.subscription {
                    sub.events = None;
                }
                self.send_all(vec![Response::End { last_seq }]).await
            }
            Some(Err(e)) => Err(e.into()),
            // `attach` has every subscription deliver encoded frames;
            // frames as values are for the engine's own readers.
            Some(Ok(SubEvent::Frames(_))) => Err(Refusal::new(
                ErrorCode::INTERNAL,
                "the subscription delivered frames unencoded",
            )),
            None => Err(Refusal::new(
                ErrorCode::INTERNAL,
                "the subscription stopped unexpectedly",
            )),
        }
    }
}

/// Waits for the subscription's next event. Only polled while one exists.
pub(super) async fn recv_event(
    subscription: &mut Option<ActiveSubscription>,
) -> Option<crate::Result<SubEvent>> {
    match subscription.as_mut().and_then(|s| s.events.as_mut()) {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

fn range_of(queue: &Queue, stream: &str) -> Result<(u64, u64), Refusal> {
    queue
        .stream_range(stream)
        .ok_or_else(|| Error::StreamNotFound(stream.to_owned()).into())
}
