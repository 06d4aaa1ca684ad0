//! `tether checkpoint save | load | list`: checkpoints from the command
//! line, for workers written in any language.
//!
//! * `save [--execution ID] [--schema-version V]` stores stdin as the
//!   execution's newest checkpoint and exits 0 only once it is durable. It
//!   prints nothing (a worker's stdout becomes frames of its stream), or the
//!   stored checkpoint as a JSON object with `--json`.
//! * `load [--execution ID]` writes the newest valid checkpoint's bytes,
//!   exactly as saved, to stdout; exit 3 when there is none.
//! * `list ID` shows the checkpoints kept for the execution, newest first:
//!   ID, SEQ, SCHEMA, SIZE, CREATED (RFC 3339) and VALID. `--json` prints
//!   one object per checkpoint with `id`, `seq`, `schema_version`, `size`,
//!   `created` and `valid`.
//!
//! `--execution` defaults to `$TETHER_EXECUTION_ID`, which tether sets for
//! every worker; with neither, `save` and `load` are usage errors (exit 2).

use std::io::Read;

use bytes::Bytes;
use clap::{Args, Subcommand};
use serde::Serialize;
use tether::conn::{Connector, Link};
use tether::time::Rfc3339;
use tether::worker::{
    listed, load_request, loaded, refused_as_too_large, save_request, save_requests_in_parts,
    saved, ENV_EXECUTION,
};
use tether::{Error, Result};
use tether_protocol::{CheckpointMeta, Request, Response};

use super::{table, write_stdout, Context};

/// Arguments of `tether checkpoint`.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    command: CheckpointCommand,
}

#[derive(Debug, Subcommand)]
enum CheckpointCommand {
    /// Store stdin as the execution's newest checkpoint.
    Save(SaveArgs),
    /// Write the newest valid checkpoint to stdout (exit 3 when none).
    Load(LoadArgs),
    /// List the checkpoints kept for an execution, newest first.
    List(ListArgs),
}

/// Arguments of `tether checkpoint save`.
#[derive(Debug, Args)]
struct SaveArgs {
    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,

    /// The format version of the data, the worker's own; stored with it.
    #[arg(long, value_name = "V", default_value_t = 1)]
    schema_version: u32,
}

/// Arguments of `tether checkpoint load`.
#[derive(Debug, Args)]
struct LoadArgs {
    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,
}

/// Arguments of `tether checkpoint list`.
#[derive(Debug, Args)]
struct ListArgs {
    /// The execution.
    #[arg(value_name = "ID")]
    id: String,
}

/// Runs `tether checkpoint ...`.
pub async fn run(ctx: &Context, args: CheckpointArgs) -> Result<()> {
    let env = std::env::var(ENV_EXECUTION).ok();
    match args.command {
        CheckpointCommand::Save(args) => {
            let execution = execution(args.execution, env)?;
            save(ctx, &execution, args.schema_version).await
        }
        CheckpointCommand::Load(args) => {
            let execution = execution(args.execution, env)?;
            load(ctx, &execution).await
        }
        CheckpointCommand::List(args) => list(ctx, &args.id).await,
    }
}

/// The execution named by the flag, else by the environment.
fn execution(flag: Option<String>, env: Option<String>) -> Result<String> {
    flag.or(env.filter(|v| !v.is_empty())).ok_or_else(|| {
        Error::Usage(format!(
            "no execution given: pass --execution ID, or set {ENV_EXECUTION} \
             (tether sets it for the workers it runs)"
        ))
    })
}

async fn save(ctx: &Context, execution: &str, schema_version: u32) -> Result<()> {
    let data = read_stdin()?;
    // A save is retried on a new session if the answer is lost; at worst
    // the same data is then stored as two checkpoints.
    let connector = ctx.connector("checkpoint save");
    let request = save_request(execution, schema_version, data.clone());
    let response = match connector.request(&request).await {
        Err(e) if refused_as_too_large(&e) => {
            let (leading, last) = save_requests_in_parts(execution, schema_version, data);
            save_in_parts(&connector, &leading, &last).await?
        }
        answer => answer?,
    };
    let meta = saved(response)?;
    if ctx.json {
        write_stdout(json_line(&meta)?.as_bytes())?;
    }
    Ok(())
}

/// Sends a save in pieces on one session, again on a new one if the
/// session is lost before the answer.
async fn save_in_parts(
    connector: &Connector,
    leading: &[Request],
    last: &Request,
) -> Result<Response> {
    let mut link = Link::new(connector.clone());
    loop {
        link.establish().await?;
        let Some(conn) = link.connection() else {
            continue;
        };
        match conn.request_after(leading, last).await {
            Ok(response) => return Ok(response),
            Err(e) => link.lose(e)?,
        }
    }
}

async fn load(ctx: &Context, execution: &str) -> Result<()> {
    let response = ctx
        .connector("checkpoint load")
        .request(&load_request(execution))
        .await?;
    let checkpoint = loaded(response)?;
    write_stdout(&checkpoint.data)?;
    Ok(())
}

async fn list(ctx: &Context, execution: &str) -> Result<()> {
    let request = Request::CheckpointList {
        execution: execution.to_owned(),
    };
    let list = listed(ctx.connector("checkpoint list").request(&request).await?)?;
    let text = if ctx.json {
        let mut text = String::new();
        for meta in &list {
            text.push_str(&json_line(meta)?);
        }
        text
    } else {
        render(&list)
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

/// All of stdin. The daemon enforces the checkpoint size limit and names
/// both sizes when it refuses, so no limit is applied here beyond the
/// frame size the request must fit in.
fn read_stdin() -> Result<Bytes> {
    let mut data = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut data)
        .map_err(|source| Error::Local {
            context: "cannot read the checkpoint from stdin".into(),
            source,
        })?;
    Ok(Bytes::from(data))
}

/// The table, header first.
fn render(list: &[CheckpointMeta]) -> String {
    let header = ["ID", "SEQ", "SCHEMA", "SIZE", "CREATED", "VALID"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for meta in list {
        rows.push(vec![
            meta.id.to_string(),
            meta.seq.to_string(),
            meta.schema_version.to_string(),
            meta.size.to_string(),
            Rfc3339(meta.created_micros).to_string(),
            if meta.valid { "yes" } else { "NO" }.to_owned(),
        ]);
    }
    table::render(&rows)
}

#[derive(Serialize)]
struct JsonCheckpoint {
    id: u64,
    seq: u64,
    schema_version: u32,
    size: u64,
    created: String,
    valid: bool,
}

/// One checkpoint's metadata as a JSON line (with its newline).
fn json_line(meta: &CheckpointMeta) -> Result<String> {
    let view = JsonCheckpoint {
        id: meta.id,
        seq: meta.seq,
        schema_version: meta.schema_version,
        size: meta.size,
        created: Rfc3339(meta.created_micros).to_string(),
        valid: meta.valid,
    };
    let mut line = serde_json::to_string(&view)
        .map_err(|e| Error::Protocol(format!("cannot render a checkpoint: {e}")))?;
    line.push('\n');
    Ok(line)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn meta(id: u64, valid: bool) -> CheckpointMeta {
        CheckpointMeta {
            id,
            seq: id * 10,
            schema_version: 2,
            size: 1024,
            created_micros: 1_700_000_000_000_000,
            valid,
        }
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_neither_is_a_usage_error() {
        let flag = Some("a".to_owned());
        let env = Some("b".to_owned());
        assert_eq!(execution(flag, env.clone()).unwrap(), "a");
        assert_eq!(execution(None, env).unwrap(), "b");
        let err = execution(None, Some(String::new())).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--execution"), "{err}");
    }

    #[test]
    fn the_table_shows_every_column_and_flags_invalid_checkpoints() {
        assert_eq!(
            render(&[meta(2, true), meta(1, false)]),
            "ID  SEQ  SCHEMA  SIZE  CREATED                      VALID\n\
             2   20   2       1024  2023-11-14T22:13:20.000000Z  yes\n\
             1   10   2       1024  2023-11-14T22:13:20.000000Z  NO\n"
        );
    }

    #[test]
    fn json_has_the_documented_fields() {
        let value: serde_json::Value =
            serde_json::from_str(&json_line(&meta(3, false)).unwrap()).unwrap();
        assert_eq!(value["id"], 3);
        assert_eq!(value["seq"], 30);
        assert_eq!(value["schema_version"], 2);
        assert_eq!(value["size"], 1024);
        assert_eq!(value["created"], "2023-11-14T22:13:20.000000Z");
        assert_eq!(value["valid"], false);
    }
}
