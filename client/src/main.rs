//! The `tether` command line. Everything lives in the `cli` module and the
//! library; this file only hands over.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
