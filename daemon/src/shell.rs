//! `tetherd completions SHELL` and `tetherd manpages DIR`, and the
//! examples that end every `tetherd` command's `--help`: made from the
//! clap definition of the command line, so they never fall behind a flag.

use std::path::{Path, PathBuf};

use clap::Command;

/// Examples per command, by its path below `tetherd` ("" for `tetherd`
/// itself).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "",
        "  tetherd
  tetherd --state-dir /var/lib/tether --socket /run/tether/tether.sock
  tetherd --config /etc/tether/tetherd.toml --log-format json
  tetherd --answerers ops --inbox-max-messages 1000
  systemctl start tetherd",
    ),
    (
        "check",
        "  tetherd check --state-dir /var/lib/tether\n  tetherd check --socket /run/tether/tether.sock",
    ),
    (
        "repair",
        "  systemctl stop tetherd && tetherd repair --state-dir /var/lib/tether",
    ),
    (
        "completions",
        "  tetherd completions bash > ~/.local/share/bash-completion/completions/tetherd
  tetherd completions zsh > ~/.zfunc/_tetherd
  tetherd completions fish > ~/.config/fish/completions/tetherd.fish",
    ),
    (
        "manpages",
        "  tetherd manpages /usr/local/share/man/man1\n  man tetherd-repair",
    ),
];

/// `command` (the tree of `tetherd`'s commands) with each command's
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

/// The completion script of `command` for `shell`.
pub fn completions(shell: clap_complete::Shell, mut command: Command) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "tetherd", &mut script);
    script
}

/// Writes the pages of `command` and of every command below it into
/// `dir` (`tetherd.1`, `tetherd-check.1`, ...), and returns their paths.
pub fn write_manpages(command: Command, dir: &Path) -> tetherd::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| tetherd::Error::io(format!("cannot create {}", dir.display()), e))?;
    let mut command = command.disable_help_subcommand(true);
    // Building names each subcommand "tetherd-check" and so on, which the
    // pages take as their titles and file names.
    command.build();
    let mut written = Vec::new();
    write_tree(&command, dir, &mut written).map_err(|e| {
        tetherd::Error::io(format!("cannot write man pages to {}", dir.display()), e)
    })?;
    Ok(written)
}

fn write_tree(command: &Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    written.push(clap_mangen::Man::new(command.clone()).generate_to(dir)?);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}
