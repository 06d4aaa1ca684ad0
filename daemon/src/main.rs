//! `tetherd`: parses flags, sets up logging and signals, and calls
//! [`tetherd::run`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The tether daemon: durable, sequence-numbered streams over a unix socket,
/// and supervised workers whose output becomes streams.
#[derive(Debug, Parser)]
#[command(name = "tetherd", version, about)]
struct Args {
    /// Socket to listen on [default: $TETHER_SOCKET, $RUNTIME_DIRECTORY/tether.sock,
    /// /run/tether/tether.sock for root, $XDG_RUNTIME_DIR/tether/tether.sock,
    /// /tmp/tether-$UID/tether.sock]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// Directory of the store and the instance lock [default: $TETHER_STATE_DIR,
    /// $STATE_DIRECTORY, /var/lib/tether for root, $XDG_STATE_HOME/tether]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// The shim program started for each worker attempt [default:
    /// tether-shim next to tetherd]
    #[arg(long, value_name = "PATH", env = "TETHER_SHIM")]
    shim: Option<PathBuf>,

    /// Largest accepted message in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = tether_protocol::DEFAULT_MAX_FRAME_LEN)]
    max_frame_len: usize,

    /// Connections served at once.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_connections: usize,

    /// Retention: frames kept per stream (0 = no limit).
    #[arg(long, value_name = "N")]
    retention_max_frames: Option<u64>,

    /// Retention: payload bytes kept per stream (0 = no limit).
    #[arg(long, value_name = "BYTES")]
    retention_max_bytes: Option<u64>,

    /// Retention: age of the oldest frame kept, in seconds (0 = no limit).
    #[arg(long, value_name = "SECS")]
    retention_max_age: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing();
    match start(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("tetherd: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start(args: Args) -> tetherd::Result<()> {
    let config = config_from(args)?;
    let shutdown = CancellationToken::new();
    tetherd::shutdown::install_signal_handlers(shutdown.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tetherd")
        // Store reads run on blocking threads. A handful is enough for a
        // disk, and every extra thread may get a malloc arena of its own,
        // which shows as resident memory that is never given back.
        .max_blocking_threads(4)
        .build()
        .map_err(|e| tetherd::Error::io("cannot start the async runtime", e))?;
    runtime.block_on(tetherd::run(config, shutdown))
}

fn config_from(args: Args) -> tetherd::Result<tetherd::Config> {
    let (socket, state_dir) = tether_protocol::paths::from_process(|env| {
        (
            args.socket
                .clone()
                .unwrap_or_else(|| tether_protocol::paths::default_socket(env)),
            args.state_dir
                .clone()
                .or_else(|| tether_protocol::paths::default_state_dir(env)),
        )
    });
    let state_dir = state_dir.ok_or_else(|| {
        tetherd::Error::Config(
            "no state directory: pass --state-dir or set TETHER_STATE_DIR or HOME".into(),
        )
    })?;
    let mut config = tetherd::Config::new(socket, state_dir);
    config.max_frame_len = args.max_frame_len;
    config.max_connections = args.max_connections.max(1);
    config.shim = args.shim;
    let limit = |v: u64| (v > 0).then_some(v);
    if let Some(n) = args.retention_max_frames {
        config.retention.max_frames = limit(n);
    }
    if let Some(n) = args.retention_max_bytes {
        config.retention.max_bytes = limit(n);
    }
    if let Some(n) = args.retention_max_age {
        config.retention.max_age = limit(n).map(Duration::from_secs);
    }
    Ok(config)
}

/// Logs go to stderr. Under journald (`JOURNAL_STREAM` set) the journal
/// adds its own timestamps, so ours are left out. `TETHER_LOG` filters
/// (default `info`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().with_ansi(false).init();
    } else {
        builder.init();
    }
}
