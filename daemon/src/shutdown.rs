//! Shutdown in three steps: decide, tell, wait.
//!
//! Signals are received by signal-hook on a small thread of their own (so
//! nothing async runs in a signal handler) and turned into a cancellation
//! of the daemon's [`CancellationToken`]. Every task watches that token; the
//! server's task tracker then waits for the tasks, and `run` finishes the
//! commit in flight before it returns. SIGHUP instead asks for the config
//! to be read again.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

/// Starts the signal thread: SIGTERM and SIGINT cancel `token`; SIGHUP calls
/// `reload` on that thread, one reload at a time. A second SIGTERM or
/// SIGINT while shutting down changes nothing: shutdown is already bounded.
pub fn install_with_reload(
    token: CancellationToken,
    mut reload: impl FnMut() + Send + 'static,
) -> Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Error::io("cannot install signal handlers", e))?;
    std::thread::Builder::new()
        .name("tetherd-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                match signal {
                    SIGHUP => {
                        tracing::info!("SIGHUP received: reloading the config");
                        reload();
                    }
                    _ => {
                        let name = if signal == SIGTERM {
                            "SIGTERM"
                        } else {
                            "SIGINT"
                        };
                        tracing::info!("{name} received: shutting down");
                        token.cancel();
                    }
                }
            }
        })
        .map_err(|e| Error::io("cannot start the signal thread", e))?;
    Ok(())
}
