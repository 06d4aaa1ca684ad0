//! `tether checkpoint save | load | list`: checkpoints from the command
//! line, for workers written in any language.
//!
//! * `save [--execution ID] [--schema-version V] [--meta K=V]... [--force]`
//!   stores stdin as the execution's newest checkpoint, with the metadata,
//!   and exits 0 only once it is durable. It prints nothing (a worker's
//!   stdout becomes frames of its stream), or the stored checkpoint as a
//!   JSON object with `--json`. Saving to an execution that has ended
//!   exits 1 unless `--force`.
//! * `load [--execution ID] [--schema-version V]` writes the newest valid
//!   checkpoint's bytes (of exactly that version, if given), as saved, to
//!   stdout; `--json` prints one object with `id`, `seq`,
//!   `schema_version`, `ts`, `meta` and `payload` (or `payload_b64`). When
//!   there is none: exit 3 and the one line `no checkpoint for ID`.
//! * `list ID` shows the checkpoints kept for the execution, newest first:
//!   ID, SEQ, SCHEMA, SIZE, CREATED (RFC 3339), VALID and META (`k=v`
//!   pairs, comma separated; `-` for none). `--json` prints one object per checkpoint
//!   with `id`, `seq`, `schema_version`, `size`, `created`, `valid` and
//!   `meta`.
//!
//! `--execution` defaults to `$TETHER_EXECUTION_ID`, which tether sets for
//! every worker; with neither, `save` and `load` are usage errors (exit 2).

use clap::{Args, Subcommand};
use serde::Serialize;
use tether::conn::{Connector, Link};
use tether::error::{EXIT_NOT_FOUND, EXIT_OK};
use tether::time::Rfc3339;
use tether::worker::{
    load_full_request, loaded_full, refused_as_too_large, save_full_requests_in_parts, saved,
    ENV_EXECUTION,
};
use tether::{Error, Result};
use tether_protocol::{
    CheckpointEntry, CheckpointFull, CheckpointMeta, CheckpointSaveFull, ErrorCode, Request,
    Response, UserMeta,
};

use super::output::base64;
use super::{read_stdin, table, write_stdout, Context};
use tether::conn::unexpected;

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

    /// Metadata kept with the checkpoint (repeatable).
    #[arg(long = "meta", value_name = "K=V", value_parser = meta_pair)]
    meta: Vec<(String, String)>,

    /// Save even when the execution has ended (to mend state before a
    /// resume).
    #[arg(long)]
    force: bool,
}

/// Arguments of `tether checkpoint load`.
#[derive(Debug, Args)]
struct LoadArgs {
    /// The execution [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,

    /// Load the newest checkpoint of exactly this schema version.
    #[arg(long, value_name = "V")]
    schema_version: Option<u32>,
}

/// Arguments of `tether checkpoint list`.
#[derive(Debug, Args)]
struct ListArgs {
    /// The execution.
    #[arg(value_name = "ID")]
    id: String,
}

/// Runs `tether checkpoint ...`; returns the exit code.
pub async fn run(ctx: &Context, args: CheckpointArgs) -> Result<u8> {
    let env = std::env::var(ENV_EXECUTION).ok();
    match args.command {
        CheckpointCommand::Save(args) => {
            let save = CheckpointSaveFull {
                execution: execution(args.execution, env)?,
                schema_version: args.schema_version,
                data: read_stdin("the checkpoint")?,
                user_meta: args.meta,
                force: args.force,
            };
            save_full(ctx, save).await.map(|()| EXIT_OK)
        }
        CheckpointCommand::Load(args) => {
            let execution = execution(args.execution, env)?;
            load(ctx, &execution, args.schema_version).await
        }
        CheckpointCommand::List(args) => list(ctx, &args.id).await.map(|()| EXIT_OK),
    }
}

/// Parses `K=V` (the value may hold `=`; the key may not be empty).
fn meta_pair(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

/// The execution named by the flag, else by the environment.
pub(super) fn execution(flag: Option<String>, env: Option<String>) -> Result<String> {
    flag.or(env.filter(|v| !v.is_empty())).ok_or_else(|| {
        Error::Usage(format!(
            "no execution given: pass --execution ID, or set {ENV_EXECUTION} \
             (tether sets it for the workers it runs)"
        ))
    })
}

async fn save_full(ctx: &Context, save: CheckpointSaveFull) -> Result<()> {
    // A save is retried on a new session if the answer is lost; at worst
    // the same data is then stored as two checkpoints.
    let connector = ctx.connector("checkpoint save");
    let request = Request::CheckpointSaveFull(save.clone());
    let response = match connector.request(&request).await {
        Err(e) if refused_as_too_large(&e) => {
            let (leading, last) = save_full_requests_in_parts(save);
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

/// Writes the checkpoint, or says in one line that there is none (exit 3):
/// a worker asking at its start is expected to find none the first time.
async fn load(ctx: &Context, execution: &str, schema_version: Option<u32>) -> Result<u8> {
    let request = load_full_request(execution, schema_version);
    let checkpoint = match ctx.connector("checkpoint load").request(&request).await {
        Ok(response) => loaded_full(response)?,
        Err(e) if e.daemon_code() == Some(ErrorCode::NOT_FOUND) => {
            eprintln!("no checkpoint for {execution}");
            return Ok(EXIT_NOT_FOUND);
        }
        Err(e) => return Err(e),
    };
    if ctx.json {
        write_stdout(load_json_line(&checkpoint)?.as_bytes())?;
    } else {
        write_stdout(&checkpoint.data)?;
    }
    Ok(EXIT_OK)
}

async fn list(ctx: &Context, execution: &str) -> Result<()> {
    let request = Request::CheckpointListFull {
        execution: execution.to_owned(),
    };
    let list = match ctx.connector("checkpoint list").request(&request).await? {
        Response::CheckpointsFull(list) => list,
        other => return Err(unexpected("CheckpointsFull", &other)),
    };
    let text = if ctx.json {
        list.iter()
            .map(list_json_line)
            .collect::<Result<String>>()?
    } else {
        render(&list)
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

/// The table, header first.
fn render(list: &[CheckpointEntry]) -> String {
    let header = ["ID", "SEQ", "SCHEMA", "SIZE", "CREATED", "VALID", "META"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for CheckpointEntry { meta, user_meta } in list {
        rows.push(vec![
            meta.id.to_string(),
            meta.seq.to_string(),
            meta.schema_version.to_string(),
            meta.size.to_string(),
            Rfc3339(meta.created_micros).to_string(),
            if meta.valid { "yes" } else { "NO" }.to_owned(),
            if user_meta.is_empty() {
                "-".to_owned()
            } else {
                user_meta
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
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

/// User metadata as a JSON object, keys in the order given (a key given
/// twice keeps its last value).
fn meta_object(user_meta: &UserMeta) -> serde_json::Map<String, serde_json::Value> {
    user_meta
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect()
}

/// A listed checkpoint as a JSON line: [`json_line`]'s fields and `meta`.
fn list_json_line(entry: &CheckpointEntry) -> Result<String> {
    let mut value = serde_json::to_value(view(&entry.meta)).map_err(render_error)?;
    if let Some(object) = value.as_object_mut() {
        object.insert("meta".into(), meta_object(&entry.user_meta).into());
    }
    line_of(&value)
}

/// `load --json`: the checkpoint, its metadata and its payload.
fn load_json_line(checkpoint: &CheckpointFull) -> Result<String> {
    let meta = &checkpoint.meta;
    let mut object = serde_json::Map::new();
    object.insert("id".into(), meta.id.into());
    object.insert("seq".into(), meta.seq.into());
    object.insert("schema_version".into(), meta.schema_version.into());
    object.insert("ts".into(), Rfc3339(meta.created_micros).to_string().into());
    object.insert("meta".into(), meta_object(&checkpoint.user_meta).into());
    match std::str::from_utf8(&checkpoint.data) {
        Ok(text) => object.insert("payload".into(), text.into()),
        Err(_) => object.insert("payload_b64".into(), base64(&checkpoint.data).into()),
    };
    line_of(&serde_json::Value::Object(object))
}

fn render_error(e: serde_json::Error) -> Error {
    Error::Protocol(format!("cannot render a checkpoint: {e}"))
}

fn line_of(value: &serde_json::Value) -> Result<String> {
    let mut line = serde_json::to_string(value).map_err(render_error)?;
    line.push('\n');
    Ok(line)
}

fn view(meta: &CheckpointMeta) -> JsonCheckpoint {
    JsonCheckpoint {
        id: meta.id,
        seq: meta.seq,
        schema_version: meta.schema_version,
        size: meta.size,
        created: Rfc3339(meta.created_micros).to_string(),
        valid: meta.valid,
    }
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
            render(&[
                CheckpointEntry {
                    meta: meta(2, true),
                    user_meta: vec![("a".into(), "1".into()), ("b".into(), "x=y".into())],
                },
                CheckpointEntry {
                    meta: meta(1, false),
                    user_meta: vec![],
                },
            ]),
            "ID  SEQ  SCHEMA  SIZE  CREATED                      VALID  META\n\
             2   20   2       1024  2023-11-14T22:13:20.000000Z  yes    a=1,b=x=y\n\
             1   10   2       1024  2023-11-14T22:13:20.000000Z  NO     -\n"
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
