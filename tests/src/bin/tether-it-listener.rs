//! A stand-in for a socket another user listens on, for the local
//! security tests: it binds `SOCKET` (mode 0666, so anyone may connect),
//! prints `listening`, then for each connection, one at a time, reads
//! until the peer closes and prints `connection N: LEN bytes HEX`. What a
//! client sent it, if anything, is then on its stdout.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::process::ExitCode;
use std::time::Duration;

/// How long one connection may stay open without closing: a client that
/// waits for an answer gets none, and must not hold the others up forever.
const READ_LIMIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let Some(socket) = std::env::args_os().nth(1) else {
        eprintln!("usage: tether-it-listener SOCKET");
        return ExitCode::from(2);
    };
    match serve(&socket) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tether-it-listener: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(socket: &std::ffi::OsStr) -> std::io::Result<()> {
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening")?;
    stdout.flush()?;
    for (n, stream) in listener.incoming().enumerate() {
        let mut stream = stream?;
        stream.set_read_timeout(Some(READ_LIMIT))?;
        let mut got = Vec::new();
        // A peer that resets the connection has still sent what was read.
        let _ = stream.read_to_end(&mut got);
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(stdout, "connection {}: {} bytes {hex}", n + 1, got.len())?;
        stdout.flush()?;
    }
    Ok(())
}
