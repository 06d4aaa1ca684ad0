//! `tether-it-idle SOCKET N [--hello | --listen]`: opens N connections to
//! the daemon at SOCKET, as whoever runs it, and holds them open until its
//! stdin closes. The admission tests run it as other users, to hold many
//! connections at once.
//!
//! * `--hello`: each connection says Hello and reads the answer.
//! * `--listen`: each connection sends nothing and reads the answer (a
//!   refused peer is answered at once; an admitted one only when its Hello
//!   is overdue).
//! * neither: each connection sends nothing and reads nothing.
//!
//! Then it prints, one line each and sorted, how many connections got each
//! answer (`hello_ok N`, or the error code's name, `N` and the first
//! message, as in `permission_denied N: ...`), then `holding`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use rustix::process::{getrlimit, setrlimit, Resource};
use tether_protocol::{Capabilities, Hello, Request, Response, PROTOCOL_VERSION};
use tether_tests::RawConn;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hello,
    Listen,
    Hold,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (socket, n, mode) = match args.as_slice() {
        [socket, n, rest @ ..] => {
            let mode = match rest {
                [] => Mode::Hold,
                [flag] if flag == "--hello" => Mode::Hello,
                [flag] if flag == "--listen" => Mode::Listen,
                _ => usage(),
            };
            let n: usize = n.parse().unwrap_or_else(|_| usage());
            (PathBuf::from(socket), n, mode)
        }
        _ => usage(),
    };
    // Each connection is a descriptor: take all the hard limit allows.
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);

    let mut held = Vec::with_capacity(n);
    let mut answers: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for i in 0..n {
        let mut conn = RawConn::connect(&socket)
            .unwrap_or_else(|e| panic!("connection {i} failed to connect: {e}"));
        if mode == Mode::Hello {
            // A refused connection may be closed before this is written;
            // its answer is read all the same.
            let _ = conn.send(&Request::Hello(Hello {
                version: PROTOCOL_VERSION,
                capabilities: Capabilities::NONE,
                client: "tether-it-idle".to_owned(),
            }));
        }
        if mode != Mode::Hold {
            let (key, message) = match conn.recv() {
                Ok(Some(Response::HelloOk(_))) => ("hello_ok".to_owned(), String::new()),
                Ok(Some(Response::Error(e))) => (e.code.name().to_owned(), e.message),
                Ok(Some(other)) => ("other".to_owned(), format!("{other:?}")),
                Ok(None) => ("closed".to_owned(), String::new()),
                Err(e) => ("read_error".to_owned(), e.to_string()),
            };
            answers.entry(key).or_insert((0, message)).0 += 1;
        }
        held.push(conn);
    }
    let mut out = std::io::stdout().lock();
    for (key, (count, message)) in &answers {
        if message.is_empty() {
            writeln!(out, "{key} {count}").unwrap();
        } else {
            writeln!(out, "{key} {count}: {message}").unwrap();
        }
    }
    writeln!(out, "holding").unwrap();
    out.flush().unwrap();
    drop(out);
    // Hold every connection until stdin ends.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(held);
}

fn usage() -> ! {
    eprintln!("usage: tether-it-idle SOCKET N [--hello | --listen]");
    std::process::exit(2);
}
