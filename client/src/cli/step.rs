//! `tether step run | get | put | list | clear`: durable steps from the
//! command line, for workers written in any language.
//!
//! * `run NAME -- CMD...`: prints NAME's recorded result without running
//!   CMD; otherwise runs CMD (stdin and stderr passed through), and if it
//!   exits 0 records its stdout as the result and prints the result that
//!   stands (the first recorded, should another run have recorded one
//!   meanwhile). A failing CMD records nothing; `step run` exits with its
//!   code (128+N for signal N), and 125 when tether itself fails.
//! * `get NAME`: prints the recorded result; exit 3 when there is none.
//! * `put NAME`: records stdin as the result unless one is recorded, and
//!   prints the result that stands.
//! * `list [ID]`: NAME, SIZE, RECORDED (RFC 3339, `-` when the store kept
//!   no time); `--json` prints `name`, `size`, `recorded` per step.
//! * `clear (NAME... | --all)`: forgets results, so `run` runs again.
//!
//! `--execution` defaults to `$TETHER_EXECUTION_ID`.

use std::process::Stdio;

use bytes::Bytes;
use clap::{Args, Subcommand};
use serde::Serialize;
use tether::error::{EXIT_NOT_FOUND, EXIT_OK};
use tether::time::Rfc3339;
use tether::worker::{step_clear_request, steps_cleared, ENV_EXECUTION};
use tether::{Error, Result};
use tether_protocol::{Request, Response, StepInfo};
use tokio::io::AsyncReadExt;

use super::checkpoint::execution;
use super::{read_stdin, table, write_stdout, Context};
use tether::conn::unexpected;

/// The exit code of `step run` when tether itself fails (as `docker run`
/// and `env` use it), kept apart from the codes of CMD.
pub const EXIT_TETHER_FAILED: u8 = 125;

/// Arguments of `tether step`.
#[derive(Debug, Args)]
pub struct StepArgs {
    #[command(subcommand)]
    command: StepCommand,
}

#[derive(Debug, Subcommand)]
enum StepCommand {
    /// Print the step's recorded result, or run CMD and record its stdout.
    Run(RunArgs),
    /// Print the step's recorded result (exit 3 when there is none).
    Get(NameArgs),
    /// Record stdin as the step's result unless one is recorded; print the
    /// result that stands.
    Put(NameArgs),
    /// List the steps recorded for an execution.
    List(ListArgs),
    /// Forget recorded results, so that the next `step run` runs again.
    Clear(ClearArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The step's name.
    name: String,

    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,

    /// The command and its arguments, after `--`.
    #[arg(value_name = "CMD", required = true, num_args = 1.., last = true)]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct NameArgs {
    /// The step's name.
    name: String,

    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(value_name = "ID")]
    id: Option<String>,
}

#[derive(Debug, Args)]
struct ClearArgs {
    /// The steps to forget.
    #[arg(
        value_name = "NAME",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    names: Vec<String>,

    /// Forget every step of the execution.
    #[arg(long)]
    all: bool,

    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,
}

/// Runs `tether step ...`; returns the exit code.
pub async fn run(ctx: &Context, args: StepArgs) -> Result<u8> {
    let env = std::env::var(ENV_EXECUTION).ok();
    match args.command {
        StepCommand::Run(args) => {
            // Every failure of tether's own is 125, so that a script can
            // tell it from CMD's codes.
            match run_step(ctx, args, env).await {
                Ok(code) => Ok(code),
                Err(e) => {
                    eprintln!("tether: {e}");
                    Ok(EXIT_TETHER_FAILED)
                }
            }
        }
        StepCommand::Get(args) => {
            let execution = execution(args.execution, env)?;
            match get(ctx, &execution, &args.name).await? {
                Some(result) => {
                    write_stdout(&result)?;
                    Ok(EXIT_OK)
                }
                None => {
                    eprintln!("no result for step {:?} of {execution}", args.name);
                    Ok(EXIT_NOT_FOUND)
                }
            }
        }
        StepCommand::Put(args) => {
            let execution = execution(args.execution, env)?;
            let kept = put(
                ctx,
                &execution,
                &args.name,
                read_stdin("the step's result")?,
            )
            .await?;
            write_stdout(&kept)?;
            Ok(EXIT_OK)
        }
        StepCommand::List(args) => {
            let execution = execution(args.id, env)?;
            list(ctx, &execution).await.map(|()| EXIT_OK)
        }
        StepCommand::Clear(args) => {
            let execution = execution(args.execution, env)?;
            let request = step_clear_request(&execution, args.names, args.all);
            steps_cleared(ctx.connector("step clear").request(&request).await?)?;
            Ok(EXIT_OK)
        }
    }
}

async fn run_step(ctx: &Context, args: RunArgs, env: Option<String>) -> Result<u8> {
    let execution = execution(args.execution, env)?;
    if let Some(result) = get(ctx, &execution, &args.name).await? {
        write_stdout(&result)?;
        return Ok(EXIT_OK);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return Err(Error::Usage("no command given after --".into()));
    };
    let cannot_run = |source| Error::Local {
        context: format!("cannot run {program:?}"),
        source,
    };
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .stdin(Stdio::inherit())
        .stderr(Stdio::inherit())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(cannot_run)?;
    let mut stdout = Vec::new();
    if let Some(mut pipe) = child.stdout.take() {
        pipe.read_to_end(&mut stdout).await.map_err(cannot_run)?;
    }
    let status = child.wait().await.map_err(cannot_run)?;
    if !status.success() {
        return Ok(exit_code(status));
    }
    let kept = put(ctx, &execution, &args.name, Bytes::from(stdout)).await?;
    write_stdout(&kept)?;
    Ok(EXIT_OK)
}

/// CMD's exit code, or 128+N for signal N, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(EXIT_TETHER_FAILED),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(EXIT_TETHER_FAILED),
        (None, None) => EXIT_TETHER_FAILED,
    }
}

async fn get(ctx: &Context, execution: &str, step: &str) -> Result<Option<Bytes>> {
    let request = Request::StepGet {
        execution: execution.to_owned(),
        step: step.to_owned(),
    };
    match ctx.connector("step get").request(&request).await? {
        Response::StepResult(result) => Ok(result),
        other => Err(unexpected("StepResult", &other)),
    }
}

/// Records `result` unless a result is recorded; the one that stands.
/// Sent again on a new session if the answer is lost: the first result
/// recorded wins either way.
async fn put(ctx: &Context, execution: &str, step: &str, result: Bytes) -> Result<Bytes> {
    let request = Request::StepPut {
        execution: execution.to_owned(),
        step: step.to_owned(),
        result,
    };
    match ctx.connector("step put").request(&request).await? {
        Response::StepRecorded(kept) => Ok(kept),
        other => Err(unexpected("StepRecorded", &other)),
    }
}

async fn list(ctx: &Context, execution: &str) -> Result<()> {
    let request = Request::StepList {
        execution: execution.to_owned(),
    };
    let steps = match ctx.connector("step list").request(&request).await? {
        Response::Steps(steps) => steps,
        other => return Err(unexpected("Steps", &other)),
    };
    let text = if ctx.json {
        steps.iter().map(json_line).collect::<Result<String>>()?
    } else {
        render(&steps)
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

/// When a step was recorded; `None` for a store that kept no time.
fn recorded(step: &StepInfo) -> Option<String> {
    (step.recorded_micros != 0).then(|| Rfc3339(step.recorded_micros).to_string())
}

/// The table, header first.
fn render(steps: &[StepInfo]) -> String {
    let mut rows = vec![["NAME", "SIZE", "RECORDED"].map(String::from).to_vec()];
    for step in steps {
        rows.push(vec![
            step.name.clone(),
            step.size.to_string(),
            recorded(step).unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    table::render(&rows)
}

#[derive(Serialize)]
struct JsonStep<'a> {
    name: &'a str,
    size: u64,
    recorded: Option<String>,
}

fn json_line(step: &StepInfo) -> Result<String> {
    let view = JsonStep {
        name: &step.name,
        size: step.size,
        recorded: recorded(step),
    };
    let mut line = serde_json::to_string(&view)
        .map_err(|e| Error::Protocol(format!("cannot render a step: {e}")))?;
    line.push('\n');
    Ok(line)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_table_shows_a_missing_time_as_a_dash() {
        let steps = [
            StepInfo {
                name: "fetch".into(),
                size: 12,
                recorded_micros: 1_700_000_000_000_000,
            },
            StepInfo {
                name: "old".into(),
                size: 0,
                recorded_micros: 0,
            },
        ];
        assert_eq!(
            render(&steps),
            "NAME   SIZE  RECORDED\n\
             fetch  12    2023-11-14T22:13:20.000000Z\n\
             old    0     -\n"
        );
        assert_eq!(
            json_line(&steps[1]).unwrap(),
            "{\"name\":\"old\",\"size\":0,\"recorded\":null}\n"
        );
    }

    #[test]
    fn signals_exit_as_a_shell_reports_them() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(9)), 137);
    }
}
