//! `tether stop ID [--timeout DUR]`: SIGTERM the execution's worker, SIGKILL
//! it after the timeout (default 10s); the execution ends `cancelled`.
//! Prints the state it ended in (`cancelled`, or the final state it had
//! already reached); `--json` prints the execution as `tether ps --json`
//! does. An unknown id exits 3.

use std::time::Duration;

use clap::Args;
use tether::{Error, Result};
use tether_protocol::{Request, Response};

use super::{duration, ps, write_stdout, Context};

/// Arguments of `tether stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The execution to stop.
    #[arg(value_name = "ID")]
    id: String,

    /// How long the worker has after SIGTERM before it gets SIGKILL.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration::parse)]
    timeout: Duration,
}

/// Runs `tether stop`.
pub async fn run(ctx: &Context, args: StopArgs) -> Result<()> {
    let request = Request::Stop {
        execution: args.id,
        timeout_ms: tether::time::millis(args.timeout),
    };
    // Stop is idempotent (stopping an ended execution answers at once), so
    // a session lost while waiting is simply retried.
    let response = ctx.connector("stop").request(&request).await?;
    let Response::Stopped(info) = response else {
        return Err(Error::Protocol(format!(
            "the daemon answered Stop with {}",
            response.name()
        )));
    };
    let text = if ctx.json {
        ps::json_line(&info)?
    } else {
        format!("{}\n", info.state.as_str())
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}
