//! `tetherd`: sets up the allocator, reads the config (file, environment,
//! flags), takes what the service manager passed, sets up logging and
//! signals, and calls
//! [`tetherd::run_with`]. SIGHUP reads the config again: the log level is
//! applied here, the rest is handed to the daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

mod allocator;
mod shell;

/// The tether daemon: durable, sequence-numbered streams over a unix socket,
/// and supervised workers whose output becomes streams.
#[derive(Clone, Debug, Parser)]
#[command(name = "tetherd", version, about)]
struct Args {
    /// Socket to listen on [default: $TETHER_SOCKET, $RUNTIME_DIRECTORY/tether.sock,
    /// /run/tether/tether.sock for root, $XDG_RUNTIME_DIR/tether/tether.sock,
    /// /tmp/tether-$UID/tether.sock]
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,

    /// Directory of the store and the instance lock [default: $TETHER_STATE_DIR,
    /// $STATE_DIRECTORY, /var/lib/tether for root, $XDG_STATE_HOME/tether]
    #[arg(long, value_name = "DIR", global = true)]
    state_dir: Option<PathBuf>,

    /// Config file [default: tetherd.toml in $CONFIGURATION_DIRECTORY,
    /// /etc/tether for root, $XDG_CONFIG_HOME/tether or ~/.config/tether;
    /// that default may be missing, a named file may not]
    #[arg(long, value_name = "FILE", env = "TETHER_CONFIG")]
    config: Option<PathBuf>,

    /// The shim program started for each worker attempt [default:
    /// tether-shim next to tetherd]
    #[arg(long, value_name = "PATH", env = "TETHER_SHIM")]
    shim: Option<PathBuf>,

    /// Largest accepted message in bytes [default: 16 MiB].
    #[arg(long, value_name = "BYTES")]
    max_frame_len: Option<usize>,

    /// Connections served at once [default: 4096].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,

    /// Retention: frames kept per stream (0 = no limit).
    #[arg(long, value_name = "N")]
    retention_max_frames: Option<u64>,

    /// Retention: payload bytes kept per stream (0 = no limit).
    #[arg(long, value_name = "BYTES")]
    retention_max_bytes: Option<u64>,

    /// Retention: age of the oldest frame kept, e.g. 12h or 30d; a bare
    /// number is seconds (0 = no limit).
    #[arg(long, value_name = "DUR", value_parser = tetherd::config::file::parse_duration)]
    retention_max_age: Option<Duration>,

    /// Checkpoints kept per execution; older ones are deleted [default: 10].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    checkpoint_keep: Option<u32>,

    /// Largest checkpoint accepted, in bytes [default: 8 MiB].
    #[arg(long, value_name = "BYTES")]
    max_checkpoint_bytes: Option<usize>,

    /// How log lines are written: text (to stderr, or the journal under
    /// systemd) or json (one object per line, to stderr) [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<tetherd::config::LogFormat>,

    /// A group (name or gid) whose members may answer questions and
    /// read; repeat for several [default: none].
    #[arg(long, value_name = "GROUP")]
    answerers: Vec<String>,

    /// Messages one execution's inbox holds at most [default: 10000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    inbox_max_messages: Option<u64>,

    #[command(subcommand)]
    command: Option<Command>,
}

/// What to do instead of serving.
#[derive(Clone, Debug, Subcommand)]
enum Command {
    /// Verify the store without changing a byte.
    ///
    /// Exit 0 with a summary when it is whole, 65 naming the damage found
    /// otherwise. Beside a running daemon (it holds the state directory),
    /// asks that daemon over its socket (`--socket`) to read every frame
    /// instead.
    Check,
    /// Repair a damaged store: the only way past damage.
    ///
    /// Copies the store's files to `damaged-<UTC time>/` in the state
    /// directory, keeps every record that verifies, records the seq
    /// ranges lost (readers get a gap notice there) and prints them per
    /// stream. Seqs go on above every seq seen, never reused. Refused
    /// while a daemon runs on the state directory, and with nothing
    /// changed when the copy would not fit on the disk.
    Repair,
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions {
        /// The shell to print a completion script for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Write a man page for every command into a directory.
    Manpages {
        /// The directory to write the pages to (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Set once logging writes JSON lines to stderr, so that nothing else
/// writes plain text there.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `tetherd` and `tetherd check` exit with this when the store is damaged
/// (`EX_DATAERR`); the shipped units do not restart on it.
const EXIT_DAMAGED: u8 = 65;

fn main() -> ExitCode {
    allocator::configure();
    let args = cli()
        .try_get_matches()
        .and_then(|mut matches| Args::from_arg_matches_mut(&mut matches))
        .unwrap_or_else(|e| e.exit());
    // Read once and removed before any thread starts, so that shims and
    // workers do not inherit them.
    let listen_env = tetherd::activation::ListenEnv::take_from_process();
    let notify_env = tetherd::notify::NotifyEnv::take_from_process();
    let result = match args.command.clone() {
        Some(Command::Check) => check(&args),
        Some(Command::Repair) => repair(&args),
        Some(Command::Completions { shell }) => print(&shell::completions(shell, cli())),
        Some(Command::Manpages { dir }) => shell::write_manpages(cli(), &dir).and_then(|paths| {
            let listing: String = paths.iter().map(|p| format!("{}\n", p.display())).collect();
            print(listing.as_bytes())
        }),
        None => start(args, &listen_env, &notify_env),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            const REPAIR_HINT: &str = "`tetherd repair` (with the same --state-dir) copies the \
                damaged files aside, keeps everything that verifies and says what was lost";
            // With JSON logs every stderr line is JSON: the error was just
            // logged as such, and so is the hint.
            let json = JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed);
            if !json {
                eprintln!("tetherd: error: {e}");
            }
            if e.is_damage() {
                if json {
                    tracing::error!("{REPAIR_HINT}");
                } else {
                    eprintln!("tetherd: {REPAIR_HINT}");
                }
                ExitCode::from(EXIT_DAMAGED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The clap definition of `tetherd`, with the examples of every command.
fn cli() -> clap::Command {
    shell::with_examples(Args::command())
}

/// Writes `bytes` to stdout.
fn print(bytes: &[u8]) -> tetherd::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| tetherd::Error::io("cannot write to stdout", e))
}

/// `tetherd check`: reads the files of a stopped daemon's store; beside a
/// running daemon (it holds the state directory's lock), asks that daemon
/// to verify its store over its socket instead.
fn check(args: &Args) -> tetherd::Result<()> {
    let config = config_from(args.clone())?;
    let summary = match tetherd::store::check::run(&config.state_dir) {
        Err(tetherd::Error::AlreadyRunning { .. }) => ask_daemon_to_verify(&config.socket)?,
        other => other?,
    };
    println!("{summary}");
    Ok(())
}

/// `tetherd repair`: see [`Command::Repair`].
fn repair(args: &Args) -> tetherd::Result<()> {
    let config = config_from(args.clone())?;
    match tetherd::store::repair::run(&config.state_dir, config.log_capacity) {
        Ok(report) => {
            println!("{report}");
            Ok(())
        }
        Err(e @ tetherd::Error::AlreadyRunning { .. }) => {
            eprintln!("tetherd: stop the daemon before repairing its store");
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Asks the daemon on `socket` to verify its store: Hello, then Verify, on
/// a blocking connection (the check runs no runtime of its own).
fn ask_daemon_to_verify(socket: &std::path::Path) -> tetherd::Result<String> {
    use std::io::{Read, Write};
    use tether_protocol::codec::{decode_wire_message, encode_frame};
    use tether_protocol::{Capabilities, ErrorCode, Hello, Request, Response};

    let failed = |what: &str, e: std::io::Error| {
        tetherd::Error::io(format!("{what} the daemon on {}", socket.display()), e)
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| failed("a daemon holds the state directory, but cannot reach", e))?;
    let hello = Request::Hello(Hello {
        version: tether_protocol::PROTOCOL_VERSION,
        capabilities: Capabilities::NONE,
        client: format!("tetherd {} check", env!("CARGO_PKG_VERSION")),
    });
    for request in [hello, Request::Verify] {
        let frame = encode_frame(&request)?;
        stream
            .write_all(&frame)
            .map_err(|e| failed("cannot write to", e))?;
    }
    loop {
        let mut len = [0u8; 4];
        stream
            .read_exact(&mut len)
            .map_err(|e| failed("no answer from", e))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > tether_protocol::DEFAULT_MAX_FRAME_LEN {
            return Err(tetherd::Error::InvalidRequest(format!(
                "the daemon on {} announced an answer of {len} bytes",
                socket.display()
            )));
        }
        let mut body = vec![0u8; len];
        stream
            .read_exact(&mut body)
            .map_err(|e| failed("no whole answer from", e))?;
        match decode_wire_message::<Response>(&body)? {
            Response::HelloOk(_) => {}
            Response::Verified(summary) => return Ok(summary),
            Response::Error(e) if e.code == ErrorCode::STORAGE => {
                return Err(tetherd::Error::DamageReported(e.message))
            }
            Response::Error(e) => {
                return Err(tetherd::Error::InvalidRequest(format!(
                    "the daemon refused to verify its store: {} ({})",
                    e.message, e.code
                )))
            }
            other => {
                return Err(tetherd::Error::InvalidRequest(format!(
                    "the daemon answered {} to Verify",
                    other.name()
                )))
            }
        }
    }
}

fn start(
    args: Args,
    listen_env: &tetherd::activation::ListenEnv,
    notify_env: &tetherd::notify::NotifyEnv,
) -> tetherd::Result<()> {
    let config = config_from(args.clone())?;
    let log = init_tracing(&config.log_level, config.log_format);
    // Before any thread starts, and before shims are started: see
    // `tetherd::inherited`.
    let marked = tether_protocol::inherited::close_on_exec_except(listen_env.passed())
        .map_err(|e| tetherd::Error::io("cannot keep inherited descriptors from workers", e))?;
    if marked > 0 {
        tracing::debug!("{marked} inherited descriptors marked close-on-exec");
    }
    let activated = listen_env.activate()?;
    let notifier = tetherd::notify::Notifier::from_env(notify_env)?;
    let (reload_tx, reloads) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    tetherd::shutdown::install_with_reload(shutdown.clone(), move || {
        reload(&args, &log, &reload_tx);
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tetherd")
        // Store reads run on blocking threads. A handful is enough for a
        // disk, and every extra thread may get a malloc arena of its own,
        // which shows as resident memory that is never given back.
        .max_blocking_threads(4)
        .build()
        .map_err(|e| tetherd::Error::io("cannot start the async runtime", e))?;
    let launch = tetherd::Launch {
        activated,
        notifier,
        reloads: Some(reloads),
    };
    runtime.block_on(tetherd::run_with(config, shutdown, launch))
}

/// SIGHUP: reads the config again. A config that fails to load changes
/// nothing; otherwise the log level is applied here and the config is
/// handed to the daemon, which applies or reports the rest.
fn reload(
    args: &Args,
    log: &LogHandle,
    daemon: &tokio::sync::mpsc::UnboundedSender<tetherd::Config>,
) {
    let config = match config_from(args.clone()) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("config reload failed, nothing changed: {e}");
            return;
        }
    };
    match EnvFilter::try_new(&config.log_level).map(|filter| log.reload(filter)) {
        Ok(Ok(())) => tracing::info!("config reload: log level is {:?}", config.log_level),
        Ok(Err(e)) => tracing::error!("config reload: cannot change the log level: {e}"),
        Err(e) => tracing::error!("config reload: bad log level: {e}"),
    }
    if daemon.send(config).is_err() {
        tracing::debug!("config reload: the daemon has stopped");
    }
}

fn config_from(args: Args) -> tetherd::Result<tetherd::Config> {
    let source = tether_protocol::paths::from_process(|env| {
        tetherd::config::ConfigSource::resolve(args.config.clone(), env)
    });
    let file = match source {
        Some(source) => source.load()?,
        None => tetherd::config::FileConfig::default(),
    };
    // The paths: the flag, else $TETHER_SOCKET / $TETHER_STATE_DIR, else
    // the config file, else the standard places.
    let (socket, state_dir) = tether_protocol::paths::from_process(|env| {
        let set = |name: &str| (env.var)(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let socket = args
            .socket
            .clone()
            .or_else(|| set("TETHER_SOCKET"))
            .or_else(|| file.socket.path.clone())
            .unwrap_or_else(|| tether_protocol::paths::default_socket(env));
        let state_dir = args
            .state_dir
            .clone()
            .or_else(|| set("TETHER_STATE_DIR"))
            .or_else(|| file.state_dir.clone())
            .or_else(|| tether_protocol::paths::default_state_dir(env));
        (socket, state_dir)
    });
    let state_dir = state_dir.ok_or_else(|| {
        tetherd::Error::Config(
            "no state directory: pass --state-dir or set TETHER_STATE_DIR or HOME".into(),
        )
    })?;
    let mut config = tetherd::Config::new(socket, state_dir);
    config.apply_file(&file);
    tether_protocol::paths::from_process(|env| config.apply_env(env))?;
    if let Some(n) = args.max_frame_len {
        config.max_frame_len = n;
    }
    if let Some(n) = args.max_connections {
        config.max_connections = n.max(1);
    }
    if let Some(shim) = args.shim {
        config.shim = Some(shim);
    }
    if let Some(n) = args.checkpoint_keep {
        config.checkpoint_keep = n as usize;
    }
    if let Some(n) = args.max_checkpoint_bytes {
        config.max_checkpoint_bytes = n;
    }
    if let Some(format) = args.log_format {
        config.log_format = format;
    }
    if !args.answerers.is_empty() {
        config.answerers = args.answerers;
    }
    if let Some(n) = args.inbox_max_messages {
        config.inbox_max_messages = n;
    }
    let limit = |v: u64| (v > 0).then_some(v);
    if let Some(n) = args.retention_max_frames {
        config.retention.max_frames = limit(n);
    }
    if let Some(n) = args.retention_max_bytes {
        config.retention.max_bytes = limit(n);
    }
    if let Some(age) = args.retention_max_age {
        config.retention.max_age = (!age.is_zero()).then_some(age);
    }
    Ok(config)
}

/// The handle that changes the log filter of the running subscriber.
type LogHandle = reload::Handle<EnvFilter, Registry>;

/// Sets up logging where [`tetherd::logging::choose`] says: text or JSON
/// lines on stderr, or the journal. `level` was checked when the config was
/// read; the filter can be replaced later through the returned handle.
fn init_tracing(level: &str, format: tetherd::config::LogFormat) -> LogHandle {
    use tetherd::logging::{choose, stderr_id, Sink, JOURNAL_FALLBACK};
    use tracing_subscriber::Layer;

    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let journal_stream = std::env::var("JOURNAL_STREAM").ok();
    let mut sink = choose(format, journal_stream.as_deref(), stderr_id());
    let mut journal_error = None;
    let journal = match sink {
        // No prefix: an event's `execution` field becomes EXECUTION=.
        Sink::Journal => match tracing_journald::layer() {
            Ok(layer) => Some(layer.with_field_prefix(None)),
            Err(e) => {
                journal_error = Some(e);
                sink = JOURNAL_FALLBACK;
                None
            }
        },
        _ => None,
    };
    // Colours only for a person at a terminal, never into files or journald.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let text = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let output = match (sink, journal) {
        (Sink::Journal, Some(journal)) => journal.boxed(),
        (Sink::Json, _) => text.json().with_ansi(false).boxed(),
        (Sink::Text { time: false }, _) => text.without_time().with_ansi(false).boxed(),
        _ => text.with_ansi(colour).boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .init();
    if sink == Sink::Json {
        JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(e) = journal_error {
        tracing::warn!("cannot reach the journal ({e}); logging to stderr instead");
    }
    handle
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The config key of each flag, as a line of `tetherd.toml`.
    const KEYS: &[(&str, &str)] = &[
        ("socket", "[socket]\npath = \"/run/t.sock\""),
        ("state-dir", "state_dir = \"/var/lib/t\""),
        ("shim", "shim = \"/usr/libexec/tether-shim\""),
        ("max-frame-len", "max_frame_len = 65536"),
        ("max-connections", "max_connections = 10"),
        ("retention-max-frames", "[retention]\nmax_frames = 10"),
        ("retention-max-bytes", "[retention]\nmax_bytes = 10"),
        ("retention-max-age", "[retention]\nmax_age = \"12h\""),
        ("checkpoint-keep", "checkpoint_keep = 3"),
        ("max-checkpoint-bytes", "max_checkpoint_bytes = 1024"),
        ("log-format", "log_format = \"json\""),
        ("answerers", "[access]\nanswerers = [\"ops\"]"),
        ("inbox-max-messages", "[inbox]\nmax_messages = 5"),
    ];

    #[test]
    fn every_flag_has_a_config_key() {
        let command = Args::command();
        for arg in command.get_arguments() {
            let Some(flag) = arg.get_long() else { continue };
            // The file cannot name itself.
            if ["config", "help", "version"].contains(&flag) {
                continue;
            }
            let (_, line) = KEYS
                .iter()
                .find(|(f, _)| *f == flag)
                .unwrap_or_else(|| panic!("--{flag} has no config key"));
            let file =
                tetherd::config::FileConfig::parse(line, std::path::Path::new("t.toml")).unwrap();
            assert_ne!(
                file,
                tetherd::config::FileConfig::default(),
                "{line:?} sets nothing"
            );
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        cli().debug_assert();
    }
}
