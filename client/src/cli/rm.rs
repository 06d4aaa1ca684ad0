//! `tether rm ID...`, `tether prune [--older-than DUR]` and `tether
//! streams rm NAME...`: removing what is no longer wanted. Each prints
//! what it removed, one per line. An unknown id or stream exits 3, a live
//! execution (or its stream) exits 1, and then nothing is removed.

use std::time::Duration;

use clap::{Args, Subcommand};
use tether::Result;

use super::{duration, streams, write_stdout, Context};

/// Arguments of `tether rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// The executions to remove, by id (never by name).
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,

    /// Stop live executions first (SIGTERM, SIGKILL after 10s).
    #[arg(long)]
    force: bool,
}

/// Arguments of `tether prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Remove ended executions that ended at least this long ago. Without
    /// it, the daemon's `[executions] keep_ended` (default 30d); when
    /// that is "off", this must be given. `0s` removes every ended one.
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    older_than: Option<Duration>,
}

/// Arguments of `tether streams`.
#[derive(Debug, Args)]
pub struct StreamsArgs {
    #[command(subcommand)]
    command: Option<StreamsCommand>,
}

#[derive(Debug, Subcommand)]
enum StreamsCommand {
    /// Remove streams. Each leaves a tombstone of its last seq: a stream
    /// of that name made again continues above it.
    Rm(StreamsRmArgs),
}

/// Arguments of `tether streams rm`.
#[derive(Debug, Args)]
pub struct StreamsRmArgs {
    /// The streams to remove.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
}

/// Runs `tether rm`.
pub async fn rm(ctx: &Context, args: RmArgs) -> Result<()> {
    let removed = tether::sdk::remove(&ctx.connector("rm"), args.ids, args.force).await?;
    print(&removed)
}

/// Runs `tether prune`.
pub async fn prune(ctx: &Context, args: PruneArgs) -> Result<()> {
    let removed = tether::sdk::prune(&ctx.connector("prune"), args.older_than).await?;
    print(&removed)
}

/// Runs `tether streams`, or `tether streams rm`.
pub async fn streams(ctx: &Context, args: StreamsArgs) -> Result<()> {
    match args.command {
        None => streams::run(ctx).await,
        Some(StreamsCommand::Rm(args)) => {
            let connector = ctx.connector("streams rm");
            let removed = tether::sdk::remove_streams(&connector, args.names).await?;
            print(&removed)
        }
    }
}

fn print(removed: &[String]) -> Result<()> {
    let text: String = removed.iter().map(|id| format!("{id}\n")).collect();
    write_stdout(text.as_bytes())?;
    Ok(())
}
