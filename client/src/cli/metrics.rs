//! `tether metrics`: the daemon's metrics in the Prometheus text format
//! (OpenMetrics), as a scrape of `[metrics] listen` would show them. The
//! text is machine-readable as it is, so `--json` changes nothing.

use tether::{Error, Result};
use tether_protocol::{Request, Response};

use super::{write_stdout, Context};

/// Runs `tether metrics`.
pub async fn run(ctx: &Context) -> Result<()> {
    let text = match ctx.connector("metrics").request(&Request::Metrics).await? {
        Response::Metrics(text) => text,
        other => {
            return Err(Error::Protocol(format!(
                "the daemon answered {} to Metrics",
                other.name()
            )))
        }
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}
