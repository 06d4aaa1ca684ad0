//! Serving questions and inboxes (see [`crate::gates`]). A request that
//! waits (`AwaitAnswer`, `ListQuestions`, `Recv`) gives up when the client
//! hangs up or the daemon shuts down, so neither waits for it.

use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use tether_protocol::{max_payload_len, validate_name, Answerer, Request, Response};
use tokio::io::Interest;

use super::{parts, Refusal, Session};
use crate::gates::{inbox, questions};
use crate::{access, Error};

/// How often a waiting session whose socket stays readable looks for its
/// client having hung up.
const HANG_UP_CHECK: Duration = Duration::from_secs(1);

/// True once the peer of `stream` has closed or shut down its side.
fn peer_closed(stream: &tokio::net::UnixStream) -> bool {
    let mut fds = [PollFd::new(stream, PollFlags::RDHUP)];
    // A zero timeout never blocks.
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&now)).is_ok_and(|ready| {
        ready > 0
            && fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
    })
}

impl Session {
    /// Serves one of the seven requests of questions and inboxes.
    pub(super) async fn serve_gate(&mut self, request: Request) -> Result<(), Refusal> {
        let shared = self.shared.clone();
        let queue = &shared.queue;
        match request {
            Request::Ask(spec) => {
                validate_name("execution", &spec.execution)?;
                let info = questions::ask(queue, &shared.supervisor, spec).await?;
                self.send_all(vec![Response::Question(info)]).await
            }
            Request::AwaitAnswer { question, wait_ms } => {
                let info = self
                    .until_gone(questions::await_answer(queue, question, wait_ms))
                    .await??;
                self.send_all(vec![Response::Question(info)]).await
            }
            Request::Answer(spec) => {
                validate_name("execution", &spec.execution)?;
                let by = self.answerer().await;
                let info = questions::answer(queue, spec, by).await?;
                self.send_all(vec![Response::Question(info)]).await
            }
            Request::ListQuestions {
                all,
                execution,
                after,
                wait_ms,
            } => {
                let execution = execution.map(|e| shared.supervisor.resolve(&e));
                let found = questions::list(queue, all, execution.as_deref(), after, wait_ms);
                let found = self.until_gone(found).await?;
                self.send_all(parts::questions(found, self.max_frame_len())?)
                    .await
            }
            Request::Send { execution, message } => {
                validate_name("execution", &execution)?;
                let limits = inbox::Limits {
                    max_messages: shared.config.inbox_max_messages,
                    max_bytes: max_payload_len(self.max_frame_len()),
                };
                let uid = self.peer.uid();
                let id = inbox::send(queue, &shared.supervisor, &execution, message, uid, limits)
                    .await?;
                self.send_all(vec![Response::Queued { id }]).await
            }
            Request::Recv {
                execution,
                max,
                wait_ms,
            } => {
                validate_name("execution", &execution)?;
                // An unknown execution is an error, not an empty inbox.
                shared.supervisor.get(&execution)?;
                let max_bytes = max_payload_len(self.max_frame_len());
                let received = inbox::recv(queue, &execution, max, wait_ms, max_bytes);
                let messages = self.until_gone(received).await??;
                self.send_all(vec![Response::Messages(messages)]).await
            }
            Request::Dequeue { execution, through } => {
                validate_name("execution", &execution)?;
                let removed = inbox::dequeue(queue, &execution, through).await?;
                self.send_all(vec![Response::Dequeued(removed)]).await
            }
            other => Err(Refusal::new(
                tether_protocol::ErrorCode::INTERNAL,
                format!("{} is not a request of questions or inboxes", other.name()),
            )),
        }
    }

    /// Runs `wait` unless the client hangs up (the session then ends with
    /// nobody to answer) or the daemon shuts down.
    async fn until_gone<T>(
        &mut self,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, Refusal> {
        let stream: &tokio::net::UnixStream = self.out.get_ref().as_ref();
        let shutdown = &self.shutdown;
        let hung_up = async {
            match stream.ready(Interest::READABLE).await {
                Ok(ready) if ready.is_read_closed() => return,
                Err(_) => return,
                Ok(_) => {}
            }
            // Readable without being closed: the client sent more, or the
            // last read left the socket marked readable. Only the kernel
            // can say which; asked now and then.
            let mut every = tokio::time::interval(HANG_UP_CHECK);
            loop {
                every.tick().await;
                if peer_closed(stream) {
                    return;
                }
            }
        };
        tokio::select! {
            value = wait => Ok(value),
            () = hung_up => {
                let mut refusal = Refusal::from(Error::InvalidRequest("the client hung up".into()));
                refusal.client_gone = true;
                Err(refusal)
            }
            () = shutdown.cancelled() => Err(Error::ShuttingDown.into()),
        }
    }

    /// Who answers, by this connection's credentials: the uid and the
    /// user's name, when the name services know it.
    async fn answerer(&mut self) -> Answerer {
        let uid = self.peer.uid();
        let known = self.peer.user.clone();
        let name = match (known, uid) {
            (Some(name), _) => Some(name),
            (None, 0) => Some("root".to_owned()),
            (None, uid) => tokio::task::spawn_blocking(move || access::user_name(uid))
                .await
                .ok()
                .flatten(),
        };
        Answerer::User { uid, name }
    }
}
