//! `tether send` and `tether recv`: an execution's inbox.
//!
//! * `send ID [MESSAGE...]`: queues the words joined by spaces, or without
//!   words all of stdin, as one message. Prints nothing.
//! * `recv [--execution ID] [--timeout DUR] [--all] [--print-id]`: prints
//!   the next message (with `--all`, every waiting one), each followed by
//!   a newline unless it ends with one; `--print-id` puts its id and a tab
//!   before each. Waits forever for one unless `--timeout`; when that
//!   passes with none, exit 1.
//!
//! A message is removed only after it was printed: `recv` prints, then
//! asks the daemon to dequeue through the last id printed. A crash between
//! the two prints it again next time (`--print-id` lets a worker skip a
//! message it has seen).

use std::time::Duration;

use clap::Args;
use tether::error::EXIT_OK;
use tether::gates;
use tether::worker::ENV_EXECUTION;
use tether::{Error, Result};
use tether_protocol::InboxMessage;

use super::checkpoint::execution;
use super::{duration, read_stdin, write_stdout, Context};

/// How many messages `recv --all` asks for at a time.
const RECV_BATCH: u32 = 1000;

/// Arguments of `tether send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The execution to send to (its id or name).
    #[arg(value_name = "ID")]
    execution: String,

    /// The message (the words are joined by spaces) [default: all of stdin]
    #[arg(value_name = "MESSAGE")]
    words: Vec<String>,
}

/// Arguments of `tether recv`.
#[derive(Debug, Args)]
pub struct RecvArgs {
    /// The execution whose inbox to read [default: $TETHER_EXECUTION_ID]
    #[arg(long, value_name = "ID")]
    execution: Option<String>,

    /// Give up after this long with no message (exit 1) [default: wait
    /// forever]
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    timeout: Option<Duration>,

    /// Print every waiting message, not just the next one.
    #[arg(long)]
    all: bool,

    /// Put each message's id and a tab before it.
    #[arg(long)]
    print_id: bool,
}

/// Runs `tether send`.
pub async fn send(ctx: &Context, args: SendArgs) -> Result<u8> {
    let message = if args.words.is_empty() {
        read_stdin("the message")?
    } else {
        bytes::Bytes::from(args.words.join(" "))
    };
    gates::send(&ctx.connector("send"), &args.execution, message).await?;
    Ok(EXIT_OK)
}

/// Runs `tether recv`.
pub async fn recv(ctx: &Context, args: RecvArgs) -> Result<u8> {
    let execution = execution(args.execution, std::env::var(ENV_EXECUTION).ok())?;
    let connector = ctx.connector("recv");
    let max = if args.all { RECV_BATCH } else { 1 };
    let mut timeout = args.timeout;
    let mut first = true;
    loop {
        let messages = gates::recv(&connector, &execution, max, timeout).await?;
        let Some(last) = messages.last().map(|m| m.id) else {
            return match args.timeout {
                // The first wait ran out with nothing.
                Some(waited) if first => Err(Error::NoMessage { execution, waited }),
                // `--all` has printed every waiting one.
                _ => Ok(EXIT_OK),
            };
        };
        if !write_stdout(&printed(&messages, args.print_id))? {
            // Nobody read them: leave them queued.
            return Ok(EXIT_OK);
        }
        gates::dequeue(&connector, &execution, last).await?;
        if !args.all {
            return Ok(EXIT_OK);
        }
        // The rest of `--all` are those already waiting: no more waits.
        first = false;
        timeout = Some(Duration::ZERO);
    }
}

/// The messages as `recv` prints them.
fn printed(messages: &[InboxMessage], print_id: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        if print_id {
            out.extend_from_slice(format!("{}\t", m.id).as_bytes());
        }
        out.extend_from_slice(&m.data);
        if !m.data.ends_with(b"\n") {
            out.push(b'\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn message(id: u64, data: &str) -> InboxMessage {
        InboxMessage {
            id,
            sent_micros: 1,
            sender_uid: 1000,
            data: bytes::Bytes::from(data.to_owned()),
        }
    }

    #[test]
    fn each_message_ends_with_one_newline_and_may_carry_its_id() {
        let messages = [message(4, "go"), message(5, "two\nlines\n"), message(6, "")];
        assert_eq!(printed(&messages, false), b"go\ntwo\nlines\n\n");
        assert_eq!(printed(&messages, true), b"4\tgo\n5\ttwo\nlines\n6\t\n");
    }
}
