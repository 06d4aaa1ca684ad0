//! Recovery at start: which recorded shims are still alive, and what
//! becomes of the executions whose shims are not.
//!
//! Before the socket accepts anything, the daemon loads every manifest. A
//! `starting` or `running` execution whose recorded shim matches a live
//! process (same boot, pid and start ticks, see [`classify`]) is held
//! through a pidfd until its shim reconnects and says hello again; nothing
//! is written for it. Any other is `lost` and handled by its policy.
//! `pending` executions start; `backoff` timers resume from the manifest's
//! `next_attempt_micros`.

use std::io;
use std::sync::Arc;

use tether_protocol::ExecState;

use super::manifest::{Manifest, StopRequest};
use super::policy::Ending;
use super::procfs::Pidfd;
use super::{kill_verified, new_slot, state, sweep_session, Inner, Slot};
use crate::Result;

/// Whether a recorded shim is still the one that was started.
#[derive(Debug)]
pub enum Liveness {
    /// Pid, start time and boot all match a live process.
    Live(Pidfd),
    /// It is gone; the reason says how that was decided.
    Gone(String),
}

/// Tells a live shim from a dead one or a reused pid: the manifest's boot
/// must be this boot, and a pidfd opened for its pid must pin a process
/// with the recorded start time.
pub fn classify(manifest: &Manifest, boot_id: &str) -> io::Result<Liveness> {
    let Some(shim) = manifest.shim else {
        return Ok(Liveness::Gone(format!(
            "no shim was recorded for attempt {}",
            manifest.attempt
        )));
    };
    if manifest.boot_id != boot_id {
        return Ok(Liveness::Gone(format!(
            "shim pid {} belonged to an earlier boot",
            shim.pid
        )));
    }
    Ok(match Pidfd::open_verified(shim)? {
        Some(pidfd) => Liveness::Live(pidfd),
        None => Liveness::Gone(format!("shim pid {} is gone", shim.pid)),
    })
}

impl Inner {
    // -- recovery --------------------------------------------------------------

    /// Sorts out one manifest loaded at start (see [`Supervisor::start`]).
    /// Returns the task that records a lost execution, for the caller to
    /// await before clients are served.
    pub(super) fn recover_one(
        self: &Arc<Self>,
        manifest: Manifest,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let id = manifest.id.clone();
        let state = manifest.state;
        let mut live = None;
        let mut gone = None;
        if state::has_shim(state) {
            match classify(&manifest, &self.settings.boot_id) {
                Ok(Liveness::Live(pidfd)) => live = Some(Arc::new(pidfd)),
                Ok(Liveness::Gone(reason)) => gone = Some(reason),
                Err(e) => gone = Some(format!("its shim cannot be checked: {e}")),
            }
        }
        let worker = live.as_ref().and_then(|_| {
            manifest
                .worker
                .and_then(|w| Pidfd::open_verified(w).ok().flatten())
                .map(Arc::new)
        });
        let attempt = manifest.attempt;
        let stop = manifest.stop;
        let next_attempt = manifest.next_attempt_micros;
        let slot = new_slot(manifest, true, live.clone(), worker);
        self.slots().insert(id.clone(), slot.clone());
        if let Some(pidfd) = live {
            tracing::info!(execution = %id, "shim pid {} is alive; waiting for it to reconnect", pidfd.pid());
            self.watch_shim(id.clone(), attempt, pidfd, None);
        }
        let settles_at_start = gone.is_some();
        let inner = self.clone();
        let task = self.tasks.spawn(async move {
            let what = format!("resuming {id}");
            inner
                .clone()
                .retry_until_done(&what, || {
                    inner.resume(&slot, state, gone.clone(), stop, next_attempt)
                })
                .await;
        });
        settles_at_start.then_some(task)
    }

    /// The background half of recovering one execution.
    async fn resume(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
        state: ExecState,
        gone: Option<String>,
        stop: Option<StopRequest>,
        next_attempt: Option<u64>,
    ) -> Result<()> {
        let mut exec = slot.exec.lock().await;
        let id = exec.manifest.id.clone();
        match state {
            ExecState::Pending => {
                drop(exec);
                self.start_next(&id).await
            }
            ExecState::Backoff => {
                self.arm_backoff(&mut exec, next_attempt.unwrap_or(0));
                Ok(())
            }
            ExecState::Starting | ExecState::Running => match gone {
                Some(reason) => {
                    tracing::warn!(execution = %id, "lost: {reason}");
                    if exec.manifest.boot_id == self.settings.boot_id {
                        if let Some(worker) = exec.manifest.worker {
                            kill_verified(worker);
                        }
                        if let Some(shim) = exec.manifest.shim {
                            sweep_session(shim, false);
                        }
                    }
                    self.end_attempt(slot, &mut exec, Ending::Lost, reason)
                        .await
                }
                None => {
                    if let Some(request) = stop {
                        self.arm_stop(&mut exec, request);
                    }
                    Ok(())
                }
            },
            _ => Ok(()),
        }
    }
}
