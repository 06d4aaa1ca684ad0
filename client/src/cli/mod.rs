//! The `tether` command line: global flags, one module per command, and
//! the mapping of errors to exit codes.
//!
//! * [`publish`], [`tail`], [`streams`], [`status`], [`metrics`], [`run`],
//!   [`ps`], [`stop`], [`checkpoint`], [`rm`] (`rm`, `prune`, `streams
//!   rm`), [`apply`]: the commands.
//! * [`questions`] (`ask`, `answer`, `questions`) and [`inbox`] (`send`,
//!   `recv`): human gates and inboxes.
//! * [`dial_stdio`]: the bridge that `--host ssh://` runs on the remote
//!   machine.
//! * [`attach`]: `attach` and `run --attach`, following an execution until
//!   it ends; [`wait`]: waiting for executions to end.
//! * [`run_env`]: the caller's environment as `run` passes it on.
//! * [`lines`]: stdin split into line frames, in large reads.
//! * [`cursor`]: the `--cursor-file` format and its atomic update.
//! * [`output`]: how frames are printed (plain and `--json`).
//! * [`table`]: aligned text tables.
//! * [`duration`]: durations such as `500ms` or `2m`.
//! * [`shell`]: `completions` and `manpages`; [`examples`]: the examples
//!   that end every command's `--help`.

pub mod apply;
pub mod attach;
pub mod checkpoint;
pub mod dial_stdio;
pub mod duration;
pub mod examples;
pub mod inbox;
pub mod lines;
pub mod metrics;
pub mod output;
pub mod ps;
pub mod publish;
pub mod questions;
pub mod resume;
pub mod rm;
pub mod run;
pub mod run_env;
pub mod shell;
pub mod status;
pub mod step;
pub mod stop;
pub mod streams;
pub mod table;
pub mod tail;
pub mod wait;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tether::conn::{NoDaemonNotice, StorageFaultNotice};
use tether::error::{humanize, EXIT_OK};
use tether::{ConnectOptions, Connector, Endpoint, Error, Result};

/// Talk to a tetherd: publish to streams, tail them, run supervised
/// workers, inspect the daemon.
#[derive(Debug, Parser)]
#[command(name = "tether", version, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Flags every command accepts.
#[derive(Debug, Args)]
pub struct Global {
    /// The daemon's socket [default: $TETHER_SOCKET or the standard path]
    ///
    /// Without this flag: $TETHER_SOCKET, else $RUNTIME_DIRECTORY/tether.sock,
    /// else /run/tether/tether.sock for root, else
    /// $XDG_RUNTIME_DIR/tether/tether.sock, else /tmp/tether-$UID/tether.sock.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "host")]
    socket: Option<PathBuf>,

    /// A daemon on another machine: ssh://[user@]host[:port][/socket/path]
    /// [default: $TETHER_HOST]
    ///
    /// Runs `tether dial-stdio` on the host through `ssh -o BatchMode=yes
    /// [-p PORT] [user@]host` and speaks to the remote daemon through it, so
    /// ssh keys (or an agent) and known host keys must be set up, and
    /// `tether` must be on the remote PATH. $TETHER_SSH
    /// replaces `ssh` and may add options, split on whitespace (e.g.
    /// "ssh -i ~/.ssh/ops_key"). $TETHER_HOST is used only when neither
    /// --host nor --socket is given.
    #[arg(long, global = true, value_name = "URL")]
    host: Option<String>,

    /// Machine-readable output: one JSON object per line.
    #[arg(long, global = true)]
    json: bool,

    /// How long to keep retrying (e.g. 500ms, 30s, 2m) before giving up: exit
    /// code 4 if the daemon cannot be reached, 1 if it keeps refusing (disk full).
    #[arg(
        long,
        global = true,
        value_name = "DUR",
        default_value = "30s",
        value_parser = duration::parse
    )]
    connect_timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Publish each stdin line as one frame on STREAM.
    Publish(publish::PublishArgs),
    /// Print a stream's frames, one per line.
    Tail(tail::TailArgs),
    /// List streams with their retained range, size and consumers; `rm`
    /// removes streams.
    Streams(rm::StreamsArgs),
    /// Show the daemon's status.
    Status,
    /// Start a supervised worker and print its execution id.
    Run(run::RunArgs),
    /// Start the executions a TOML file declares, unless they exist;
    /// list those whose spec differs (--replace starts them again).
    Apply(apply::ApplyArgs),
    /// List supervised executions.
    Ps(ps::PsArgs),
    /// Stop an execution: SIGTERM, then SIGKILL after the timeout.
    Stop(stop::StopArgs),
    /// Start a new attempt of an ended execution from its newest (or the
    /// named) checkpoint.
    Resume(resume::ResumeArgs),
    /// Stop the running attempt and start the next at once.
    Restart(resume::RestartArgs),
    /// Remove ended executions with their stream, checkpoints and steps.
    Rm(rm::RmArgs),
    /// Remove ended executions that ended long enough ago.
    Prune(rm::PruneArgs),
    /// Save, load and list an execution's checkpoints.
    Checkpoint(checkpoint::CheckpointArgs),
    /// Run, record, show and forget an execution's durable steps.
    Step(step::StepArgs),
    /// Print an execution's output and follow it until it ends; exit with
    /// its worker's exit code.
    Attach(attach::AttachArgs),
    /// Wait until executions have ended; exit with the last one's worker's
    /// exit code.
    Wait(wait::WaitArgs),
    /// Ask a question for an execution and wait for the answer; print it.
    Ask(questions::AskArgs),
    /// Answer an execution's question; the first answer wins.
    Answer(questions::AnswerArgs),
    /// List open questions (all of them with --all).
    Questions(questions::QuestionsArgs),
    /// Queue a message in an execution's inbox.
    Send(inbox::SendArgs),
    /// Print the next message of an execution's inbox, and remove it.
    Recv(inbox::RecvArgs),
    /// Bridge stdin and stdout to the local daemon's socket (what
    /// --host ssh:// runs on the remote machine).
    DialStdio,
    /// Print the daemon's metrics in the Prometheus text format.
    Metrics,
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(shell::CompletionsArgs),
    /// Write a man page for every command into a directory.
    Manpages(shell::ManpagesArgs),
}

/// The environment variable naming a remote daemon, like `--host`.
pub const HOST_ENV: &str = "TETHER_HOST";

/// What every command needs from the global flags.
#[derive(Debug, Clone)]
pub struct Context {
    /// Where the daemon is.
    pub endpoint: Endpoint,
    /// `--json` was given.
    pub json: bool,
    /// The retry window.
    pub connect_timeout: Duration,
}

impl Context {
    /// A connector describing itself as `tether <version> <command>`.
    pub fn connector(&self, command: &str) -> Connector {
        Connector::new(
            self.endpoint.clone(),
            ConnectOptions {
                retry_window: self.connect_timeout,
                client: format!("tether {} {command}", env!("CARGO_PKG_VERSION")),
                on_storage_fault: StorageFaultNotice::new(|cause| {
                    // A stderr that cannot be written must not stop the
                    // command.
                    let _ = writeln!(
                        std::io::stderr(),
                        "tether: {cause}; keeping unacknowledged data and retrying"
                    );
                }),
                on_no_daemon: NoDaemonNotice::new(|endpoint, window| {
                    // One command may open several links; the hint is
                    // printed once per process.
                    static TOLD: AtomicBool = AtomicBool::new(false);
                    if !TOLD.swap(true, Ordering::Relaxed) {
                        let _ = writeln!(std::io::stderr(), "{}", no_daemon_hint(endpoint, window));
                    }
                }),
                ..ConnectOptions::default()
            },
        )
    }
}

/// The line printed when the first attempt finds no daemon.
fn no_daemon_hint(endpoint: &Endpoint, window: Duration) -> String {
    format!(
        "tether: no daemon at {endpoint} (retrying for {}; start one with 'tetherd' or \
         'systemctl start tetherd')",
        humanize(window)
    )
}

/// Parses the command line, runs the command and returns its exit code.
/// Usage errors exit 2 (and `--help` 0) through clap.
pub fn main() -> ExitCode {
    let cli = command()
        .try_get_matches()
        .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches))
        .unwrap_or_else(|e| e.exit());
    // These two only print what the command line is; no daemon is needed.
    match &cli.command {
        Command::Completions(args) => return finish(shell::completions(args)),
        Command::Manpages(args) => return finish(shell::manpages(args)),
        _ => {}
    }
    let host_env = std::env::var(HOST_ENV).ok();
    let endpoint = match endpoint(&cli, host_env.as_deref()) {
        Ok(endpoint) => endpoint,
        Err(e) => return report(&e),
    };
    let context = Context {
        endpoint,
        json: cli.global.json,
        connect_timeout: cli.global.connect_timeout,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(source) => {
            return report(&Error::Local {
                context: "cannot start the async runtime".into(),
                source,
            })
        }
    };
    let outcome = runtime.block_on(async {
        let done = |result: Result<()>| result.map(|()| EXIT_OK);
        match cli.command {
            Command::Publish(args) => publish::run(&context, args).await,
            Command::Tail(args) => done(tail::run(&context, args).await),
            Command::Streams(args) => done(rm::streams(&context, args).await),
            Command::Rm(args) => done(rm::rm(&context, args).await),
            Command::Prune(args) => done(rm::prune(&context, args).await),
            Command::Status => done(status::run(&context).await),
            Command::Run(args) => run::run(&context, args).await,
            Command::Apply(args) => apply::run(&context, args).await,
            Command::Ps(args) => done(ps::run(&context, args).await),
            Command::Stop(args) => done(stop::run(&context, args).await),
            Command::Resume(args) => done(resume::resume(&context, args).await),
            Command::Restart(args) => done(resume::restart(&context, args).await),
            Command::Checkpoint(args) => checkpoint::run(&context, args).await,
            Command::Step(args) => step::run(&context, args).await,
            Command::Attach(args) => Ok(attach::run(&context, args).await),
            Command::Wait(args) => Ok(wait::run(&context, args).await),
            Command::Ask(args) => questions::ask(&context, args).await,
            Command::Answer(args) => questions::answer(&context, args).await,
            Command::Questions(args) => questions::questions(&context, args).await,
            Command::Send(args) => inbox::send(&context, args).await,
            Command::Recv(args) => inbox::recv(&context, args).await,
            Command::DialStdio => done(dial_stdio::run(&context).await),
            Command::Metrics => done(metrics::run(&context).await),
            Command::Completions(_) | Command::Manpages(_) => Ok(EXIT_OK),
        }
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => report(&e),
    }
}

/// The clap definition of `tether`, with the examples of every command.
pub fn command() -> clap::Command {
    examples::with_examples(Cli::command())
}

/// The exit code of a command that needs no daemon.
fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => report(&e),
    }
}

/// Where the daemon is: `--socket`, else `--host`, else `$TETHER_HOST`
/// (`host_env`), else the standard local socket. `dial-stdio` serves the
/// daemon of the machine it runs on, so it never follows `$TETHER_HOST`
/// (which would send it back over ssh).
fn endpoint(cli: &Cli, host_env: Option<&str>) -> Result<Endpoint> {
    let dialing = matches!(cli.command, Command::DialStdio);
    let host = match (&cli.global.host, host_env) {
        (Some(host), _) => Some(host.as_str()),
        (None, Some(host)) if !dialing && cli.global.socket.is_none() && !host.is_empty() => {
            Some(host)
        }
        _ => None,
    };
    match (&cli.global.socket, host) {
        (Some(path), _) => Ok(Endpoint::unix(path)),
        (None, Some(url)) => Endpoint::ssh(url),
        (None, None) => Ok(Endpoint::default_local()),
    }
}

fn report(error: &Error) -> ExitCode {
    eprintln!("tether: {error}");
    ExitCode::from(error.exit_code())
}

/// Clap value parser for stream names.
pub fn stream_name(s: &str) -> Result<String, String> {
    name("stream", s)
}

/// Clap value parser for producer names.
pub fn producer_name(s: &str) -> Result<String, String> {
    name("producer", s)
}

/// Clap value parser for consumer names.
pub fn consumer_name(s: &str) -> Result<String, String> {
    name("consumer", s)
}

fn name(what: &'static str, s: &str) -> Result<String, String> {
    tether_protocol::validate_name(what, s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

/// All of stdin, as `what` (named in the error). The daemon enforces its
/// size limits and names both sizes when it refuses, so none is applied
/// here beyond the frame size the request must fit in.
pub fn read_stdin(what: &str) -> Result<bytes::Bytes> {
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut data).map_err(|source| {
        Error::Local {
            context: format!("cannot read {what} from stdin"),
            source,
        }
    })?;
    Ok(bytes::Bytes::from(data))
}

/// Writes `bytes` to stdout in one go. A closed stdout (the reader of a
/// pipe went away) is reported as `Ok(false)`: not an error, but nothing
/// more should be printed.
pub fn write_stdout(bytes: &[u8]) -> Result<bool> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(source) => Err(Error::Local {
            context: "cannot write to stdout".into(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_work_after_the_command() {
        let cli = Cli::try_parse_from([
            "tether",
            "tail",
            "s",
            "--json",
            "--socket",
            "/x.sock",
            "--connect-timeout",
            "500ms",
        ])
        .unwrap();
        assert!(cli.global.json);
        assert_eq!(cli.global.socket, Some(PathBuf::from("/x.sock")));
        assert_eq!(cli.global.connect_timeout, Duration::from_millis(500));
    }

    #[test]
    fn host_comes_from_the_flag_then_the_environment_unless_a_socket_is_given() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap();
        let flag = parse(&["tether", "status", "--host", "ssh://a/s.sock"]);
        let shown = |e: Result<Endpoint>| e.unwrap().to_string();
        assert_eq!(shown(endpoint(&flag, Some("ssh://b"))), "ssh://a/s.sock");
        let plain = parse(&["tether", "status"]);
        assert_eq!(shown(endpoint(&plain, Some("ssh://b:22"))), "ssh://b:22");
        let socket = parse(&["tether", "status", "--socket", "/l.sock"]);
        assert_eq!(shown(endpoint(&socket, Some("ssh://b"))), "/l.sock");
        let dial = parse(&["tether", "dial-stdio", "--socket", "/l.sock"]);
        assert_eq!(shown(endpoint(&dial, Some("ssh://b"))), "/l.sock");
        let dial = parse(&["tether", "dial-stdio"]);
        assert!(matches!(
            endpoint(&dial, Some("ssh://b")).unwrap(),
            Endpoint::Unix(_)
        ));
        let bad = endpoint(&plain, Some("http://b")).unwrap_err();
        assert_eq!(bad.exit_code(), 2);
        let err = Cli::try_parse_from(["tether", "status", "--host", "ssh://a", "--socket", "/s"])
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn bad_names_and_conflicting_starts_are_usage_errors() {
        let err = Cli::try_parse_from(["tether", "publish", "a b"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err =
            Cli::try_parse_from(["tether", "tail", "s", "-n", "3", "--from-seq", "4"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
