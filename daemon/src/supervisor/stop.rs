//! `tether stop`: the run's stop signal (`run --stop-signal`, SIGTERM by
//! default), SIGKILL after the timeout, and the shim itself when even that
//! is not reported; the execution ends `cancelled`.
//!
//! A stop is recorded in the manifest first. Then the worker's process
//! group gets the stop signal (the worker alone when it leads no group),
//! and so does the rest of the shim's session. After the
//! timeout the worker and the rest of the shim's session get SIGKILL. If
//! no exit is reported [`KILL_GRACE`] after that, the shim itself is
//! killed. `pending` and `backoff` executions are cancelled at once.

use std::sync::Arc;
use std::time::Duration;

use tether_protocol::ExecState;
use tokio::sync::watch;

use super::manifest::{Manifest, StopRequest};
use super::policy::Ending;
use super::{
    now_micros, policy, state, sweep_session, terminate_worker, Change, Execution, Inner,
    KILL_GRACE,
};
use crate::Result;

impl Inner {
    // -- stop ------------------------------------------------------------------

    /// Records a stop and sends SIGTERM; returns a receiver of the state to
    /// wait on for the end.
    pub(super) async fn request_stop(
        self: Arc<Self>,
        id: &str,
        timeout: Duration,
    ) -> Result<watch::Receiver<Option<Manifest>>> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let ended = slot.committed.subscribe();
        let m = &exec.manifest;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let request = StopRequest {
            requested_micros: now_micros(),
            timeout_ms,
        };
        match m.state {
            s if state::is_final(s) => {}
            ExecState::Pending | ExecState::Backoff => {
                tracing::info!(execution = %id, "stop: cancelling before the next attempt starts");
                let mut change = Change::of(m);
                change.go(ExecState::Cancelled, "cancelled")?;
                change.next.stop = Some(request);
                change.next.next_attempt_micros = None;
                change.next.reason = Some("stopped on request".into());
                self.commit(&slot, &mut exec, change).await?;
            }
            _ if m.stop.is_some() => {
                tracing::info!(execution = %id, "stop: already stopping");
            }
            _ => {
                let signal = m.stop_signal();
                let name = tether_protocol::signal_name(signal);
                tracing::info!(execution = %id, "stop: {name}, SIGKILL after {timeout:?}");
                let mut change = Change::of(m);
                change.note(format!(
                    "stopping: {name}, then SIGKILL after {}",
                    policy::human(timeout)
                ));
                change.next.stop = Some(request);
                self.commit(&slot, &mut exec, change).await?;
                terminate_worker(&exec, signal);
                self.arm_stop(&mut exec, request);
            }
        }
        Ok(ended)
    }

    /// Arms the SIGKILL that follows a stop's SIGTERM.
    pub(super) fn arm_stop(self: &Arc<Self>, exec: &mut Execution, request: StopRequest) {
        let (id, attempt) = (exec.manifest.id.clone(), exec.manifest.attempt);
        let what = format!("killing the worker of {id}");
        exec.timer = Some(self.timer(what, request.kill_at_micros(), move |inner| {
            let id = id.clone();
            async move { inner.stop_kill(&id, attempt).await }
        }));
    }

    /// The stop's timeout has passed: SIGKILL the worker and whatever else
    /// runs in its shim's session; if the exit is still not reported after
    /// a grace period, kill the shim too (its exit then ends the execution).
    async fn stop_kill(self: Arc<Self>, id: &str, attempt: u32) -> Result<()> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        if m.attempt != attempt || !state::has_shim(m.state) {
            return Ok(());
        }
        tracing::info!(execution = %id, "stop: timeout passed, sending SIGKILL");
        terminate_worker(&exec, libc::SIGKILL);
        match exec.manifest.shim.filter(|_| exec.shim.is_some()) {
            Some(_) => {
                let grace_at = now_micros().saturating_add(KILL_GRACE.as_micros() as u64);
                let owned = id.to_owned();
                let what = format!("killing the shim of {id}");
                exec.timer = Some(self.timer(what, grace_at, move |inner| {
                    let id = owned.clone();
                    async move { inner.stop_kill_shim(&id, attempt).await }
                }));
                Ok(())
            }
            None if exec.restarting => {
                // No shim to wait for: the attempt is over, and the next
                // one starts.
                let reason = "no shim to report the worker's exit".to_owned();
                self.end_attempt(&slot, &mut exec, Ending::Lost, reason)
                    .await
            }
            None => {
                // No shim to wait for: nothing can report an exit.
                let mut change = Change::of(&exec.manifest);
                change.go(ExecState::Cancelled, "cancelled")?;
                change.next.reason = Some("stopped on request".into());
                self.commit(&slot, &mut exec, change).await
            }
        }
    }

    async fn stop_kill_shim(self: Arc<Self>, id: &str, attempt: u32) -> Result<()> {
        let slot = self.slot(id)?;
        let exec = slot.exec.lock().await;
        let m = &exec.manifest;
        if m.attempt != attempt || !state::has_shim(m.state) {
            return Ok(());
        }
        if let Some(shim) = m.shim.filter(|_| exec.shim.is_some()) {
            tracing::warn!(
                execution = %id,
                "stop: no exit reported {KILL_GRACE:?} after SIGKILL; killing shim pid {}",
                shim.pid
            );
            sweep_session(shim, true);
        }
        Ok(())
    }
}
