//! `tether wait ID...`: block until each execution has ended, then exit as
//! `attach` would for the last one (its worker's last exit code).
//!
//! Each may be given by id or by name. They are waited for in order; one
//! that has already ended is done at once.

use clap::Args;
use tether::error::EXIT_OK;
use tether::Result;

use super::attach::{self, Watch, POLL};
use super::Context;

/// Arguments of `tether wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The executions: ids, or names (`run --name`).
    #[arg(value_name = "ID", required = true)]
    executions: Vec<String>,
}

/// Runs `tether wait`; returns the exit code.
pub async fn run(ctx: &Context, args: WaitArgs) -> u8 {
    attach::exit_of(wait_all(ctx, &args.executions).await)
}

async fn wait_all(ctx: &Context, keys: &[String]) -> Result<u8> {
    let connector = ctx.connector("wait");
    let mut code = EXIT_OK;
    for key in keys {
        let info = attach::resolve(&connector, key).await?;
        let mut watch = Watch::new(connector.clone(), &info.id);
        let mut ticker = tokio::time::interval(POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            ticker.tick().await;
            if let Some(ended) = watch.poll().await? {
                break ended;
            }
        };
        code = attach::exit_code(&ended);
    }
    Ok(code)
}
