//! `tether completions SHELL` and `tether manpages DIR`: made from the
//! same clap definition as the commands themselves, so they never fall
//! behind a new flag. Neither talks to a daemon.

use std::path::{Path, PathBuf};

use clap::Args;
use clap_complete::Shell;
use tether::{Error, Result};

/// `tether completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to print a completion script for.
    #[arg(value_name = "SHELL")]
    pub shell: Shell,
}

/// `tether manpages`.
#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// The directory to write the pages to (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Prints the completion script for `args.shell` to stdout.
pub fn completions(args: &CompletionsArgs) -> Result<()> {
    let mut script = Vec::new();
    let mut command = super::command();
    clap_complete::generate(args.shell, &mut command, "tether", &mut script);
    super::write_stdout(&script)?;
    Ok(())
}

/// Writes one man page per command to `args.dir`: `tether.1`,
/// `tether-tail.1`, `tether-checkpoint-save.1`, ... and prints their paths.
pub fn manpages(args: &ManpagesArgs) -> Result<()> {
    let written = write_manpages(super::command(), &args.dir)?;
    let mut listing = String::new();
    for path in written {
        listing.push_str(&format!("{}\n", path.display()));
    }
    super::write_stdout(listing.as_bytes())?;
    Ok(())
}

/// Writes the pages of `command` and of every command below it into
/// `dir`, and returns their paths.
pub fn write_manpages(command: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    let failed = |what: String, source: std::io::Error| Error::Local {
        context: what,
        source,
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| failed(format!("cannot create {}", dir.display()), e))?;
    let mut command = command.disable_help_subcommand(true);
    // Building names each subcommand "tether-tail" and so on, which the
    // pages take as their titles and file names.
    command.build();
    let mut written = Vec::new();
    write_tree(&command, dir, &mut written)
        .map_err(|e| failed(format!("cannot write man pages to {}", dir.display()), e))?;
    Ok(written)
}

fn write_tree(
    command: &clap::Command,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let page = clap_mangen::Man::new(command.clone());
    written.push(page.generate_to(dir)?);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}
