//! `tether-shim EXECUTION ATTEMPT`: one per attempt of a supervised worker,
//! started by tetherd with a `ShimSpecFull` on stdin. The arguments only name
//! the attempt for people reading `ps`. Everything else is in
//! [`tether::shim`].

use std::io::IsTerminal;
use std::process::ExitCode;

use tether::shim::{self, ShimOptions};

fn main() -> ExitCode {
    // First, while this is the only thread: the worker inherits nothing
    // but its stdin, stdout and stderr. tetherd passes nothing else, so a
    // failure here is reported and the worker still started.
    if let Err(e) = tether_protocol::inherited::close_on_exec_except(0..0) {
        eprintln!("tether-shim: the worker may inherit descriptors of the shim: {e}");
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!(
            "tether-shim: started by tetherd, one per attempt of a supervised worker; \
             it reads its instructions from stdin and is not meant to be run by hand"
        );
        return ExitCode::from(2);
    }
    let spec = match shim::spec::read(stdin.lock()) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("tether-shim: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    // One thread: a shim runs per worker and must stay small.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tether-shim: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(shim::run(spec, ShimOptions::default()));
    ExitCode::from(outcome.exit_code())
}
