//! `tether run [--name N] [--restart POLICY] [--max-restarts K]
//! [--deadline DUR] [--cwd DIR] [--env K=V]... [--attach] -- CMD [ARG]...`:
//! start a supervised worker and print its execution id (also the name of
//! its output stream), or `{"id":"..."}` with `--json`.
//!
//! `--cwd` is made absolute here, against the client's working directory,
//! because the daemon's is unrelated. Without it the worker runs in the
//! daemon's. `--env` adds variables to the worker's environment; the first
//! `=` separates name and value. With `--attach` the command then follows
//! the execution until it ends (see [`super::attach`]) and exits with its
//! worker's exit code.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use tether::error::EXIT_OK;
use tether::sdk::RunOptions;
use tether::{Error, Result};
use tether_protocol::{Request, Response, RestartPolicy, RunSpec};

use super::{attach, duration, write_stdout, Context};

/// Arguments of `tether run`.
#[derive(Debug, Args)]
pub struct RunArgs {
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

    /// The worker's working directory [default: the daemon's].
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Add a variable to the worker's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = env_pair)]
    env: Vec<(String, String)>,

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
    let spec = spec_of(args, &std::env::current_dir)?;
    let id = submit(ctx, spec).await?;
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

/// Sends `Run` once, on one session: it is not idempotent, so a session
/// lost after sending is reported rather than retried.
async fn submit(ctx: &Context, spec: RunSpec) -> Result<String> {
    let mut conn = ctx.connector("run").connect().await?;
    match conn.request(&Request::Run(spec)).await {
        Ok(Response::Started { execution }) => Ok(execution),
        Ok(other) => Err(Error::Protocol(format!(
            "the daemon answered Run with {}",
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

/// The request for `args`, with `--cwd` made absolute against `cwd`.
fn spec_of(args: RunArgs, cwd: &dyn Fn() -> std::io::Result<PathBuf>) -> Result<RunSpec> {
    RunOptions {
        command: args.command,
        name: args.name,
        restart: args.restart,
        max_restarts: args.max_restarts,
        deadline: args.deadline,
        cwd: args.cwd,
        env: args.env,
    }
    .into_spec_in(cwd)
}

fn restart_policy(s: &str) -> RestartPolicy {
    // The possible-values parser admits nothing else.
    RestartPolicy::from_name(s).unwrap_or(RestartPolicy::OnFailure)
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

    fn spec(argv: &[&str]) -> RunSpec {
        spec_of(parse(argv).unwrap(), &|| Ok(PathBuf::from("/home/u"))).unwrap()
    }

    #[test]
    fn defaults_are_on_failure_with_no_limits() {
        let spec = spec(&["--", "sleep", "10"]);
        assert_eq!(
            spec,
            RunSpec {
                name: None,
                command: vec!["sleep".into(), "10".into()],
                cwd: None,
                env: vec![],
                restart: RestartPolicy::OnFailure,
                max_restarts: None,
                deadline_ms: None,
            }
        );
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
        assert_eq!(
            spec.env,
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "x=y".into()),
                ("EMPTY".into(), String::new())
            ]
        );
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
        let err = spec_of(parse(&["--", ""]).unwrap(), &|| Ok(PathBuf::from("/"))).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
