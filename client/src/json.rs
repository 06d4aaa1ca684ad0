//! JSON views of what the daemon answers, one shape for every reader:
//! `tether ... --json` prints them and the Python and Node SDKs return them.
//! Times are RFC 3339 text and enums their lowercase names, so the views
//! read the same in every language.

use serde::Serialize;
use serde_json::json;
use serde_json::Value;
use tether_protocol::{
    Answerer, ExecutionDetail, ExecutionInfo, ExitStatus, QuestionInfo, StatusInfo, StorageState,
    StreamInfo,
};

use crate::error::{Error, Result};
use crate::time::Rfc3339;

/// An execution as `tether ps --json` prints it: the fields `id`, `name`,
/// `state`, `pid`, `attempt`, `restarts`, `command`, `restart`,
/// `last_exit` (`{"code":N}`, `{"signal":N}`, `{"spawn_failed":"why"}` or
/// null), `reason`, `created` (RFC 3339), `stream_last_seq` and
/// `last_checkpoint` (`{"seq","created"}` or null).
pub fn execution(e: &ExecutionInfo) -> Result<Value> {
    let view = JsonExecution {
        id: &e.id,
        name: e.name.as_deref(),
        state: e.state.as_str(),
        pid: e.pid,
        attempt: e.attempt,
        restarts: e.restarts,
        command: &e.command,
        restart: e.restart.as_str(),
        last_exit: e.last_exit.as_ref().map(|status| match status {
            ExitStatus::Code(code) => JsonExit::Code(*code),
            ExitStatus::Signal(signal) => JsonExit::Signal(*signal),
            ExitStatus::SpawnFailed(reason) => JsonExit::SpawnFailed(reason),
        }),
        reason: e.reason.as_deref(),
        created: Rfc3339(e.created_micros).to_string(),
        stream_last_seq: e.stream_last_seq,
        last_checkpoint: e.last_checkpoint.map(|c| JsonCheckpoint {
            seq: c.seq,
            created: Rfc3339(c.created_micros).to_string(),
        }),
    };
    render(&view, "an execution")
}

/// An execution with its details, as `tether ps --json` prints it: the
/// fields of [`execution`], then `env_keys` (names only, never values),
/// `cwd` (null: the daemon's), `cpu_percent` (over the running worker's
/// life, one decimal), `rss_bytes` (null when no worker runs), `labels`
/// (an object of `run --label` pairs), `parent` (an id or null) and
/// `children` (the ids of the executions it is the parent of).
pub fn execution_detail(d: &ExecutionDetail) -> Result<Value> {
    let mut object = execution(&d.info)?;
    if let Some(map) = object.as_object_mut() {
        map.insert("env_keys".into(), d.env_keys.clone().into());
        map.insert("cwd".into(), d.cwd.clone().into());
        let cpu = d.cpu_per_mille.map(|per_mille| f64::from(per_mille) / 10.0);
        map.insert("cpu_percent".into(), cpu.into());
        map.insert("rss_bytes".into(), d.rss_bytes.into());
        let labels: serde_json::Map<String, Value> = d
            .labels
            .iter()
            .map(|(key, value)| (key.clone(), Value::from(value.clone())))
            .collect();
        map.insert("labels".into(), labels.into());
        map.insert("parent".into(), d.parent.clone().into());
        map.insert("children".into(), d.children.clone().into());
    }
    Ok(object)
}

/// The daemon's status as `tether status --json` prints it, with the
/// storage report as `storage` when the daemon gave one.
pub fn status(status: &StatusInfo, storage: Option<&StorageState>) -> Result<Value> {
    let mut object = render(status, "the status")?;
    if let (Some(map), Some(storage)) = (object.as_object_mut(), storage) {
        map.insert("storage".into(), render(storage, "the status")?);
    }
    Ok(object)
}

/// A stream as `tether streams --json` prints it: `name`, `first_seq`,
/// `last_seq`, `frames`, `bytes` and `consumers` (a list of
/// `{"name","acked_through"}`).
pub fn stream(info: &StreamInfo) -> Result<Value> {
    render(info, "stream info")
}

/// A question as `tether questions --json` prints it: `id`, `execution`,
/// `key`, `text`, `choices`, `default`, `asked_micros`, `deadline_micros`,
/// `attempt`, `seq`, `answer`, `answered_by` (`{"uid","user"}`,
/// `"timeout"`, or null while open), `answered_micros` and `state`
/// (`open`, `answered` or `timed out`).
pub fn question(q: &QuestionInfo) -> Value {
    let outcome = q.outcome.as_ref();
    let answered_by = outcome.map(|o| match &o.by {
        Answerer::User { uid, name } => json!({ "uid": uid, "user": name }),
        Answerer::Timeout => Value::from("timeout"),
    });
    json!({
        "id": q.id,
        "execution": q.execution,
        "key": q.key,
        "text": q.text,
        "choices": q.choices,
        "default": q.default,
        "asked_micros": q.asked_micros,
        "deadline_micros": q.deadline_micros,
        "attempt": q.attempt,
        "seq": q.seq,
        "answer": outcome.and_then(|o| o.answer.clone()),
        "answered_by": answered_by,
        "answered_micros": outcome.map(|o| o.answered_micros),
        "state": question_state(q),
    })
}

/// What `ps --json` shows as `question` for an execution waiting on `q`:
/// `{"id","text","choices","asked_micros"}`, or null.
pub fn waiting_question(q: Option<&QuestionInfo>) -> Value {
    q.map_or(Value::Null, |q| {
        json!({
            "id": q.id,
            "text": q.text,
            "choices": q.choices,
            "asked_micros": q.asked_micros,
        })
    })
}

/// `open`, `answered` or `timed out`: a question closed by its timeout
/// counts as timed out, even with its default recorded as the answer.
pub fn question_state(q: &QuestionInfo) -> &'static str {
    match &q.outcome {
        None => "open",
        Some(o) if o.by == Answerer::Timeout => "timed out",
        Some(_) => "answered",
    }
}

fn render(value: &impl Serialize, what: &str) -> Result<Value> {
    serde_json::to_value(value).map_err(|e| Error::Protocol(format!("cannot render {what}: {e}")))
}

#[derive(Serialize)]
struct JsonExecution<'a> {
    id: &'a str,
    name: Option<&'a str>,
    state: &'static str,
    pid: Option<u32>,
    attempt: u32,
    restarts: u32,
    command: &'a [String],
    restart: &'static str,
    last_exit: Option<JsonExit<'a>>,
    reason: Option<&'a str>,
    created: String,
    stream_last_seq: u64,
    last_checkpoint: Option<JsonCheckpoint>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum JsonExit<'a> {
    Code(i32),
    Signal(i32),
    SpawnFailed(&'a str),
}

#[derive(Serialize)]
struct JsonCheckpoint {
    seq: u64,
    created: String,
}
