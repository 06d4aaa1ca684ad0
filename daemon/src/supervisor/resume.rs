//! `tether resume` and `tether restart`: a new attempt on request.
//!
//! `resume` starts a new attempt of an ended execution (`completed`,
//! `failed`, `cancelled`, `lost`), same id and stream. Its start commits
//! like any restart's, looking up the checkpoint it resumes from in the
//! same transaction (or copying the one asked for as the newest), so the
//! worker gets `TETHER_RESUMED=1` and loads it; recorded steps stand. A
//! resume begins supervision anew: restarts and the deadline count from
//! it. It is refused while the execution is live, and while another live
//! execution has taken its name; the name is held from that check until
//! the commit ([`Slot::reviving`](super::Slot)), so a racing `run --name`
//! cannot take it in between.
//!
//! `restart` stops the running attempt as `stop` does (SIGTERM, SIGKILL
//! after the timeout) but, instead of ending the execution, commits the
//! attempt's end together with the start of the next, which the restart
//! policy does not count. A `backoff` execution starts its next attempt
//! at once; a `pending` one is starting anyway.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tether_protocol::ExecState;
use tokio::sync::watch;

use super::manifest::{Manifest, StopRequest};
use super::{now_micros, policy, state, terminate_worker, Change, Inner};
use crate::{Error, Result};

impl Inner {
    /// Starts a new attempt of the ended execution `id`.
    pub(super) async fn resume_ended(
        self: Arc<Self>,
        id: &str,
        checkpoint: Option<u64>,
    ) -> Result<()> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        if !state::is_final(m.state) {
            return Err(Error::InvalidRequest(format!(
                "execution {id} is {}, not ended; 'tether restart {id}' starts its next attempt",
                m.state.as_str()
            )));
        }
        self.hold_name(id, &slot)?;
        let mut change = Change::of(&exec.manifest);
        change.note(match checkpoint {
            Some(c) => format!("resume requested, from checkpoint {c}"),
            None => "resume requested".to_owned(),
        });
        let started = change.begin_attempt().map(|()| {
            change.resume = true;
            change.from_checkpoint = checkpoint;
            change.next.restarts = 0;
            // The crash-loop guard counts from the resume too.
            change.next.setup.failures_without_progress = 0;
            change.next.submitted_micros = now_micros();
            change.next.ended_micros = None;
            change.next.stop = None;
        });
        let committed = match started {
            Ok(()) => self.commit(&slot, &mut exec, change).await,
            Err(e) => Err(e),
        };
        slot.reviving.store(false, Ordering::Release);
        committed?;
        exec.timer = None;
        self.launch(&slot, &mut exec).await
    }

    /// Refuses a resume while another live execution has the name of `id`,
    /// and otherwise holds the name for `id` until the resume commits (the
    /// caller clears [`Slot::reviving`](super::Slot)).
    fn hold_name(&self, id: &str, slot: &super::Slot) -> Result<()> {
        let slots = self.slots();
        if let Some(name) = &slot.name {
            let taken = slots.iter().find(|(other, s)| {
                other.as_str() != id && s.name.as_ref() == Some(name) && !s.named(other).ended
            });
            if let Some((other, _)) = taken {
                return Err(Error::InvalidRequest(format!(
                    "execution {other} is running with the name {name:?}; stop it before \
                     resuming {id}"
                )));
            }
        }
        // Set under the map's lock, where runs check names.
        slot.reviving.store(true, Ordering::Release);
        Ok(())
    }

    /// Starts stopping the current attempt of `id` for a restart. Returns
    /// a receiver of the committed manifest and the attempt being
    /// replaced, for the caller to wait for the next.
    pub(super) async fn request_restart(
        self: Arc<Self>,
        id: &str,
        timeout: Duration,
    ) -> Result<(watch::Receiver<Option<Manifest>>, u32)> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let committed = slot.committed.subscribe();
        let m = &exec.manifest;
        let attempt = m.attempt;
        if state::is_final(m.state) {
            return Err(Error::InvalidRequest(format!(
                "execution {id} has ended ({}); 'tether resume {id}' starts it again",
                m.state.as_str()
            )));
        }
        if m.stop.is_some() {
            return Err(Error::InvalidRequest(format!(
                "execution {id} is being stopped"
            )));
        }
        match m.state {
            ExecState::Backoff => {
                tracing::info!(execution = %id, "restart: starting the next attempt now");
                let mut change = Change::of(m);
                change.note("restarting at once on request");
                change.begin_attempt()?;
                self.commit(&slot, &mut exec, change).await?;
                exec.timer = None;
                self.launch(&slot, &mut exec).await?;
            }
            ExecState::Starting | ExecState::Running if !exec.restarting => {
                tracing::info!(execution = %id, "restart: SIGTERM, SIGKILL after {timeout:?}");
                let mut change = Change::of(m);
                change.note(format!(
                    "restarting on request: SIGTERM, then SIGKILL after {}",
                    policy::human(timeout)
                ));
                self.commit(&slot, &mut exec, change).await?;
                exec.restarting = true;
                terminate_worker(&exec, libc::SIGTERM);
                let request = StopRequest {
                    requested_micros: now_micros(),
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                };
                self.arm_stop(&mut exec, request);
            }
            // Pending: its first attempt is starting; restarting: already
            // on its way.
            _ => {}
        }
        Ok((committed, attempt))
    }
}
