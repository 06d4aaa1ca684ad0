//! `tether run [--id KEY] [--name N] [--label K=V]... [--parent ID]
//! [--restart POLICY] [--max-restarts K] [--max-failures-without-progress N]
//! [--deadline DUR] [--stop-signal SIG] [--cwd DIR] [--env K=V]...
//! [--env-file F]... [--clean-env] [--pty] [--attach] -- CMD [ARG]...`:
//! start a supervised worker and print its execution id (also the name of
//! its output stream), or `{"id":"..."}` with `--json`.
//!
//! With `--id KEY` the execution's id is KEY; when an execution with that
//! id exists, in any state, nothing is started and KEY is printed (the
//! daemon decides, so of concurrent runs with one KEY exactly one starts).
//!
//! The worker runs as typed: in the caller's directory, with the caller's
//! environment less the caller's own session variables ([`super::run_env`]),
//! then `--env-file` lines and `--env` pairs on top (the first `=`
//! separates name and value); `--clean-env` starts from nothing instead.
//! That is sent as the worker's whole environment (`RunFull`). With
//! `--host` nothing local is sent: the worker gets the remote daemon's
//! directory and environment, plus what `--cwd`, `--env` and `--env-file`
//! say. `--cwd` is made absolute here, against the caller's directory. A
//! run that asks for nothing beyond the plain spec goes as `Run`, which
//! any daemon takes, and a daemon too old for `RunFull` is asked with
//! `Run` unless `--pty` or `--clean-env` needs the new request. With
//! `--attach` the command then follows the execution until it ends (see
//! [`super::attach`]) and exits with its worker's exit code.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use tether::conn::Endpoint;
use tether::error::EXIT_OK;
use tether::sdk::RunOptions;
use tether::{Error, Result};
use tether_protocol::{
    Request, Response, RestartPolicy, RunSpec, RunSpecFull, MAX_RUN_BYTES, MAX_RUN_ITEMS,
};

use super::{attach, duration, run_env, write_stdout, Context};

/// Arguments of `tether run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The execution's id: 1 to 128 of A-Z a-z 0-9 . _ -. When an
    /// execution with this id exists, nothing is started: its id is
    /// printed (and --attach attaches to it).
    #[arg(long, value_name = "KEY", value_parser = run_id)]
    id: Option<String>,

    /// A label for `ps --label` to filter on (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = label_pair)]
    labels: Vec<(String, String)>,

    /// The execution that starts this one (it must exist); the worker gets
    /// it as TETHER_PARENT_ID.
    #[arg(long, value_name = "ID")]
    parent: Option<String>,

    /// End the execution `failed` (reason `crash loop`) after N failed
    /// attempts in a row that recorded no checkpoint and no step
    /// [default: the daemon's, 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_failures_without_progress: Option<u32>,

    /// The signal `tether stop` sends the worker's process group first
    /// (TERM, INT, HUP, QUIT, USR1, USR2, KILL); KILL follows after the
    /// stop's timeout [default: TERM].
    #[arg(long, value_name = "SIG", value_parser = stop_signal)]
    stop_signal: Option<String>,

    /// A label for `tether ps`; the execution id starts with it.
    #[arg(long, value_name = "N")]
    name: Option<String>,

    /// When the worker is started again after it ends.
    #[arg(
        long,
        value_name = "POLICY",
        default_value = "on-failure",
        value_parser = PossibleValuesParser::new(["never", "on-failure", "always"])
            .map(|s| restart_policy(&s))
    )]
    restart: RestartPolicy,

    /// Restarts allowed after the first attempt [default: unlimited].
    #[arg(long, value_name = "K")]
    max_restarts: Option<u32>,

    /// No attempt starts later than this after the run (e.g. 10m, 2h).
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    deadline: Option<Duration>,

    /// The worker's working directory [default: the current one; with
    /// --host, the remote daemon's].
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Set a variable in the worker's environment (repeatable; wins over
    /// the caller's and --env-file's).
    #[arg(long = "env", value_name = "K=V", value_parser = env_pair)]
    env: Vec<(String, String)>,

    /// Add the KEY=VALUE lines of file F to the worker's environment
    /// (repeatable; blank lines and lines starting with # are skipped).
    #[arg(long = "env-file", value_name = "F")]
    env_files: Vec<PathBuf>,

    /// Start the worker from an empty environment instead of the caller's
    /// (with --host: instead of the remote daemon's); --env and --env-file
    /// still apply, and the worker still gets its TETHER_* variables.
    #[arg(long)]
    clean_env: bool,

    /// Give the worker a pseudo-terminal for stdout and stderr, so that
    /// programs that buffer output to a pipe show each line as it is
    /// written; both then arrive as stdout.
    #[arg(long)]
    pty: bool,

    /// Follow the worker's output until the execution ends; exit with the
    /// worker's exit code.
    #[arg(long)]
    attach: bool,

    /// The program and its arguments (after `--` when they start with `-`).
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<String>,
}

/// Runs `tether run`; returns the exit code.
pub async fn run(ctx: &Context, args: RunArgs) -> Result<u8> {
    let attach = args.attach;
    // A remote daemon's worker gets nothing of this machine's.
    let local_env = match ctx.endpoint {
        Endpoint::Unix(_) => Some(std::env::vars_os().collect::<Vec<_>>()),
        _ => None,
    };
    let run = run_of(args, local_env, &std::env::current_dir)?;
    let id = submit(ctx, run).await?;
    let line = if ctx.json {
        serde_json::json!({ "id": id }).to_string() + "\n"
    } else {
        format!("{id}\n")
    };
    if !write_stdout(line.as_bytes())? || !attach {
        return Ok(EXIT_OK);
    }
    Ok(attach::exit_of(attach::follow(ctx, &id, None).await))
}

/// Sends the run once, on one session: it is not idempotent, so a session
/// lost after sending is reported rather than retried. A refusal of
/// `RunFull` as unknown means nothing ran, so asking again with `Run` is
/// safe.
pub(super) async fn submit(ctx: &Context, run: RunSpecFull) -> Result<String> {
    let extras = run.id.is_some()
        || !run.labels.is_empty()
        || run.parent.is_some()
        || run.max_failures_without_progress.is_some()
        || run.stop_signal.is_some();
    if !run.whole_env && !run.pty && !extras {
        return submit_once(ctx, Request::Run(run.spec)).await;
    }
    let (spec, needs_full) = (run.spec.clone(), run.pty || !run.whole_env || extras);
    match submit_once(ctx, Request::RunFull(run)).await {
        Err(e) if e.is_unknown_request() && !needs_full => {
            // The variables go as additions to the daemon's environment,
            // which is as close as an older daemon can come.
            submit_once(ctx, Request::Run(spec)).await
        }
        Err(e) if e.is_unknown_request() => Err(Error::Usage(
            "the daemon is older than this tether and cannot run a worker on a \
             pseudo-terminal (--pty), from a clean environment (--clean-env), or with \
             --id, --label, --parent, --max-failures-without-progress or --stop-signal"
                .into(),
        )),
        other => other,
    }
}

async fn submit_once(ctx: &Context, request: Request) -> Result<String> {
    let mut conn = ctx.connector("run").connect().await?;
    match conn.request(&request).await {
        Ok(Response::Started { execution }) => Ok(execution),
        Ok(other) => Err(Error::Protocol(format!(
            "the daemon answered {} with {}",
            request.name(),
            other.name()
        ))),
        Err(e) if e.is_connection_failure() => {
            eprintln!(
                "tether: the connection was lost after the run was sent; \
                 it may have started: check `tether ps` before running it again"
            );
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The run `args` ask for, with `--cwd` made absolute against `cwd`.
/// `local_env` is the caller's environment when the daemon is on this
/// machine, `None` for a remote one.
fn run_of(
    args: RunArgs,
    local_env: Option<Vec<(OsString, OsString)>>,
    cwd: &dyn Fn() -> std::io::Result<PathBuf>,
) -> Result<RunSpecFull> {
    let mut added = Vec::new();
    for file in &args.env_files {
        added.extend(run_env::read_file(file)?);
    }
    added.extend(args.env);
    let (env, whole_env, dir) = match local_env {
        Some(vars) => {
            let base = if args.clean_env {
                Vec::new()
            } else {
                run_env::callers(vars)
            };
            let dir = args.cwd.unwrap_or_else(|| PathBuf::from("."));
            (run_env::merge(base, added), true, Some(dir))
        }
        None => (run_env::merge(Vec::new(), added), args.clean_env, args.cwd),
    };
    let mut run = RunOptions {
        command: args.command,
        name: args.name,
        restart: args.restart,
        max_restarts: args.max_restarts,
        deadline: args.deadline,
        cwd: dir,
        env,
        id: args.id,
        labels: args.labels,
        parent: args.parent,
        max_failures_without_progress: args.max_failures_without_progress,
        stop_signal: args.stop_signal,
    }
    .into_full_in(cwd)?;
    run.whole_env = whole_env;
    run.pty = args.pty;
    // `.` resolved is the directory itself, without a trailing `/.`.
    if let Some(dir) = run.spec.cwd.as_mut() {
        if let Some(stripped) = dir.strip_suffix("/.") {
            *dir = if stripped.is_empty() {
                "/".into()
            } else {
                stripped.into()
            };
        }
    }
    check_size(&run.spec)?;
    Ok(run)
}

/// Refuses, before anything is sent, a run too large for the daemon to
/// take: in practice a huge environment.
pub(super) fn check_size(spec: &RunSpec) -> Result<()> {
    let (items, bytes) = spec.size();
    if items <= MAX_RUN_ITEMS && bytes <= MAX_RUN_BYTES {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "the run is too large to send: {} environment variables and {} arguments, \
         {bytes} bytes (at most {MAX_RUN_ITEMS} of them and {MAX_RUN_BYTES} bytes); \
         start from --clean-env with --env or --env-file, or unset some variables",
        spec.env.len(),
        spec.command.len()
    )))
}

fn restart_policy(s: &str) -> RestartPolicy {
    // The possible-values parser admits nothing else.
    RestartPolicy::from_name(s).unwrap_or(RestartPolicy::OnFailure)
}

/// Clap value parser for `--id KEY`: the rule is the error.
fn run_id(s: &str) -> std::result::Result<String, String> {
    tether_protocol::validate_run_id(s).map(|()| s.to_owned())
}

/// Clap value parser for `--label K=V`.
fn label_pair(s: &str) -> std::result::Result<(String, String), String> {
    tether::sdk::run::label_pair(s)
}

/// Clap value parser for `--stop-signal SIG`: the bare name (`TERM`).
fn stop_signal(s: &str) -> std::result::Result<String, String> {
    tether::sdk::run::stop_signal(s)
}

/// Clap value parser for `--env K=V`.
fn env_pair(s: &str) -> std::result::Result<(String, String), String> {
    let Some((key, value)) = s.split_once('=') else {
        return Err(format!("expected NAME=VALUE, got {s:?} (no '=')"));
    };
    if key.is_empty() {
        return Err(format!("expected NAME=VALUE, got {s:?} (empty name)"));
    }
    if key.contains('\0') || value.contains('\0') {
        return Err("environment variables cannot contain NUL bytes".into());
    }
    Ok((key.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(argv: &[&str]) -> std::result::Result<RunArgs, clap::Error> {
        let mut full = vec!["run"];
        full.extend_from_slice(argv);
        Wrapper::try_parse_from(full).map(|w| w.run)
    }

    /// The run asked of a remote daemon: nothing local is sent.
    fn remote(argv: &[&str]) -> RunSpecFull {
        run_of(parse(argv).unwrap(), None, &|| Ok(PathBuf::from("/home/u"))).unwrap()
    }

    /// The run asked of a local daemon by a caller with `env`.
    fn local(argv: &[&str], env: &[(&str, &str)]) -> RunSpecFull {
        let env = env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect();
        run_of(parse(argv).unwrap(), Some(env), &|| {
            Ok(PathBuf::from("/home/u"))
        })
        .unwrap()
    }

    fn spec(argv: &[&str]) -> RunSpec {
        remote(argv).spec
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_on_failure_with_no_limits() {
        let run = remote(&["--", "sleep", "10"]);
        assert_eq!(
            run,
            RunSpecFull {
                spec: RunSpec {
                    name: None,
                    command: vec!["sleep".into(), "10".into()],
                    cwd: None,
                    env: vec![],
                    restart: RestartPolicy::OnFailure,
                    max_restarts: None,
                    deadline_ms: None,
                },
                ..RunSpecFull::from(RunSpec {
                    name: None,
                    command: vec![],
                    cwd: None,
                    env: vec![],
                    restart: RestartPolicy::OnFailure,
                    max_restarts: None,
                    deadline_ms: None,
                })
            }
        );
    }

    #[test]
    fn ids_labels_parents_and_signals_reach_the_run() {
        let run = remote(&[
            "--id",
            "job-1",
            "--label",
            "team=a",
            "--label",
            "k=x=y",
            "--parent",
            "p-1",
            "--max-failures-without-progress",
            "3",
            "--stop-signal",
            "sigint",
            "true",
        ]);
        assert_eq!(run.id.as_deref(), Some("job-1"));
        assert_eq!(run.labels, pairs(&[("team", "a"), ("k", "x=y")]));
        assert_eq!(run.parent.as_deref(), Some("p-1"));
        assert_eq!(run.max_failures_without_progress, Some(3));
        assert_eq!(run.stop_signal.as_deref(), Some("INT"));
    }

    #[test]
    fn a_bad_id_is_a_usage_error_naming_the_rule() {
        for id in ["a b", "a/b", &"x".repeat(129)] {
            let err = parse(&["--id", id, "true"]).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains("1 to 128 characters"), "{err}");
        }
        let err = parse(&["--stop-signal", "SEGV", "true"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err = parse(&["--label", "novalue", "true"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn a_local_run_sends_the_callers_directory_and_environment() {
        let caller = [("PATH", "/opt/bin"), ("TETHER_SOCKET", "/s"), ("A", "0")];
        let run = local(&["--env", "A=1", "--", "agent"], &caller);
        assert!(run.whole_env && !run.pty);
        assert_eq!(run.spec.cwd.as_deref(), Some("/home/u"));
        assert_eq!(run.spec.env, pairs(&[("PATH", "/opt/bin"), ("A", "1")]));
        let run = local(&["--cwd", "sub", "--clean-env", "--pty", "agent"], &caller);
        assert!(run.whole_env && run.pty);
        assert_eq!(run.spec.cwd.as_deref(), Some("/home/u/sub"));
        assert!(run.spec.env.is_empty());
    }

    #[test]
    fn env_files_come_before_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.env");
        std::fs::write(&file, "# x\nA=file\nB=file\n").unwrap();
        let path = file.to_str().unwrap();
        let run = local(
            &["--env", "B=flag", "--env-file", path, "agent"],
            &[("A", "0")],
        );
        assert_eq!(run.spec.env, pairs(&[("A", "file"), ("B", "flag")]));
        let missing = parse(&["--env-file", "/nonexistent.env", "agent"]).unwrap();
        let err = run_of(missing, None, &|| Ok(PathBuf::from("/"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent.env"), "{err}");
    }

    #[test]
    fn a_huge_environment_is_refused_before_it_is_sent() {
        let big = "x".repeat(300);
        let caller: Vec<(String, String)> =
            (0..5000).map(|i| (format!("V{i}"), big.clone())).collect();
        let env: Vec<(OsString, OsString)> = caller
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect();
        let err = run_of(parse(&["agent"]).unwrap(), Some(env.clone()), &|| {
            Ok(PathBuf::from("/"))
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains("5000 environment variables"),
            "{err}"
        );
        assert!(err.to_string().contains("--clean-env"), "{err}");
        let clean = parse(&["--clean-env", "agent"]).unwrap();
        run_of(clean, Some(env), &|| Ok(PathBuf::from("/"))).unwrap();
    }

    #[test]
    fn every_flag_reaches_the_spec() {
        let spec = spec(&[
            "--name",
            "agent",
            "--restart",
            "always",
            "--max-restarts",
            "3",
            "--deadline",
            "1m30s",
            "--cwd",
            "work/dir",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--env",
            "EMPTY=",
            "--",
            "python3",
            "-u",
            "agent.py",
        ]);
        assert_eq!(spec.name.as_deref(), Some("agent"));
        assert_eq!(spec.restart, RestartPolicy::Always);
        assert_eq!(spec.max_restarts, Some(3));
        assert_eq!(spec.deadline_ms, Some(90_000));
        assert_eq!(spec.cwd.as_deref(), Some("/home/u/work/dir"));
        assert_eq!(spec.env, pairs(&[("A", "1"), ("B", "x=y"), ("EMPTY", "")]));
        assert_eq!(spec.command, vec!["python3", "-u", "agent.py"]);
    }

    #[test]
    fn the_command_may_come_without_dashes_and_keeps_its_own_flags() {
        let spec = spec(&["--restart", "never", "sh", "-c", "echo --attach"]);
        assert_eq!(spec.restart, RestartPolicy::Never);
        assert_eq!(spec.command, vec!["sh", "-c", "echo --attach"]);
        let args = parse(&["--attach", "--", "ls", "--all"]).unwrap();
        assert!(args.attach);
        assert_eq!(args.command, vec!["ls", "--all"]);
    }

    #[test]
    fn an_absolute_cwd_is_kept() {
        assert_eq!(
            spec(&["--cwd", "/srv", "true"]).cwd.as_deref(),
            Some("/srv")
        );
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for argv in [
            &[][..],
            &["--"],
            &["--env", "NOEQUALS", "--", "true"],
            &["--env", "=v", "--", "true"],
            &["--restart", "sometimes", "--", "true"],
            &["--max-restarts", "-1", "--", "true"],
            &["--deadline", "soon", "--", "true"],
        ] {
            let err = parse(argv).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{argv:?}: {err}");
        }
        let err = run_of(parse(&["--", ""]).unwrap(), None, &|| {
            Ok(PathBuf::from("/"))
        })
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
