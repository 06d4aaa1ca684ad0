//! Removing ended executions: `tether rm`, `tether prune` and the
//! `keep_ended` sweep. Each removal is one durable commit through the
//! queue (manifest, checkpoints, steps and stream together, see
//! [`Queue::remove`](crate::engine::Queue::remove)), made while every
//! execution it removes is locked, so that nothing starts one again in
//! between; the executions leave memory only after it committed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::{now_micros, state, Execution, Inner, Manifest, Slot, Supervisor};
use crate::{Error, Result};

/// How often the `keep_ended` sweep looks at most; a shorter `keep_ended`
/// is looked at that often (but not more than once a second).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How long `rm --force` gives a live worker to stop before it is killed.
const FORCE_STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl Supervisor {
    /// Removes the executions `ids`, each with its stream, checkpoints and
    /// steps. A live one is refused with [`Error::InvalidRequest`] unless
    /// `force`, which stops it first. An unknown id is
    /// [`Error::ExecutionNotFound`]. Nothing is removed when any is refused.
    pub async fn remove(&self, ids: &[String], force: bool) -> Result<Vec<String>> {
        for id in ids {
            let slot = self.inner.slot(id)?;
            if slot_ended(&slot) {
                continue;
            }
            if !force {
                return Err(Error::InvalidRequest(format!(
                    "execution {id} has not ended: stop it first, or pass --force"
                )));
            }
            self.stop(id, FORCE_STOP_TIMEOUT).await?;
        }
        let inner = self.inner.clone();
        let ids = ids.to_vec();
        self.inner
            .detach(async move { inner.remove_ended(&ids, true).await })
            .await
    }

    /// Removes the streams `names`, each leaving a tombstone of its last
    /// seq. The stream of a live execution is refused with
    /// [`Error::InvalidRequest`], an unknown one is
    /// [`Error::StreamNotFound`]; nothing is removed then.
    pub async fn remove_streams(&self, names: &[String]) -> Result<Vec<(String, u64)>> {
        let mut names = names.to_vec();
        names.sort();
        names.dedup();
        // The executions owning any of them stay locked until the commit,
        // so that none starts an attempt writing to its stream meanwhile.
        let mut held = Vec::new();
        for name in &names {
            if let Ok(slot) = self.inner.slot(name) {
                let exec = slot.exec.clone().lock_owned().await;
                if !state::is_final(exec.manifest.state) {
                    return Err(Error::InvalidRequest(format!(
                        "stream {name} belongs to execution {name}, which has not ended"
                    )));
                }
                held.push(exec);
            }
            if self.inner.queue.stream_range(name).is_none() {
                return Err(Error::StreamNotFound(name.clone()));
            }
        }
        let removed = self.inner.queue.remove(Vec::new(), names).await?;
        drop(held);
        for (name, last_seq) in &removed.streams {
            tracing::info!(stream = %name, last_seq, "removed stream");
        }
        Ok(removed.streams)
    }

    /// Removes ended executions once they ended `keep` ago, at start and
    /// then every [`SWEEP_EVERY`] (or `keep`, if shorter), until
    /// `shutdown`. A failed sweep is logged and tried again next time.
    pub async fn sweep_ended(self, keep: Duration, shutdown: CancellationToken) {
        let every = keep.clamp(Duration::from_secs(1), SWEEP_EVERY);
        loop {
            if let Err(e) = self.prune(keep).await {
                tracing::warn!("removing executions ended over {keep:?} ago: {e}");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Removes every ended execution that ended at least `older_than`
    /// ago, skipping those with a live parent; returns their ids.
    pub async fn prune(&self, older_than: Duration) -> Result<Vec<String>> {
        let cutoff = now_micros().saturating_sub(duration_micros(older_than));
        let ids: Vec<String> = self
            .manifests(true)
            .into_iter()
            .filter(|m| state::is_final(m.state))
            .filter(|m| ended_micros(m) <= cutoff)
            .filter(|m| !self.inner.has_live_parent(m))
            .map(|m| m.id)
            .collect();
        if ids.is_empty() {
            return Ok(ids);
        }
        let inner = self.inner.clone();
        self.inner
            .detach(async move { inner.remove_ended(&ids, false).await })
            .await
    }
}

impl Inner {
    /// Removes those of `ids` that have ended, in one commit, and forgets
    /// them. With `strict`, one that is unknown or live refuses the whole
    /// removal; else it is skipped (a sweep racing a new attempt).
    async fn remove_ended(self: &Arc<Self>, ids: &[String], strict: bool) -> Result<Vec<String>> {
        let mut ids: Vec<String> = ids.to_vec();
        ids.sort();
        ids.dedup();
        // Locked in id order, as every removal does, so two never wait on
        // each other; every other change locks one execution at a time.
        let mut held: Vec<(String, OwnedMutexGuard<Execution>)> = Vec::new();
        for id in ids {
            let slot = match self.slot(&id) {
                Ok(slot) => slot,
                Err(e) if strict => return Err(e),
                Err(_) => continue,
            };
            let exec = slot.exec.clone().lock_owned().await;
            if !state::is_final(exec.manifest.state) {
                if strict {
                    return Err(Error::InvalidRequest(format!(
                        "execution {id} has not ended: stop it first, or pass --force"
                    )));
                }
                continue;
            }
            held.push((id, exec));
        }
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = held.iter().map(|(id, _)| id.clone()).collect();
        self.queue.remove(ids.clone(), Vec::new()).await?;
        let mut slots = self.slots();
        for id in &ids {
            slots.remove(id);
        }
        drop(slots);
        for id in &ids {
            tracing::info!(execution = %id, "removed execution and its stream");
        }
        Ok(ids)
    }

    /// Whether `manifest`'s parent execution (`run --parent`) is live,
    /// which keeps it from being pruned: a live parent may still read
    /// what its children left.
    fn has_live_parent(&self, manifest: &Manifest) -> bool {
        let Some(parent) = &manifest.setup.parent else {
            return false;
        };
        self.slots()
            .get(parent)
            .is_some_and(|slot| !slot_ended(slot))
    }
}

/// Whether a slot's committed manifest is in a final state.
fn slot_ended(slot: &Slot) -> bool {
    slot.committed
        .borrow()
        .as_ref()
        .is_some_and(|m| state::is_final(m.state))
}

/// When an ended execution ended; one recorded before that was kept
/// counts from when it was created.
fn ended_micros(manifest: &Manifest) -> u64 {
    manifest.ended_micros.unwrap_or(manifest.created_micros)
}

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
