//! `tether ps [--all] [--label K=V]... [ID]...`: supervised executions,
//! one row each.
//!
//! Columns: ID, NAME (`-` when none), STATE, PID (of the running worker,
//! `-` otherwise), CPU% (the running worker's CPU time over its life so
//! far, as ps(1) shows it), RSS (its resident memory), RESTARTS,
//! CHECKPOINT (`-`, or the newest checkpoint's seq and age, `17 (3m ago)`),
//! LAST-SEQ (the stream's last seq) and REASON (why it ended: `exit N`,
//! `signal NAME`, `deadline`, `crash loop`, `max restarts`, `stopped`,
//! `lost`, `spawn failed`; for a `waiting` one, its oldest open question
//! and its age, `asked 3m ago: Deploy?`; `-` while it runs). Without `--all` only
//! executions that have not ended are listed. Naming ids (or names) lists
//! just those, ended or not; an unknown one exits 3. `--label K=V` keeps
//! the executions with that label (repeated: with every one of them).
//!
//! `--json`: one object per execution with the fields `id`, `name`,
//! `state`, `pid`, `attempt`, `restarts`, `command`, `restart`,
//! `last_exit` (`{"code":N}`, `{"signal":N}`, `{"spawn_failed":"why"}` or
//! null), `reason`, `created` (RFC 3339), `stream_last_seq`,
//! `last_checkpoint` (`{"seq","created"}` or null), `env_keys` (the
//! environment's names, never its values), `cwd`, `cpu_percent` and
//! `rss_bytes` (null when no worker runs), `labels` (an object), `parent`
//! (an id or null) and `children` (ids). A daemon too old to report the
//! last seven leaves them empty. `question` is a waiting execution's
//! oldest open question (`{"id","text","choices","asked_micros"}`), else
//! null (the SDKs' `ps` gives the same).

use clap::Args;
use tether::gates::{open_questions_of_waiting, waiting_on};
use tether::time::{age, now_micros};
use tether::{Error, Result};
use tether_protocol::{
    ended_because, find_execution, ErrorCode, ExecState, ExecutionDetail, ExecutionInfo, Named,
    QuestionInfo,
};

use super::{table, write_stdout, Context};

/// Arguments of `tether ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list executions that have ended. (CPU% is a running worker's
    /// CPU time over its whole life so far, as ps(1) shows it.)
    #[arg(long)]
    all: bool,

    /// List only the executions with this label (repeatable: all must
    /// match).
    #[arg(long = "label", value_name = "K=V", value_parser = tether::sdk::run::label_pair)]
    labels: Vec<(String, String)>,

    /// List only these executions (ended ones included), by id or name.
    #[arg(value_name = "ID")]
    ids: Vec<String>,
}

/// Runs `tether ps`.
pub async fn run(ctx: &Context, args: PsArgs) -> Result<()> {
    let all = args.all || !args.ids.is_empty();
    let connector = ctx.connector("ps");
    let mut executions = tether::sdk::execution_details(&connector, all).await?;
    // Each ID may be a name: the live execution so named, else the newest
    // ended one (an id matching exactly wins).
    let mut wanted: Vec<String> = Vec::new();
    let mut missing: Vec<&String> = Vec::new();
    for key in &args.ids {
        match find_execution(executions.iter(), key, |e| Named::from(&e.info)) {
            Some(e) => wanted.push(e.info.id.clone()),
            None => missing.push(key),
        }
    }
    if !args.ids.is_empty() {
        executions.retain(|e| wanted.contains(&e.info.id));
    }
    executions.retain(|e| has_labels(e, &args.labels));
    let open = open_questions_of_waiting(&connector, executions.iter().map(|e| &e.info)).await?;
    let text = if ctx.json {
        executions
            .iter()
            .map(|e| detail_json_line(e, waiting_on(&open, &e.info)))
            .collect::<Result<String>>()?
    } else if executions.is_empty() && !args.ids.is_empty() {
        String::new()
    } else {
        render(&executions, &open, now_micros())
    };
    write_stdout(text.as_bytes())?;
    match missing.as_slice() {
        [] => Ok(()),
        ids => Err(no_such_execution(ids)),
    }
}

/// True when `e` has every one of `labels`.
fn has_labels(e: &ExecutionDetail, labels: &[(String, String)]) -> bool {
    labels.iter().all(|wanted| e.labels.contains(wanted))
}

fn no_such_execution(ids: &[&String]) -> Error {
    let names: Vec<String> = ids.iter().map(|id| format!("{id:?}")).collect();
    Error::Daemon {
        code: ErrorCode::NOT_FOUND,
        message: format!("no such execution: {}", names.join(", ")),
    }
}

/// The REASON of a row: why it ended, what it waits on, or `-`.
fn reason(e: &ExecutionInfo, open: &[QuestionInfo], now: u64) -> String {
    if let Some(q) = waiting_on(open, e) {
        return format!("asked {} ago: {}", age(now, q.asked_micros), q.text);
    }
    if e.state == ExecState::Waiting {
        // A question closed between the two requests: the daemon's own
        // words, the oldest open question's text, are what is left.
        return e.reason.clone().unwrap_or_else(|| "-".to_owned());
    }
    ended_because(e).unwrap_or_else(|| "-".to_owned())
}

/// The table, header first.
fn render(executions: &[ExecutionDetail], open: &[QuestionInfo], now: u64) -> String {
    let header = [
        "ID",
        "NAME",
        "STATE",
        "PID",
        "CPU%",
        "RSS",
        "RESTARTS",
        "CHECKPOINT",
        "LAST-SEQ",
        "REASON",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    for detail in executions {
        let e = &detail.info;
        let checkpoint = match e.last_checkpoint {
            Some(c) => format!("{} ({} ago)", c.seq, age(now, c.created_micros)),
            None => "-".to_owned(),
        };
        rows.push(vec![
            e.id.clone(),
            e.name.clone().unwrap_or_else(|| "-".to_owned()),
            e.state.as_str().to_owned(),
            e.pid.map_or_else(|| "-".to_owned(), |pid| pid.to_string()),
            detail.cpu_per_mille.map_or_else(
                || "-".to_owned(),
                |per_mille| format!("{}.{}", per_mille / 10, per_mille % 10),
            ),
            detail.rss_bytes.map_or_else(|| "-".to_owned(), memory),
            e.restarts.to_string(),
            checkpoint,
            e.stream_last_seq.to_string(),
            reason(e, open, now),
        ]);
    }
    table::render(&rows)
}

/// Bytes as ps-style text: `812K`, `12.3M`, `1.5G`.
fn memory(bytes: u64) -> String {
    const K: u64 = 1024;
    match bytes {
        b if b < K * K => format!("{}K", b.div_ceil(K)),
        b if b < K * K * K => format!("{:.1}M", b as f64 / (K * K) as f64),
        b => format!("{:.1}G", b as f64 / (K * K * K) as f64),
    }
}

/// One execution as a JSON line (with its newline).
pub fn json_line(e: &ExecutionInfo) -> Result<String> {
    Ok(tether::json::execution(e)?.to_string() + "\n")
}

/// One execution with its details, and the question it waits on, as a
/// JSON line (with its newline).
fn detail_json_line(e: &ExecutionDetail, question: Option<&QuestionInfo>) -> Result<String> {
    let mut value = tether::json::execution_detail(e)?;
    if let Some(map) = value.as_object_mut() {
        map.insert("question".into(), tether::json::waiting_question(question));
    }
    Ok(value.to_string() + "\n")
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::{CheckpointRef, ExecState, ExitStatus, RestartPolicy};

    const S: u64 = 1_000_000;

    pub(crate) fn info(id: &str, state: ExecState) -> ExecutionInfo {
        ExecutionInfo {
            id: id.into(),
            name: None,
            state,
            pid: None,
            attempt: 1,
            restarts: 0,
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            restart: RestartPolicy::OnFailure,
            last_exit: None,
            reason: None,
            created_micros: 1_700_000_000 * S,
            stream_last_seq: 0,
            last_checkpoint: None,
        }
    }

    fn detail(info: ExecutionInfo) -> ExecutionDetail {
        ExecutionDetail::from(info)
    }

    fn sample() -> Vec<ExecutionInfo> {
        let running = ExecutionInfo {
            name: Some("agent".into()),
            pid: Some(4242),
            attempt: 3,
            restarts: 2,
            stream_last_seq: 1234,
            last_checkpoint: Some(CheckpointRef {
                seq: 1200,
                created_micros: 1_700_000_000 * S - 150 * S,
            }),
            ..info("agent-abcdef", ExecState::Running)
        };
        let failed = ExecutionInfo {
            last_exit: Some(ExitStatus::Code(78)),
            reason: Some("exit code 78 is not retried".into()),
            stream_last_seq: 3,
            ..info("sh-zzzzzz", ExecState::Failed)
        };
        vec![running, failed]
    }

    fn sample_details() -> Vec<ExecutionDetail> {
        let mut details: Vec<ExecutionDetail> = sample().into_iter().map(detail).collect();
        details[0].env_keys = vec!["PATH".into(), "SECRET".into()];
        details[0].cwd = Some("/srv/agent".into());
        details[0].cpu_per_mille = Some(125);
        details[0].rss_bytes = Some(12_900_000);
        details
    }

    #[test]
    fn the_table_has_the_documented_columns() {
        assert_eq!(
            render(&sample_details(), &[], 1_700_000_000 * S),
            "ID            NAME   STATE    PID   CPU%  RSS    RESTARTS  CHECKPOINT     LAST-SEQ  REASON\n\
             agent-abcdef  agent  running  4242  12.5  12.3M  2         1200 (2m ago)  1234      -\n\
             sh-zzzzzz     -      failed   -     -     -      0         -              3         exit 78\n"
        );
    }

    fn asked(id: u64, execution: &str, attempt: u32, ago: u64, text: &str) -> QuestionInfo {
        QuestionInfo {
            id,
            execution: execution.into(),
            key: format!("{text}#0"),
            text: text.into(),
            choices: vec!["yes".into(), "no".into()],
            default: None,
            asked_micros: 1_700_000_000 * S - ago * S,
            deadline_micros: None,
            attempt,
            seq: 1,
            outcome: None,
        }
    }

    #[test]
    fn a_waiting_execution_shows_its_question_and_its_age() {
        let mut details = sample_details();
        details[0].info.state = ExecState::Waiting;
        details[0].info.reason = Some("Deploy to prod?".into());
        let open = [
            asked(9, "agent-abcdef", 3, 5, "Second?"),
            asked(4, "agent-abcdef", 2, 600, "From attempt 2?"),
            asked(7, "agent-abcdef", 3, 180, "Deploy to prod?"),
            asked(8, "other-zzzzzz", 1, 900, "Not mine?"),
        ];
        let now = 1_700_000_000 * S;
        let text = render(&details, &open, now);
        let row = text.lines().nth(1).unwrap();
        assert!(
            row.starts_with("agent-abcdef  agent  waiting  4242"),
            "{text}"
        );
        assert!(row.ends_with("  asked 3m ago: Deploy to prod?"), "{text}");
        // Without the list, the daemon's text stands.
        let text = render(&details, &[], now);
        assert!(text.lines().nth(1).unwrap().ends_with("  Deploy to prod?"));
        let line = detail_json_line(&details[0], waiting_on(&open, &details[0].info)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["state"], "waiting");
        assert_eq!(
            value["question"],
            serde_json::json!({
                "id": 7,
                "text": "Deploy to prod?",
                "choices": ["yes", "no"],
                "asked_micros": now - 180 * S,
            })
        );
        let line = detail_json_line(&details[1], waiting_on(&open, &details[1].info)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(value["question"].is_null());
    }

    #[test]
    fn label_filters_must_all_match() {
        let mut e = sample_details().remove(0);
        e.labels = vec![("team".into(), "a".into()), ("tier".into(), "1".into())];
        let want = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(has_labels(&e, &[]));
        assert!(has_labels(&e, &want(&[("team", "a")])));
        assert!(has_labels(&e, &want(&[("team", "a"), ("tier", "1")])));
        assert!(!has_labels(&e, &want(&[("team", "a"), ("tier", "2")])));
        assert!(!has_labels(&e, &want(&[("team", "b")])));
    }

    #[test]
    fn memory_is_shown_as_ps_does() {
        assert_eq!(memory(1), "1K");
        assert_eq!(memory(812 * 1024), "812K");
        assert_eq!(memory(12_900_000), "12.3M");
        assert_eq!(memory(3 << 30), "3.0G");
    }

    #[test]
    fn json_details_name_the_environment_but_never_its_values() {
        let line = detail_json_line(&sample_details()[0], None).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["id"], "agent-abcdef");
        assert_eq!(value["env_keys"], serde_json::json!(["PATH", "SECRET"]));
        assert_eq!(value["cwd"], "/srv/agent");
        assert_eq!(value["cpu_percent"], 12.5);
        assert_eq!(value["rss_bytes"], 12_900_000);
        let ended = detail_json_line(&sample_details()[1], None).unwrap();
        let value: serde_json::Value = serde_json::from_str(&ended).unwrap();
        assert!(value["cpu_percent"].is_null() && value["rss_bytes"].is_null());
    }

    #[test]
    fn json_has_one_object_per_execution_with_readable_values() {
        let samples = sample();
        let line = json_line(&samples[1]).unwrap();
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["id"], "sh-zzzzzz");
        assert_eq!(value["state"], "failed");
        assert_eq!(value["restart"], "on-failure");
        assert_eq!(value["last_exit"]["code"], 78);
        assert_eq!(value["reason"], "exit code 78 is not retried");
        assert_eq!(value["created"], "2023-11-14T22:13:20.000000Z");
        assert!(value["pid"].is_null() && value["last_checkpoint"].is_null());
        let value: serde_json::Value =
            serde_json::from_str(&json_line(&samples[0]).unwrap()).unwrap();
        assert_eq!(value["pid"], 4242);
        assert_eq!(value["last_checkpoint"]["seq"], 1200);
        let spawn = ExecutionInfo {
            last_exit: Some(ExitStatus::SpawnFailed("no such file".into())),
            ..info("x-aaaaaa", ExecState::Failed)
        };
        let value: serde_json::Value = serde_json::from_str(&json_line(&spawn).unwrap()).unwrap();
        assert_eq!(value["last_exit"]["spawn_failed"], "no such file");
    }

    #[test]
    fn unknown_ids_are_not_found() {
        let a = "a".to_owned();
        let b = "b c".to_owned();
        let err = no_such_execution(&[&a, &b]);
        assert_eq!(err.exit_code(), 3);
        assert!(err.to_string().contains("\"a\", \"b c\""), "{err}");
    }
}
