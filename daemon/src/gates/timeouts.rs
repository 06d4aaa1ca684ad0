//! Closing questions at their deadline: one task for all of them, asleep
//! until the soonest deadline or until a question is recorded or closed.
//! Overdue ones (a daemon that was down) close as soon as it starts.

use std::time::Duration;

use tether_protocol::Answerer;
use tokio_util::sync::CancellationToken;

use super::questions::close;
use crate::engine::Queue;
use tether_protocol::time::now_micros;

/// How long to wait before trying again after a close failed (a degraded
/// store): the task must not spin.
const RETRY: Duration = Duration::from_secs(1);

/// Runs until `shutdown`.
pub async fn run(queue: Queue, shutdown: CancellationToken) {
    let gates = queue.gates();
    let mut changed = gates.watch_questions();
    loop {
        changed.borrow_and_update();
        let now = now_micros();
        let (overdue, next) = gates.deadlines(now);
        let mut failed = false;
        for id in overdue {
            if shutdown.is_cancelled() {
                return;
            }
            if let Err(e) = time_out(&queue, id).await {
                tracing::warn!(
                    question = id,
                    "cannot close the question at its timeout: {e}"
                );
                failed = true;
            }
        }
        let sleep = match next {
            _ if failed => RETRY,
            Some(deadline) => Duration::from_micros(deadline - now),
            None => Duration::MAX,
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            result = changed.changed() => if result.is_err() { return },
            () = tokio::time::sleep(sleep.min(Duration::from_secs(3600))) => {}
        }
    }
}

/// Closes question `id` as timed out, with its default, if still open.
async fn time_out(queue: &Queue, id: u64) -> crate::Result<()> {
    let gates = queue.gates();
    let _turn = gates.changing.lock().await;
    let Some(record) = gates.record(id).filter(|r| r.is_open()) else {
        return Ok(());
    };
    let default = record.info.default.clone();
    let info = close(queue, record, default, Answerer::Timeout).await?;
    tracing::info!(execution = %info.execution, question = id, "question timed out");
    Ok(())
}
