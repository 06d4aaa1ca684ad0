//! The examples that end every command's `--help`, kept in one table so
//! that the command definitions stay about flags, and added to the clap
//! command tree by [`with_examples`]. A test walks the tree and fails for
//! any command without examples.

use clap::Command;

/// Examples per command, by its path below `tether` ("" for `tether`
/// itself, "checkpoint save" for a nested one).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "",
        "  tether publish build-log < build.txt
  tether tail -f build-log
  tether run --name agent -- python3 agent.py
  tether completions bash > ~/.local/share/bash-completion/completions/tether",
    ),
    (
        "publish",
        "  make 2>&1 | tether publish build-log
  tether publish events --producer importer-1 < events.jsonl",
    ),
    (
        "tail",
        "  tether tail build-log
  tether tail -f -n 20 build-log
  tether tail --consumer indexer -f events
  tether tail --cursor-file pos.txt --count 100 events
  tether tail -t --since 10m --until 2m agent",
    ),
    (
        "streams",
        "  tether streams\n  tether streams --json\n  tether streams rm build-log",
    ),
    (
        "streams rm",
        "  tether streams rm build-log\n  tether streams rm old-1 old-2",
    ),
    (
        "rm",
        "  tether rm 3f2a9c\n  tether rm --force 3f2a9c 7b1e04",
    ),
    (
        "prune",
        "  tether prune\n  tether prune --older-than 7d\n  tether prune --older-than 0s",
    ),
    ("status", "  tether status\n  tether status --json"),
    (
        "metrics",
        "  tether metrics
  tether metrics | grep tether_frames_appended_total",
    ),
    (
        "run",
        "  tether run -- ./crawl.sh
  tether run --name agent --restart always -- python3 agent.py
  tether run --env MODE=fast --cwd /srv/job --attach -- ./job
  tether run --pty --env-file .env -- ./tool-that-buffers",
    ),
    (
        "apply",
        "  tether apply jobs.toml
  tether apply --replace jobs.toml
  tether apply --json jobs.toml",
    ),
    ("ps", "  tether ps\n  tether ps --all --json"),
    (
        "attach",
        "  tether attach agent
  tether attach -n 50 3f2a9c; echo \"exit $?\"",
    ),
    (
        "wait",
        "  tether wait agent
  tether wait 3f2a9c 7b1e04 && echo both completed",
    ),
    (
        "ask",
        "  answer=$(tether ask --choices yes,no 'Deploy to prod?')
  tether ask --timeout 30m --default no --choices yes,no 'Delete the old data?'
  tether ask --key \"review-$PR\" 'Looks good?'
  tether ask --execution 3f2a9c 'Which region?'",
    ),
    (
        "answer",
        "  tether answer agent yes
  tether answer 3f2a9c --question 12 eu-west-1
  tether answer agent --host ssh://ops@build1 no",
    ),
    (
        "questions",
        "  tether questions
  tether questions --all
  tether questions --follow
  tether questions --all --json",
    ),
    (
        "send",
        "  tether send agent 'stop after this batch'
  tether send agent < instructions.txt",
    ),
    (
        "recv",
        "  msg=$(tether recv)
  tether recv --timeout 10s
  tether recv --all --print-id",
    ),
    (
        "resume",
        "  tether resume agent
  tether resume --checkpoint 12 3f2a9c",
    ),
    (
        "restart",
        "  tether restart agent
  tether restart --timeout 30s 3f2a9c",
    ),
    (
        "stop",
        "  tether stop agent\n  tether stop --timeout 30s 3f2a9c",
    ),
    (
        "checkpoint",
        "  tether checkpoint save < state.json
  tether checkpoint load --execution agent > state.json
  tether checkpoint list agent",
    ),
    (
        "checkpoint save",
        "  tether checkpoint save < state.json
  tether checkpoint save --execution agent --schema-version 2 < state.json",
    ),
    (
        "checkpoint load",
        "  tether checkpoint load > state.json
  tether checkpoint load --execution agent --schema-version 2",
    ),
    (
        "checkpoint list",
        "  tether checkpoint list agent\n  tether checkpoint list agent --json",
    ),
    (
        "step",
        "  tether step run fetch -- curl -s https://example.com/data
  tether step list agent",
    ),
    (
        "step run",
        "  tether step run fetch -- curl -s https://example.com/data
  tether step run --execution agent compile -- make",
    ),
    (
        "step get",
        "  tether step get fetch\n  tether step get --execution agent fetch",
    ),
    (
        "step put",
        "  echo done | tether step put notify\n  tether step put --execution agent fetch < result.json",
    ),
    ("step list", "  tether step list\n  tether step list agent --json"),
    (
        "step clear",
        "  tether step clear fetch\n  tether step clear --all --execution agent",
    ),
    (
        "dial-stdio",
        "  tether --host ssh://ops@build-1 status    (runs `tether dial-stdio` there)",
    ),
    (
        "completions",
        "  tether completions bash > ~/.local/share/bash-completion/completions/tether
  tether completions zsh > ~/.zfunc/_tether
  tether completions fish > ~/.config/fish/completions/tether.fish",
    ),
    (
        "manpages",
        "  tether manpages ~/.local/share/man/man1\n  man tether-tail",
    ),
];

/// `command` (the tree of `tether`'s commands) with each command's
/// examples as the end of its help.
pub fn with_examples(command: Command) -> Command {
    add(command, "")
}

fn add(mut command: Command, path: &str) -> Command {
    if let Some((_, text)) = EXAMPLES.iter().find(|(p, _)| *p == path) {
        command = command.after_help(format!("Examples:\n{text}"));
    }
    let names: Vec<String> = command
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    for name in names {
        let sub_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path} {name}")
        };
        command = command.mut_subcommand(&name, |sub| add(sub, &sub_path));
    }
    command
}
