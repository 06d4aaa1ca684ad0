//! `tether stop ID [--timeout DUR] [--recursive]`: signal the execution's
//! worker's process group with its stop signal (`run --stop-signal`,
//! default SIGTERM), SIGKILL it after the timeout (default 10s); the
//! execution ends `cancelled`. Prints the state it ended in (`cancelled`,
//! or the final state it had already reached); `--json` prints the
//! execution as `tether ps --json` does. An unknown id exits 3.
//!
//! `--recursive` stops the execution's descendants first (those whose
//! `run --parent` leads to it), the deepest generation first, each
//! generation at once, so that no child outlives the parent that would
//! have managed it; one line is printed per execution stopped, the
//! named one last.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use tether::{Error, Result};
use tether_protocol::{find_execution, ExecutionDetail, ExecutionInfo, Named, Request, Response};

use super::{duration, ps, write_stdout, Context};

/// Arguments of `tether stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The execution to stop.
    #[arg(value_name = "ID")]
    id: String,

    /// How long the worker has after the stop signal before it gets
    /// SIGKILL.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration::parse)]
    timeout: Duration,

    /// Also stop the executions it started (`run --parent`), and theirs,
    /// deepest first.
    #[arg(long)]
    recursive: bool,
}

/// Runs `tether stop`.
pub async fn run(ctx: &Context, args: StopArgs) -> Result<()> {
    let mut order = Vec::new();
    if args.recursive {
        let all = tether::sdk::execution_details(&ctx.connector("stop"), true).await?;
        // An unknown key is left to the daemon's own answer below.
        if let Some(root) = find_execution(all.iter(), &args.id, |e| Named::from(&e.info)) {
            order = descendants_deepest_first(&all, &root.info.id);
        }
    }
    for generation in order {
        let stops = generation.iter().map(|id| stop_one(ctx, id, args.timeout));
        for stopped in futures_util::future::join_all(stops).await {
            print(ctx, &stopped?)?;
        }
    }
    let info = stop_one(ctx, &args.id, args.timeout).await?;
    print(ctx, &info)
}

async fn stop_one(ctx: &Context, id: &str, timeout: Duration) -> Result<ExecutionInfo> {
    let request = Request::Stop {
        execution: id.to_owned(),
        timeout_ms: tether::time::millis(timeout),
    };
    // Stop is idempotent (stopping an ended execution answers at once), so
    // a session lost while waiting is simply retried.
    let response = ctx.connector("stop").request(&request).await?;
    match response {
        Response::Stopped(info) => Ok(info),
        other => Err(Error::Protocol(format!(
            "the daemon answered Stop with {}",
            other.name()
        ))),
    }
}

fn print(ctx: &Context, info: &ExecutionInfo) -> Result<()> {
    let text = if ctx.json {
        ps::json_line(info)?
    } else {
        format!("{}\n", info.state.as_str())
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

/// The descendants of `root` by generation, the deepest first; `root`
/// itself is not among them. A parent cycle (which the daemon never
/// makes) cannot loop: each execution is taken once.
fn descendants_deepest_first(all: &[ExecutionDetail], root: &str) -> Vec<Vec<String>> {
    let children: BTreeMap<&str, &[String]> = all
        .iter()
        .map(|e| (e.info.id.as_str(), e.children.as_slice()))
        .collect();
    let mut seen = vec![root.to_owned()];
    let mut generations: Vec<Vec<String>> = Vec::new();
    let mut current = vec![root.to_owned()];
    while !current.is_empty() {
        let mut next = Vec::new();
        for id in &current {
            for child in children.get(id.as_str()).copied().unwrap_or_default() {
                if !seen.contains(child) {
                    seen.push(child.clone());
                    next.push(child.clone());
                }
            }
        }
        if !next.is_empty() {
            generations.push(next.clone());
        }
        current = next;
    }
    generations.reverse();
    generations
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::ExecState;

    fn detail(id: &str, children: &[&str]) -> ExecutionDetail {
        ExecutionDetail {
            children: children.iter().map(|c| c.to_string()).collect(),
            ..ExecutionDetail::from(ps::tests::info(id, ExecState::Running))
        }
    }

    #[test]
    fn descendants_come_deepest_generation_first() {
        let all = [
            detail("root", &["a", "b"]),
            detail("a", &["a1"]),
            detail("b", &[]),
            detail("a1", &["a2"]),
            detail("a2", &[]),
            detail("other", &["x"]),
        ];
        assert_eq!(
            descendants_deepest_first(&all, "root"),
            vec![vec!["a2"], vec!["a1"], vec!["a", "b"]]
        );
        assert!(descendants_deepest_first(&all, "b").is_empty());
    }
}
