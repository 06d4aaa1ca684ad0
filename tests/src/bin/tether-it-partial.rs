//! `tether-it-partial SOCKET BYTES`: says Hello to the daemon at SOCKET,
//! sends the first BYTES bytes of a 16 MiB append, and prints what the
//! daemon answers (`CODE: MESSAGE`, or `closed`), without sending more.
//! The access tests run it as another user: the daemon judges a peer by
//! the credentials of the process that connected.

use std::path::PathBuf;
use std::process::ExitCode;

use tether_protocol::{Capabilities, Response};
use tether_tests::raw::{append_frame, RawConn};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, bytes] = &args[..] else {
        eprintln!("usage: tether-it-partial SOCKET BYTES");
        return ExitCode::from(2);
    };
    let Ok(bytes) = bytes.parse::<usize>() else {
        eprintln!("tether-it-partial: {bytes:?} is not a number of bytes");
        return ExitCode::from(2);
    };
    let mut conn = RawConn::open(&PathBuf::from(socket));
    conn.hello(Capabilities::DURABLE);
    let frame = append_frame("s", 16 << 20);
    if let Err(e) = conn.send_bytes(&frame[..bytes.min(frame.len())]) {
        eprintln!("tether-it-partial: sending failed: {e}");
        return ExitCode::from(1);
    }
    match conn.recv() {
        Ok(Some(Response::Error(e))) => println!("{}: {}", e.code, e.message),
        Ok(Some(other)) => println!("unexpected: {other:?}"),
        Ok(None) => println!("closed"),
        Err(e) => {
            eprintln!("tether-it-partial: reading the answer failed: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
