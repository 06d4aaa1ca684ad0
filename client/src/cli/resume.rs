//! `tether resume ID [--checkpoint CKPT]` and `tether restart ID [--timeout
//! DUR]`: a new attempt of an execution, on request.
//!
//! `resume` starts a new attempt of an ended execution (`completed`,
//! `failed`, `cancelled`, `lost`), same id and stream, from its newest
//! valid checkpoint or the one named (its ID as `tether checkpoint list`
//! shows it), with `TETHER_RESUMED=1`; its recorded steps stand. `restart`
//! stops the running attempt (SIGTERM, SIGKILL after the timeout, default
//! 10s) and starts the next at once. Both print the execution id once the
//! new attempt's start is recorded. A live execution given to `resume`, or
//! an ended one given to `restart`, exits 1; an unknown one exits 3.

use std::time::Duration;

use clap::Args;
use tether::Result;

use super::{duration, write_stdout, Context};

/// Arguments of `tether resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The ended execution to resume.
    #[arg(value_name = "ID")]
    id: String,

    /// Resume from this checkpoint (its ID in `tether checkpoint list`)
    /// rather than the newest valid one.
    #[arg(long, value_name = "CKPT")]
    checkpoint: Option<u64>,
}

/// Arguments of `tether restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The execution to restart.
    #[arg(value_name = "ID")]
    id: String,

    /// How long the worker has after SIGTERM before it gets SIGKILL.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration::parse)]
    timeout: Duration,
}

/// Runs `tether resume`.
pub async fn resume(ctx: &Context, args: ResumeArgs) -> Result<()> {
    let connector = ctx.connector("resume");
    let id = tether::sdk::resume(&connector, &args.id, args.checkpoint).await?;
    write_stdout(format!("{id}\n").as_bytes()).map(drop)
}

/// Runs `tether restart`.
pub async fn restart(ctx: &Context, args: RestartArgs) -> Result<()> {
    let connector = ctx.connector("restart");
    let id = tether::sdk::restart(&connector, &args.id, args.timeout).await?;
    write_stdout(format!("{id}\n").as_bytes()).map(drop)
}
