//! Shell friendliness: completion scripts, a man page per command, and
//! examples at the end of every command's `--help`, for both binaries.
//! The command tree is read from the binaries' own help, so a command
//! added later is held to the same rules without this file changing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tether_tests::{bins, cli, Sandbox};

const TIMEOUT: Duration = Duration::from_secs(60);

fn run(program: &Path, args: &[&str]) -> cli::Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = cli::run(cmd, b"", TIMEOUT);
    out.assert_success();
    out
}

/// The names listed under "Commands:" in a help text, less `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path of `program` ("" first), found by walking `--help`.
fn command_paths(program: &Path) -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    let mut next = 0;
    while next < paths.len() {
        let path = paths[next].clone();
        next += 1;
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        for name in subcommands(&run(program, &args).stdout) {
            let mut child = path.clone();
            child.push(name);
            paths.push(child);
        }
    }
    paths
}

fn every_help_ends_with_examples(program: &Path) {
    let paths = command_paths(program);
    assert!(paths.len() > 3, "found only {paths:?}");
    for path in paths {
        for flag in ["--help", "-h"] {
            let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
            args.push(flag);
            let help = run(program, &args).stdout;
            let (_, examples) = help
                .split_once("\nExamples:\n")
                .unwrap_or_else(|| panic!("`{args:?}` has no Examples section:\n{help}"));
            let name = program.file_name().unwrap().to_str().unwrap();
            let lines: Vec<&str> = examples.lines().collect();
            assert!(
                !lines.is_empty() && lines.iter().all(|l| l.starts_with("  ")),
                "`{args:?}`: the examples are not the end of the help:\n{help}"
            );
            assert!(
                lines.iter().any(|l| l.contains(name)),
                "`{args:?}`: no example runs {name}:\n{help}"
            );
        }
    }
}

#[test]
fn every_tether_command_help_ends_with_examples() {
    every_help_ends_with_examples(&bins::tether());
}

#[test]
fn every_tetherd_command_help_ends_with_examples() {
    every_help_ends_with_examples(&bins::tetherd());
}

fn completions_parse_and_name_the_commands(program: &Path) {
    let top = subcommands(&run(program, &["--help"]).stdout);
    let bash = run(program, &["completions", "bash"]).stdout;
    let sb = Sandbox::new();
    let script = sb.file("completion.bash");
    std::fs::write(&script, &bash).unwrap();
    let check = run(Path::new("bash"), &["-n", script.to_str().unwrap()]);
    assert_eq!(check.stderr, "");
    for shell in ["bash", "zsh", "fish"] {
        let text = run(program, &["completions", shell]).stdout;
        for name in &top {
            assert!(
                text.contains(name.as_str()),
                "the {shell} script does not name `{name}`"
            );
        }
    }
    let out = cli::run(
        {
            let mut cmd = Command::new(program);
            cmd.args(["completions", "tcsh"]);
            cmd
        },
        b"",
        TIMEOUT,
    );
    out.assert_code(2);
}

#[test]
fn tether_completions_parse_and_name_the_commands() {
    completions_parse_and_name_the_commands(&bins::tether());
}

#[test]
fn tetherd_completions_parse_and_name_the_commands() {
    completions_parse_and_name_the_commands(&bins::tetherd());
}

/// Whether groff is installed; the pages are written either way.
fn groff() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join("groff"))
        .find(|p| p.is_file())
}

fn a_man_page_per_command_renders_cleanly(program: &Path) {
    let name = program.file_name().unwrap().to_str().unwrap().to_owned();
    let sb = Sandbox::new();
    let dir = sb.file("man");
    let out = run(program, &["manpages", dir.to_str().unwrap()]);
    let mut expected: Vec<PathBuf> = command_paths(program)
        .into_iter()
        .map(|path| {
            let stem = std::iter::once(name.clone())
                .chain(path)
                .collect::<Vec<_>>();
            dir.join(format!("{}.1", stem.join("-")))
        })
        .collect();
    expected.sort();
    let mut listed: Vec<PathBuf> = out.stdout.lines().map(PathBuf::from).collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "the pages written are not one per command"
    );
    let mut on_disk: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, expected);
    let Some(groff) = groff() else { return };
    for page in &expected {
        let text = std::fs::read_to_string(page).unwrap();
        assert!(text.contains("Examples:"), "{page:?}");
        let rendered = run(&groff, &["-man", "-ww", "-Tutf8", page.to_str().unwrap()]);
        assert_eq!(rendered.stderr, "", "groff warned about {}", page.display());
        assert!(!rendered.stdout.is_empty());
    }
}

#[test]
fn tether_writes_a_man_page_per_command_that_renders_cleanly() {
    a_man_page_per_command_renders_cleanly(&bins::tether());
}

#[test]
fn tetherd_writes_a_man_page_per_command_that_renders_cleanly() {
    a_man_page_per_command_renders_cleanly(&bins::tetherd());
}
