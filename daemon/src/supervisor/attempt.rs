//! Attempts: a run is recorded, each attempt's shim is started and
//! watched, the shim attaches and reports the worker's exit, and the
//! restart policy decides what follows.
//!
//! `tether run` records a `pending` manifest (and a "submitted" event) and
//! answers with the execution id, which is also the output stream's name.
//! Each attempt then commits `starting`, spawns `tether-shim EXECUTION
//! ATTEMPT` (the program [`crate::Config::shim_program`] names) and records
//! the shim's pid and start ticks. The shim starts the worker, connects as
//! a producer, says `ShimHello` (pids, start ticks, boot id) and, once
//! accepted, appends the worker's lines (producer
//! `shim-<execution>-<attempt>`). The hello of a `starting` attempt commits
//! `running` ("started pid N").
//!
//! When the worker has exited and every line is acknowledged, the shim
//! sends `WorkerExited`. The daemon commits the end of the attempt and the
//! policy's decision together ("exited 1" + "restarting in 1s (attempt
//! 3)"), answers `ExitRecorded`, and the shim exits. A shim exit seen
//! through its pidfd without a recorded worker exit makes the attempt
//! `lost`: the daemon SIGKILLs the orphaned worker and what is left in the
//! shim's session, then applies the policy.
//!
//! A `ShimHello` for an unknown execution is refused with `not_found`, and
//! one for an attempt that has ended with `invalid_request`; the shim then
//! kills its worker and exits.

use std::sync::Arc;
use std::time::Duration;

use tether_protocol::{
    ExecState, ExitStatus, RunSpec, RunSpecFull, ShimHello, ShimSpec, ShimSpecFull, WorkerExited,
};
use tokio::sync::OwnedMutexGuard;

use super::manifest::{self, display_command, Manifest};
use super::policy::{self, Decision, Ending, Limits};
use super::procfs::{self, Pidfd, ProcessId};
use super::{
    new_slot, now_micros, state, sweep_session, terminate_worker, Change, Execution, Inner, Slot,
    ID_TRIES,
};
use crate::{Error, Result};

/// What [`Inner::reserve_id`] found.
enum Reserved {
    /// A new execution, reserved and locked.
    New(String, Arc<Slot>, OwnedMutexGuard<Execution>),
    /// The run chose the id of an execution that exists.
    Existing(String),
}

impl Inner {
    // -- run ----------------------------------------------------------------

    pub(super) async fn run(self: Arc<Self>, mut run: RunSpecFull) -> Result<String> {
        run.stop_signal = manifest::validate_run(&run)?;
        if let Some(parent) = &run.parent {
            let known = self
                .slots()
                .get(parent)
                .is_some_and(|slot| slot.committed.borrow().is_some());
            if !known {
                return Err(Error::ExecutionNotFound(parent.clone()));
            }
        }
        let now = now_micros();
        let mut change_event = submitted_event(&run.spec);
        if run.pty {
            change_event.push_str(" on a pseudo-terminal");
        }
        let (id, slot, mut exec) = match self.reserve_id(run, now)? {
            Reserved::New(id, slot, exec) => (id, slot, exec),
            Reserved::Existing(id) => {
                tracing::info!(execution = %id, "run: the execution exists; nothing started");
                return Ok(id);
            }
        };
        let mut change = Change::of(&exec.manifest);
        change.note(change_event);
        if let Err(e) = self.commit(&slot, &mut exec, change).await {
            self.slots().remove(&id);
            return Err(e);
        }
        drop(exec);
        let inner = self.clone();
        let started = id.clone();
        self.tasks.spawn(async move {
            if let Err(e) = inner.start_next(&started).await {
                tracing::error!(execution = %started, "cannot start the first attempt: {e}");
            }
        });
        Ok(id)
    }

    /// Picks an unused id (or takes the one the run chose) and reserves it
    /// with a pending, not yet committed slot, returned locked: nobody sees
    /// it before its first commit. A chosen id that is taken, by an
    /// execution in any state or one being recorded, is
    /// [`Reserved::Existing`]: the run starts nothing.
    fn reserve_id(&self, run: RunSpecFull, now: u64) -> Result<Reserved> {
        let mut slots = self.slots();
        // Checked and reserved under one lock: of runs racing for an id or
        // a name, one takes it.
        if let Some(id) = &run.id {
            if slots.contains_key(id) {
                return Ok(Reserved::Existing(id.clone()));
            }
        }
        if let Some(name) = &run.spec.name {
            let taken = slots
                .iter()
                .find(|(id, slot)| slot.name.as_ref() == Some(name) && !slot.named(id).ended);
            if let Some((id, _)) = taken {
                return Err(Error::InvalidRequest(format!(
                    "execution {id} is already running with the name {name:?}; stop it, or \
                     choose another name"
                )));
            }
        }
        let chosen = run.id.clone();
        for _ in 0..ID_TRIES {
            let id = match &chosen {
                Some(id) => id.clone(),
                None => manifest::new_id(&run.spec, policy::random()),
            };
            // A chosen id may name a stream that exists: the execution
            // writes on after its last seq.
            if chosen.is_none()
                && (slots.contains_key(&id) || self.queue.stream_range(&id).is_some())
            {
                continue;
            }
            let manifest =
                Manifest::new(id.clone(), run.clone(), now, self.settings.boot_id.clone());
            let slot = new_slot(manifest, false, None, None);
            let guard = slot.exec.clone().try_lock_owned().map_err(|_| {
                Error::Invariant("internal error: a new execution was locked".into())
            })?;
            slots.insert(id.clone(), slot.clone());
            return Ok(Reserved::New(id, slot, guard));
        }
        Err(Error::Invariant(format!(
            "could not find an unused execution id in {ID_TRIES} tries"
        )))
    }

    // -- attempts ------------------------------------------------------------

    /// Starts the next attempt of a `pending` execution.
    pub(super) async fn start_next(self: &Arc<Self>, id: &str) -> Result<()> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        if exec.manifest.state != ExecState::Pending {
            return Ok(());
        }
        let mut change = Change::of(&exec.manifest);
        change.begin_attempt()?;
        self.commit(&slot, &mut exec, change).await?;
        self.launch(&slot, &mut exec).await
    }

    /// Starts the shim of the attempt just committed as `starting`, and
    /// records its identity.
    pub(super) async fn launch(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
        exec: &mut Execution,
    ) -> Result<()> {
        let m = &exec.manifest;
        let spec = ShimSpecFull {
            spec: ShimSpec {
                execution: m.id.clone(),
                attempt: m.attempt,
                socket: self.settings.socket.display().to_string(),
                command: m.spec.command.clone(),
                cwd: m.spec.cwd.clone(),
                env: worker_env(m),
                // Decided when this attempt's start was committed.
                resumed: exec.resumed,
                max_line: self.settings.max_line,
            },
            whole_env: m.setup.whole_env,
            pty: m.setup.pty,
            // Only a restart has a previous attempt to describe.
            last_exit: if m.attempt > 1 {
                m.last_exit.as_ref().and_then(last_exit_variable)
            } else {
                None
            },
        };
        let (id, attempt) = (m.id.clone(), m.attempt);
        let mut child = match self.settings.launcher.start(&spec).await {
            Ok(child) => child,
            // The shim program is missing or broken: another attempt would
            // fail the same way, so this is not retried.
            Err(e) => return self.fail_launch(slot, exec, e.to_string()).await,
        };
        let pid = child.id();
        // The child is not reaped before its watcher reaps it, so its pid
        // cannot have been reused: this pidfd and start time are the shim's.
        let watched = Pidfd::open(pid).and_then(|fd| Ok((fd, procfs::identify(pid)?)));
        let (pidfd, identity) = match watched {
            Ok((fd, identity)) => (Arc::new(fd), identity),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let reason = format!("cannot watch shim pid {pid}: {e}");
                return self.fail_launch(slot, exec, reason).await;
            }
        };
        self.watch_shim(id.clone(), attempt, pidfd.clone(), Some(child));
        exec.shim = Some(pidfd);
        let mut change = Change::of(&exec.manifest);
        change.next.boot_id = self.settings.boot_id.clone();
        change.next.shim = Some(identity);
        if let Err(e) = self.commit(slot, exec, change).await {
            // An unrecorded shim could not be recognised after a restart:
            // end it now; its watcher then handles the attempt as lost.
            tracing::error!(execution = %id, "cannot record shim pid {pid}: {e}; killing it");
            sweep_session(identity, true);
            return Err(e);
        }
        Ok(())
    }

    /// Ends an attempt whose shim could not be started, as `failed`.
    async fn fail_launch(&self, slot: &Slot, exec: &mut Execution, reason: String) -> Result<()> {
        let mut change = Change::of(&exec.manifest);
        change.go(ExecState::Failed, format!("failed: {reason}"))?;
        change.next.reason = Some(reason);
        self.commit(slot, exec, change).await
    }

    /// Waits (in the background) for a shim to exit, reaps it when it is
    /// our child, and reports its exit.
    pub(super) fn watch_shim(
        self: &Arc<Self>,
        id: String,
        attempt: u32,
        pidfd: Arc<Pidfd>,
        mut child: Option<std::process::Child>,
    ) {
        let weak = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                () = pidfd.exited() => {}
            }
            if let Some(child) = &mut child {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        tracing::debug!(execution = %id, "shim pid {} exited: {status}", pidfd.pid())
                    }
                    Ok(None) => tracing::warn!(execution = %id, "shim pid {} not reapable yet", pidfd.pid()),
                    Err(e) => tracing::warn!(execution = %id, "reaping shim pid {}: {e}", pidfd.pid()),
                }
            }
            let Some(inner) = weak.upgrade() else { return };
            let pid = pidfd.pid();
            let what = format!("handling the exit of shim pid {pid} of {id}");
            inner
                .clone()
                .retry_until_done(&what, || inner.shim_exited(&id, attempt, pid))
                .await;
        });
    }

    /// A shim exited. Without a recorded worker exit for its attempt, the
    /// attempt is lost.
    async fn shim_exited(self: &Arc<Self>, id: &str, attempt: u32, shim_pid: u32) -> Result<()> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        let current = m.attempt == attempt
            && state::has_shim(m.state)
            && m.shim.is_none_or(|s| s.pid == shim_pid);
        if !current {
            // Its attempt already ended the regular way.
            return Ok(());
        }
        exec.shim = None;
        // A worker left behind by a dead shim would run unsupervised next
        // to the next attempt.
        if let Some(worker) = exec.worker.take() {
            if let Err(e) = worker.signal_group(libc::SIGKILL) {
                tracing::warn!(execution = %id, "cannot kill orphaned worker pid {}: {e}", worker.pid());
            }
        }
        if let Some(shim) = exec.manifest.shim {
            sweep_session(shim, false);
        }
        let reason = format!("shim pid {shim_pid} is gone");
        self.end_attempt(&slot, &mut exec, Ending::Lost, reason)
            .await
    }

    /// Ends the current attempt as `ending` and applies the restart policy
    /// (or the pending stop), in one commit; then starts what follows.
    pub(super) async fn end_attempt(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
        exec: &mut Execution,
        ending: Ending<'_>,
        lost_reason: String,
    ) -> Result<()> {
        let m = &exec.manifest;
        let mut change = Change::of(m);
        let now = now_micros();
        change.next.last_exit = match ending {
            Ending::Exited(status) => Some(status.clone()),
            Ending::Lost => None,
        };
        if m.state == ExecState::Starting
            && matches!(
                ending,
                Ending::Exited(ExitStatus::Code(_) | ExitStatus::Signal(_))
            )
        {
            // The exit overtook the shim's report of the start (only after
            // a daemon restart at just that moment): it did start.
            change.go(ExecState::Running, "started")?;
        }
        if exec.manifest.stop.is_some() {
            change.note(exit_event(ending, &lost_reason));
            change.go(ExecState::Cancelled, "cancelled")?;
            change.next.reason = Some("stopped on request".into());
            return self.commit(slot, exec, change).await;
        }
        if exec.restarting {
            // `tether restart`: the end and the next start commit together,
            // and the policy does not count this attempt's end.
            match ending {
                Ending::Lost => change.go(ExecState::Lost, format!("lost: {lost_reason}"))?,
                Ending::Exited(_) => change.note(exit_event(ending, &lost_reason)),
            }
            change.note(format!(
                "restarting at once on request (attempt {})",
                change.next.attempt.saturating_add(1)
            ));
            let restarts = change.next.restarts;
            change.begin_attempt()?;
            change.next.restarts = restarts;
            self.commit(slot, exec, change).await?;
            exec.restarting = false;
            exec.timer = None;
            exec.shim = None;
            exec.worker = None;
            return self.launch(slot, exec).await;
        }
        let limits = Limits::of(&m.spec, m.submitted_micros);
        let mut decision = policy::decide(&limits, m.restarts, now, ending, policy::jitter());
        // A success or an attempt that got somewhere starts the count again.
        let failed = !matches!(ending, Ending::Exited(ExitStatus::Code(0)));
        let setup = &mut change.next.setup;
        setup.failures_without_progress = if failed && !self.made_progress(m).await? {
            setup.failures_without_progress.saturating_add(1)
        } else {
            0
        };
        if matches!(decision, Decision::Restart { .. })
            && setup.failures_without_progress >= m.max_failures_without_progress()
        {
            decision = Decision::End {
                state: ExecState::Failed,
                reason: Some(policy::CRASH_LOOP.into()),
            };
        }
        // The attempt's own end: failed, lost, or (exit 0) no state of its own.
        match ending {
            Ending::Lost => change.go(ExecState::Lost, format!("lost: {lost_reason}"))?,
            Ending::Exited(ExitStatus::Code(0)) => change.note("exited 0"),
            Ending::Exited(ExitStatus::SpawnFailed(_)) => {}
            Ending::Exited(_) => change.go(ExecState::Failed, exit_event(ending, &lost_reason))?,
        }
        match decision {
            Decision::End { state, reason } => {
                let event = match (&reason, state) {
                    (_, ExecState::Completed) => "completed".to_owned(),
                    (_, ExecState::Lost) => String::new(),
                    (Some(r), _) => format!("failed: {r}"),
                    (None, _) => "failed".to_owned(),
                };
                if state == change.next.state {
                    if !event.is_empty() {
                        change.note(event);
                    }
                } else {
                    change.go(state, event)?;
                }
                change.next.reason = match state {
                    ExecState::Lost => Some(lost_reason),
                    _ => reason,
                };
                self.commit(slot, exec, change).await
            }
            Decision::Restart { delay } if delay.is_zero() => {
                change.note(format!(
                    "restarting at once (attempt {})",
                    change.next.attempt.saturating_add(1)
                ));
                change.begin_attempt()?;
                self.commit(slot, exec, change).await?;
                exec.shim = None;
                exec.worker = None;
                self.launch(slot, exec).await
            }
            Decision::Restart { delay } => {
                let at = now.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
                change.go(
                    ExecState::Backoff,
                    format!(
                        "restarting in {} (attempt {})",
                        policy::human(delay),
                        change.next.attempt.saturating_add(1)
                    ),
                )?;
                change.next.next_attempt_micros = Some(at);
                change.next.shim = None;
                change.next.worker = None;
                self.commit(slot, exec, change).await?;
                exec.shim = None;
                exec.worker = None;
                self.arm_backoff(exec, at);
                Ok(())
            }
        }
    }

    /// Starts the next attempt of `exec` at `at_micros`.
    pub(super) fn arm_backoff(self: &Arc<Self>, exec: &mut Execution, at_micros: u64) {
        let (id, attempt) = (exec.manifest.id.clone(), exec.manifest.attempt);
        let what = format!("starting attempt {} of {id}", attempt.saturating_add(1));
        exec.timer = Some(self.timer(what, at_micros, move |inner| {
            let id = id.clone();
            async move { inner.backoff_due(&id, attempt).await }
        }));
    }

    async fn backoff_due(self: Arc<Self>, id: &str, attempt: u32) -> Result<()> {
        let slot = self.slot(id)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        if m.state != ExecState::Backoff || m.attempt != attempt {
            return Ok(());
        }
        let mut change = Change::of(m);
        if !Limits::of(&m.spec, m.submitted_micros).before_deadline(now_micros()) {
            change.go(ExecState::Failed, "failed: deadline")?;
            change.next.reason = Some("deadline".into());
            change.next.next_attempt_micros = None;
            return self.commit(&slot, &mut exec, change).await;
        }
        change.begin_attempt()?;
        self.commit(&slot, &mut exec, change).await?;
        self.launch(&slot, &mut exec).await
    }

    /// True when the current attempt of `m` recorded a checkpoint or a
    /// step.
    async fn made_progress(&self, m: &Manifest) -> Result<bool> {
        let since = m.setup.attempt_started_micros;
        let checkpointed = self
            .queue
            .last_checkpoint(&m.id)
            .is_some_and(|c| c.created_micros >= since);
        if checkpointed {
            return Ok(true);
        }
        let steps = self.queue.list_steps(&m.id).await?;
        Ok(steps.iter().any(|step| step.recorded_micros >= since))
    }

    // -- shims ---------------------------------------------------------------

    pub(super) async fn shim_hello(self: Arc<Self>, hello: &ShimHello) -> Result<()> {
        let slot = self.slot(&hello.execution)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        let id = &hello.execution;
        if state::is_final(m.state) {
            return Err(Error::InvalidRequest(format!(
                "execution {id} has ended ({})",
                m.state.as_str()
            )));
        }
        if m.attempt != hello.attempt || !state::has_shim(m.state) {
            return Err(Error::InvalidRequest(format!(
                "attempt {} of execution {id} has ended; the execution is {} at attempt {}",
                hello.attempt,
                m.state.as_str(),
                m.attempt
            )));
        }
        if hello.boot_id != self.settings.boot_id {
            return Err(Error::InvalidRequest(format!(
                "the shim reports boot {}, but this is boot {}",
                hello.boot_id, self.settings.boot_id
            )));
        }
        let claimed = ProcessId {
            pid: hello.shim_pid,
            start_ticks: hello.shim_start_ticks,
        };
        if m.shim != Some(claimed) {
            return Err(Error::InvalidRequest(format!(
                "shim pid {} is not the shim started for attempt {} of execution {id}",
                hello.shim_pid, hello.attempt
            )));
        }
        let Some(worker_pid) = hello.worker_pid else {
            // The worker could not be started; its WorkerExited follows.
            tracing::info!(execution = %id, "shim pid {} attached (no worker)", hello.shim_pid);
            return Ok(());
        };
        let worker = ProcessId {
            pid: worker_pid,
            start_ticks: hello.worker_start_ticks,
        };
        // A shim sends its greeting on every session; only the first in
        // this daemon's life (a reattach after a restart) is news.
        let first_here = exec.worker.as_ref().is_none_or(|w| w.pid() != worker_pid);
        if first_here {
            exec.worker = match Pidfd::open_verified(worker) {
                Ok(pidfd) => pidfd.map(Arc::new),
                Err(e) => {
                    tracing::warn!(execution = %id, "cannot open a pidfd for worker pid {worker_pid}: {e}");
                    None
                }
            };
        }
        if exec.manifest.state == ExecState::Starting {
            let mut change = Change::of(&exec.manifest);
            change.go(ExecState::Running, format!("started pid {worker_pid}"))?;
            change.next.worker = Some(worker);
            self.commit(&slot, &mut exec, change).await?;
            if exec.manifest.stop.is_some() || exec.restarting {
                // Stopped while starting: the worker exists only now.
                terminate_worker(&exec, exec.manifest.stop_signal());
            }
        } else if first_here {
            tracing::info!(execution = %id, "shim pid {} reattached (worker pid {worker_pid})", hello.shim_pid);
        } else {
            tracing::debug!(execution = %id, "shim pid {} opened another session", hello.shim_pid);
        }
        Ok(())
    }

    pub(super) async fn worker_exited(self: Arc<Self>, exited: &WorkerExited) -> Result<()> {
        let slot = self.slot(&exited.execution)?;
        let mut exec = slot.exec.lock().await;
        let m = &exec.manifest;
        if m.attempt != exited.attempt || !state::has_shim(m.state) {
            tracing::debug!(
                execution = %exited.execution,
                "exit of attempt {} already recorded",
                exited.attempt
            );
            return Ok(());
        }
        exec.worker = None;
        self.end_attempt(
            &slot,
            &mut exec,
            Ending::Exited(&exited.status),
            String::new(),
        )
        .await
    }
}

/// The worker's variables: the run's, with `TETHER_PARENT_ID` for a run
/// with a parent.
fn worker_env(m: &Manifest) -> Vec<(String, String)> {
    let mut env = m.spec.env.clone();
    if let Some(parent) = &m.setup.parent {
        env.retain(|(key, _)| key != "TETHER_PARENT_ID");
        env.push(("TETHER_PARENT_ID".into(), parent.clone()));
    }
    env
}

/// The event naming how an attempt ended.
fn exit_event(ending: Ending<'_>, lost_reason: &str) -> String {
    match ending {
        Ending::Exited(ExitStatus::Code(code)) => format!("exited {code}"),
        Ending::Exited(ExitStatus::Signal(signal)) => format!("killed by signal {signal}"),
        Ending::Exited(ExitStatus::SpawnFailed(why)) => {
            format!("the worker could not be started: {why}")
        }
        Ending::Lost => format!("lost: {lost_reason}"),
    }
}

/// `TETHER_LAST_EXIT` for how the previous attempt ended: `code:N` or
/// `signal:NAME`. A worker that never started has no exit to tell.
fn last_exit_variable(status: &ExitStatus) -> Option<String> {
    match status {
        ExitStatus::Code(code) => Some(format!("code:{code}")),
        ExitStatus::Signal(signal) => Some(format!("signal:{}", procfs::signal_name(*signal))),
        ExitStatus::SpawnFailed(_) => None,
    }
}

fn submitted_event(spec: &RunSpec) -> String {
    let mut event = format!(
        "submitted: {} (restart {}",
        display_command(&spec.command),
        spec.restart.as_str()
    );
    if let Some(max) = spec.max_restarts {
        event.push_str(&format!(", at most {max} restarts"));
    }
    if let Some(ms) = spec.deadline_ms {
        event.push_str(&format!(
            ", deadline {}",
            policy::human(Duration::from_millis(ms))
        ));
    }
    event.push(')');
    event
}
