//! `tether apply FILE [--replace]`: declared executions. FILE is TOML with
//! one `[[execution]]` table per execution:
//!
//! ```toml
//! [[execution]]
//! id = "crawler"                # required: the execution's id (run --id)
//! cmd = ["python3", "crawl.py"] # required: program and arguments
//! cwd = "jobs"                  # relative to FILE's directory [default: it]
//! env = { MODE = "fast" }       # the worker's whole environment
//! restart = "always"            # never, on-failure (default), always
//! labels = { team = "search" }
//! # also: name, max_restarts, deadline ("2h"), parent, stop_signal,
//! # max_failures_without_progress
//! ```
//!
//! Each declared execution is looked up by id among all executions, ended
//! ones included. A missing one is started as `run --id` starts it (of
//! concurrent applies, the daemon starts it once): `started ID`. One whose
//! stored spec matches is left alone: `unchanged ID`. One that differs is
//! listed with the fields that differ, `differs ID: cmd, env`; with
//! `--replace` it is stopped and removed (`rm --force`) and started again
//! under the same id with the new spec: `replaced ID`. `--json` prints one
//! object per execution instead. Exit 0 when nothing differs (or all that
//! differ were replaced), 1 when some differ without `--replace`, 2 for a
//! bad file, naming the file, the line and the problem.
//!
//! The worker's environment is exactly `env` (plus its own `TETHER_*`
//! variables): not the caller's, so that a file means the same whoever
//! applies it and from whatever shell. Declare `PATH` if the worker needs
//! more than the system's default search path. Directories are resolved
//! on this machine, so with `--host` give each `cwd` as the remote
//! machine's absolute path.
//!
//! Every key is compared with what the daemon shows of the stored
//! execution: `labels` as a set, `env` by its names only, as values are
//! never shown, and `stop_signal` as written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use tether::error::{EXIT_ERROR, EXIT_OK};
use tether::sdk::RunOptions;
use tether::{Error, Result};
use tether_protocol::{ExecutionDetail, RestartPolicy, RunSpecFull};
use toml::Spanned;

use super::{duration, run, write_stdout, Context};

/// Arguments of `tether apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The TOML file of `[[execution]]` tables.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Stop, remove and start again, with the declared spec, every
    /// execution whose stored spec differs.
    #[arg(long)]
    replace: bool,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileText {
    #[serde(default)]
    execution: Vec<Table>,
}

/// One `[[execution]]` table as written; checked by [`declared_of`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    id: Spanned<String>,
    cmd: Spanned<Vec<String>>,
    name: Option<String>,
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    restart: Option<Spanned<String>>,
    max_restarts: Option<u32>,
    deadline: Option<Spanned<String>>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    parent: Option<String>,
    stop_signal: Option<Spanned<String>>,
    max_failures_without_progress: Option<u32>,
}

/// One declared execution, checked, as the run that would start it.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    pub id: String,
    pub run: RunSpecFull,
}

/// How a declared execution stands against the daemon's.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Started,
    Unchanged,
    Differs(Vec<&'static str>),
    Replaced(Vec<&'static str>),
}

/// Runs `tether apply`; returns the exit code.
pub async fn run(ctx: &Context, args: ApplyArgs) -> Result<u8> {
    let declared = read(&args.file)?;
    let connector = ctx.connector("apply");
    let existing = tether::sdk::execution_details(&connector, true).await?;
    let mut code = EXIT_OK;
    for one in declared {
        let outcome = match existing.iter().find(|e| e.info.id == one.id) {
            None => {
                run::submit(ctx, one.run.clone()).await?;
                Outcome::Started
            }
            Some(stored) => {
                let fields = differences(stored, &one.run);
                if fields.is_empty() {
                    Outcome::Unchanged
                } else if args.replace {
                    tether::sdk::remove(&connector, vec![one.id.clone()], true).await?;
                    run::submit(ctx, one.run.clone()).await?;
                    Outcome::Replaced(fields)
                } else {
                    code = EXIT_ERROR;
                    Outcome::Differs(fields)
                }
            }
        };
        if !write_stdout(line(ctx.json, &one.id, &outcome).as_bytes())? {
            break;
        }
    }
    Ok(code)
}

/// The line printed for one execution, with its newline.
fn line(json: bool, id: &str, outcome: &Outcome) -> String {
    let (word, fields): (&str, &[&str]) = match outcome {
        Outcome::Started => ("started", &[]),
        Outcome::Unchanged => ("unchanged", &[]),
        Outcome::Differs(fields) => ("differs", fields),
        Outcome::Replaced(fields) => ("replaced", fields),
    };
    if json {
        let value = serde_json::json!({ "id": id, "result": word, "fields": fields });
        return value.to_string() + "\n";
    }
    match outcome {
        Outcome::Differs(fields) => format!("differs {id}: {}\n", fields.join(", ")),
        _ => format!("{word} {id}\n"),
    }
}

/// The fields, by their names in the file, in which `stored` differs from
/// `declared`; see the module's docs for what can be compared.
fn differences(stored: &ExecutionDetail, declared: &RunSpecFull) -> Vec<&'static str> {
    let spec = &declared.spec;
    let keys = |pairs: &[(String, String)]| -> BTreeSet<String> {
        pairs.iter().map(|(k, _)| k.clone()).collect()
    };
    let set = |pairs: &[(String, String)]| -> BTreeSet<(String, String)> {
        pairs.iter().cloned().collect()
    };
    let stored_env: BTreeSet<String> = stored.env_keys.iter().cloned().collect();
    let checks = [
        ("cmd", stored.info.command != spec.command),
        ("name", stored.info.name != spec.name),
        ("cwd", stored.cwd != spec.cwd),
        ("env", stored_env != keys(&spec.env)),
        ("restart", stored.info.restart != spec.restart),
        ("labels", set(&stored.labels) != set(&declared.labels)),
        ("parent", stored.parent != declared.parent),
        ("max_restarts", stored.max_restarts != spec.max_restarts),
        ("deadline", stored.deadline_ms != spec.deadline_ms),
        ("stop_signal", stored.stop_signal != declared.stop_signal),
        (
            "max_failures_without_progress",
            stored.max_failures_without_progress != declared.max_failures_without_progress,
        ),
    ];
    checks
        .into_iter()
        .filter(|(_, differs)| *differs)
        .map(|(field, _)| field)
        .collect()
}

/// The executions `path` declares, each checked and resolved against the
/// file's directory; a bad file is a usage error naming it and the line.
pub fn read(path: &Path) -> Result<Vec<Declared>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Local {
        context: format!("cannot read {}", path.display()),
        source,
    })?;
    // The file's own directory, without symlinks or `.`, so that a file
    // applied by any path resolves its `cwd`s alike.
    let file = std::fs::canonicalize(path).map_err(|source| Error::Local {
        context: format!("cannot resolve the directory of {}", path.display()),
        source,
    })?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    parse(&text, path, dir)
}

/// The executions `text` (the contents of `path`) declares, with relative
/// `cwd`s resolved against `dir`.
fn parse(text: &str, path: &Path, dir: &Path) -> Result<Vec<Declared>> {
    let bad = |offset: Option<usize>, problem: &str| {
        let line = offset.map_or(1, |at| line_of(text, at));
        Error::Usage(format!("{}:{line}: {problem}", path.display()))
    };
    let file: FileText =
        toml::from_str(text).map_err(|e| bad(e.span().map(|s| s.start), e.message().trim()))?;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for table in file.execution {
        let at = table.id.span().start;
        let id = table.id.get_ref().clone();
        if let Some(first) = seen.get(&id) {
            return Err(bad(
                Some(at),
                &format!("duplicate id {id:?} (first declared on line {first})"),
            ));
        }
        seen.insert(id.clone(), line_of(text, at));
        let run = declared_of(table, dir).map_err(|(offset, problem)| bad(offset, &problem))?;
        out.push(Declared { id, run });
    }
    Ok(out)
}

/// The run one table declares, or where (a byte offset) and what the
/// problem is.
fn declared_of(
    table: Table,
    dir: &Path,
) -> std::result::Result<RunSpecFull, (Option<usize>, String)> {
    let id_at = Some(table.id.span().start);
    let id = table.id.into_inner();
    tether_protocol::validate_run_id(&id).map_err(|e| (id_at, format!("bad id {id:?}: {e}")))?;
    let cmd_at = Some(table.cmd.span().start);
    let command = table.cmd.into_inner();
    if command.first().is_none_or(String::is_empty) {
        return Err((
            cmd_at,
            "cmd must name a program: a non-empty first string".into(),
        ));
    }
    let restart = match table.restart {
        None => RestartPolicy::OnFailure,
        Some(value) => {
            let at = Some(value.span().start);
            let name = value.into_inner();
            RestartPolicy::from_name(&name).ok_or_else(|| {
                (
                    at,
                    format!("restart {name:?} is not one of never, on-failure, always"),
                )
            })?
        }
    };
    let deadline: Option<Duration> = match table.deadline {
        None => None,
        Some(value) => {
            let at = Some(value.span().start);
            Some(duration::parse(value.get_ref()).map_err(|e| (at, format!("deadline: {e}")))?)
        }
    };
    let stop_signal = match table.stop_signal {
        None => None,
        Some(value) => {
            let at = Some(value.span().start);
            Some(tether::sdk::run::stop_signal(value.get_ref()).map_err(|e| (at, e))?)
        }
    };
    // Components drop `.` and doubled slashes, so that the stored cwd
    // compares equal however the path was spelled.
    let cwd: PathBuf = dir
        .join(table.cwd.unwrap_or_default())
        .components()
        .collect();
    let options = RunOptions {
        command,
        name: table.name,
        restart,
        max_restarts: table.max_restarts,
        deadline,
        cwd: Some(cwd),
        env: table.env.into_iter().collect(),
        id: Some(id),
        labels: table.labels.into_iter().collect(),
        parent: table.parent,
        max_failures_without_progress: table.max_failures_without_progress,
        stop_signal,
    };
    let mut run = options
        .into_full_in(&|| Ok(PathBuf::from("/")))
        .map_err(|e| (id_at, e.to_string()))?;
    run.whole_env = true;
    run::check_size(&run.spec).map_err(|e| (id_at, e.to_string()))?;
    Ok(run)
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn parsed(text: &str) -> Result<Vec<Declared>> {
        parse(text, Path::new("jobs.toml"), Path::new("/srv/jobs"))
    }

    fn problem(text: &str) -> String {
        let err = parsed(text).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        err.to_string()
    }

    #[test]
    fn a_full_table_becomes_the_run_it_declares() {
        let runs = parsed(
            r#"
[[execution]]
id = "crawler"
cmd = ["python3", "crawl.py"]
name = "crawl"
cwd = "./work//dir"
env = { MODE = "fast", PATH = "/usr/bin" }
restart = "always"
max_restarts = 3
deadline = "1m30s"
labels = { team = "search", tier = "1" }
parent = "boss"
stop_signal = "sigint"
max_failures_without_progress = 4
"#,
        )
        .unwrap();
        assert_eq!(runs.len(), 1);
        let Declared { id, run } = &runs[0];
        assert_eq!(id, "crawler");
        assert_eq!(run.id.as_deref(), Some("crawler"));
        assert_eq!(run.spec.command, ["python3", "crawl.py"]);
        assert_eq!(run.spec.name.as_deref(), Some("crawl"));
        assert_eq!(run.spec.cwd.as_deref(), Some("/srv/jobs/work/dir"));
        let env = [("MODE", "fast"), ("PATH", "/usr/bin")];
        let env: Vec<_> = env.map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        assert_eq!(run.spec.env, env);
        assert_eq!(run.spec.restart, RestartPolicy::Always);
        assert_eq!(run.spec.max_restarts, Some(3));
        assert_eq!(run.spec.deadline_ms, Some(90_000));
        assert_eq!(run.labels.len(), 2);
        assert_eq!(run.parent.as_deref(), Some("boss"));
        assert_eq!(run.stop_signal.as_deref(), Some("INT"));
        assert_eq!(run.max_failures_without_progress, Some(4));
        assert!(run.whole_env && !run.pty);
    }

    #[test]
    fn defaults_are_the_files_directory_and_an_empty_environment() {
        let runs = parsed("[[execution]]\nid = \"a\"\ncmd = [\"true\"]\n").unwrap();
        let run = &runs[0].run;
        assert_eq!(run.spec.cwd.as_deref(), Some("/srv/jobs"));
        assert!(run.spec.env.is_empty() && run.whole_env);
        assert_eq!(run.spec.restart, RestartPolicy::OnFailure);
        let absolute = parsed("[[execution]]\nid = \"a\"\ncmd = [\"x\"]\ncwd = \"/tmp\"\n");
        assert_eq!(absolute.unwrap()[0].run.spec.cwd.as_deref(), Some("/tmp"));
        assert!(parsed("").unwrap().is_empty());
    }

    #[test]
    fn an_unknown_key_names_the_file_line_and_key() {
        let err = problem("[[execution]]\nid = \"a\"\ncmd = [\"x\"]\ncolour = \"red\"\n");
        assert!(
            err.starts_with("jobs.toml:4: unknown field `colour`"),
            "{err}"
        );
        let err = problem("[[job]]\nid = \"a\"\n");
        assert!(err.starts_with("jobs.toml:1: unknown field `job`"), "{err}");
    }

    #[test]
    fn a_missing_id_or_cmd_is_named() {
        let err = problem("\n[[execution]]\ncmd = [\"x\"]\n");
        assert!(err.contains("missing field `id`"), "{err}");
        assert!(err.starts_with("jobs.toml:"), "{err}");
        let err = problem("[[execution]]\nid = \"a\"\n");
        assert!(err.contains("missing field `cmd`"), "{err}");
        let err = problem("[[execution]]\nid = \"a\"\ncmd = []\n");
        assert!(
            err.starts_with("jobs.toml:3: cmd must name a program"),
            "{err}"
        );
        let err = problem("[[execution]]\nid = \"a\"\ncmd = \"echo hi\"\n");
        assert!(err.starts_with("jobs.toml:3: "), "{err}");
    }

    #[test]
    fn a_bad_or_duplicate_id_is_named_with_its_line() {
        let err = problem("[[execution]]\nid = \"a b\"\ncmd = [\"x\"]\n");
        assert!(err.starts_with("jobs.toml:2: bad id \"a b\""), "{err}");
        assert!(err.contains("1 to 128 characters"), "{err}");
        let text = "[[execution]]\nid = \"a\"\ncmd = [\"x\"]\n\n\
                    [[execution]]\nid = \"a\"\ncmd = [\"y\"]\n";
        let err = problem(text);
        assert_eq!(
            err,
            "jobs.toml:6: duplicate id \"a\" (first declared on line 2)"
        );
    }

    #[test]
    fn a_bad_restart_duration_or_signal_is_named_with_its_line() {
        let base = "[[execution]]\nid = \"a\"\ncmd = [\"x\"]\n";
        let err = problem(&format!("{base}restart = \"sometimes\"\n"));
        assert_eq!(
            err,
            "jobs.toml:4: restart \"sometimes\" is not one of never, on-failure, always"
        );
        let err = problem(&format!("{base}deadline = \"soon\"\n"));
        assert!(
            err.starts_with("jobs.toml:4: deadline: invalid duration"),
            "{err}"
        );
        let err = problem(&format!("{base}stop_signal = \"SEGV\"\n"));
        assert!(err.starts_with("jobs.toml:4: stop signal"), "{err}");
        let err = problem(&format!("{base}max_restarts = -1\n"));
        assert!(err.starts_with("jobs.toml:4: "), "{err}");
    }

    /// What the daemon would show of an execution started from `run`.
    fn stored(run: &RunSpecFull) -> ExecutionDetail {
        let info = tether_protocol::ExecutionInfo {
            command: run.spec.command.clone(),
            name: run.spec.name.clone(),
            restart: run.spec.restart,
            ..crate::cli::ps::tests::info("a", tether_protocol::ExecState::Running)
        };
        ExecutionDetail {
            info,
            env_keys: run.spec.env.iter().map(|(k, _)| k.clone()).collect(),
            cwd: run.spec.cwd.clone(),
            cpu_per_mille: None,
            rss_bytes: None,
            labels: run.labels.iter().rev().cloned().collect(),
            parent: run.parent.clone(),
            children: Vec::new(),
            max_restarts: run.spec.max_restarts,
            deadline_ms: run.spec.deadline_ms,
            stop_signal: run.stop_signal.clone(),
            max_failures_without_progress: run.max_failures_without_progress,
        }
    }

    #[test]
    fn only_the_fields_that_differ_are_named() {
        let text = "[[execution]]\nid = \"a\"\ncmd = [\"x\"]\nenv = { A = \"1\" }\n\
                    labels = { k = \"v\", t = \"u\" }\nmax_restarts = 2\n";
        let run = parsed(text).unwrap().remove(0).run;
        let same = stored(&run);
        assert!(
            differences(&same, &run).is_empty(),
            "labels compare as a set"
        );
        let mut other = stored(&run);
        other.info.command = vec!["y".into()];
        other.info.restart = RestartPolicy::Never;
        other.env_keys.push("B".into());
        other.cwd = Some("/elsewhere".into());
        assert_eq!(differences(&other, &run), ["cmd", "cwd", "env", "restart"]);
        let mut other = stored(&run);
        other.info.name = Some("n".into());
        other.labels.pop();
        other.parent = Some("p".into());
        assert_eq!(differences(&other, &run), ["name", "labels", "parent"]);
        let mut other = stored(&run);
        other.max_restarts = None;
        other.deadline_ms = Some(1000);
        other.stop_signal = Some("INT".into());
        other.max_failures_without_progress = Some(9);
        assert_eq!(
            differences(&other, &run),
            [
                "max_restarts",
                "deadline",
                "stop_signal",
                "max_failures_without_progress"
            ]
        );
    }

    #[test]
    fn the_lines_printed_name_the_outcome() {
        assert_eq!(line(false, "a", &Outcome::Started), "started a\n");
        assert_eq!(line(false, "a", &Outcome::Unchanged), "unchanged a\n");
        let fields = vec!["cmd", "env"];
        assert_eq!(
            line(false, "a", &Outcome::Differs(fields.clone())),
            "differs a: cmd, env\n"
        );
        assert_eq!(
            line(false, "a", &Outcome::Replaced(fields.clone())),
            "replaced a\n"
        );
        assert_eq!(
            line(true, "a", &Outcome::Differs(fields)),
            "{\"id\":\"a\",\"result\":\"differs\",\"fields\":[\"cmd\",\"env\"]}\n"
        );
    }
}
