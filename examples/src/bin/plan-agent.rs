//! An example agent on the worker SDK: it works through a plan of steps,
//! each a durable step, and checkpoints the plan after every step it
//! finishes. Killed at any point and started again by the supervisor
//! (`tether run --restart on-failure -- plan-agent`), it continues from the
//! next step: the checkpoint says where the plan stood, and a step whose
//! result was recorded after the last checkpoint is not run again either.
//!
//! Each step prints `step N done` to stdout (a frame of the execution's
//! stream). When `PLAN_AGENT_COUNT_FILE` is set, every time a step's body
//! really runs the agent appends `step=N pid=P` to that file, so a test can
//! prove that no finished step ran twice. `PLAN_AGENT_STEPS` (default 8)
//! and `PLAN_AGENT_STEP_MS` (default 300) size the plan.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tether::{CheckpointTrigger, Worker, WorkerError};

/// The version of [`Plan`]'s JSON form, stored with each checkpoint.
const SCHEMA_VERSION: u32 = 1;

/// What the agent checkpoints: how far the plan has got.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Plan {
    /// The next step to run (1-based).
    next: u32,
    /// The outputs of the finished steps.
    outputs: Vec<String>,
}

/// The agent's own events; the trigger checkpoints on `StepDone`.
#[derive(Debug)]
enum Event {
    StepStarted,
    StepDone,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plan-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), WorkerError> {
    let steps = env_number("PLAN_AGENT_STEPS", 8);
    let pause = Duration::from_millis(u64::from(env_number("PLAN_AGENT_STEP_MS", 300)));
    let count_file = std::env::var_os("PLAN_AGENT_COUNT_FILE");

    let worker = Worker::from_env()?;
    let mut plan = match worker.restore::<Plan>(SCHEMA_VERSION).await? {
        Some(plan) => {
            eprintln!("plan-agent: resuming at step {}", plan.next);
            plan
        }
        None => Plan {
            next: 1,
            outputs: Vec::new(),
        },
    };
    let mut trigger = CheckpointTrigger::when(|e: &Event| matches!(e, Event::StepDone));

    while plan.next <= steps {
        let n = plan.next;
        trigger.should_checkpoint(&Event::StepStarted);
        let count_file = count_file.clone();
        let output: String = worker
            .step(&format!("step-{n}"), || async move {
                if let Some(path) = count_file {
                    record_run(&path, n)?;
                }
                // The work itself: here, only time passing.
                tokio::time::sleep(pause).await;
                Ok::<_, std::io::Error>(format!("step {n} done"))
            })
            .await?;
        println!("{output}");
        plan.outputs.push(output);
        plan.next += 1;
        if trigger.should_checkpoint(&Event::StepDone) {
            worker.checkpoint(&plan, SCHEMA_VERSION).await?;
        }
    }
    println!("plan complete: {} steps", plan.outputs.len());
    Ok(())
}

/// Appends `step=N pid=P` to the count file, durably, before the step's
/// work starts.
fn record_run(path: &std::ffi::OsStr, step: u32) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(file, "step={step} pid={}", std::process::id())?;
    file.sync_data()
}

/// A number from the environment, or `default` when unset or not a number.
fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
