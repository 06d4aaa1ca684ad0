//! `tether publish STREAM [--producer ID]`: each stdin line becomes one
//! frame of kind `data`.
//!
//! The producer seq of a line is its line number (1-based), so a re-run
//! with the same `--producer` and the same input stores nothing twice: the
//! daemon acknowledges lines it already has without storing them again.
//! Without `--producer` the name is unique per run. Exit 0 means every line
//! is durable. If the daemon keeps refusing appends (a full disk) until the
//! retry window runs out, the run gives up saying which lines are stored
//! and how to store the rest.
//!
//! A thread reads stdin in large chunks and splits lines (see
//! [`super::lines`]) while the async side pipelines them to the daemon.

use clap::Args;
use tether::error::EXIT_OK;
use tether::ssh::shell_quote;
use tether::{Error, Publisher, PublisherOptions, Result};
use tokio::sync::mpsc;

use super::{lines, producer_name, stream_name, Context};

/// Batches of lines buffered between the stdin thread and the sender.
const BATCHES_IN_FLIGHT: usize = 4;

/// Arguments of `tether publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The stream to append to (created on first use).
    #[arg(value_parser = stream_name)]
    stream: String,

    /// Producer name. Reuse it to make a re-run idempotent; by default each
    /// run gets a unique one.
    #[arg(long, value_name = "ID", value_parser = producer_name)]
    producer: Option<String>,
}

/// Runs `tether publish`; the exit code.
pub async fn run(ctx: &Context, args: PublishArgs) -> Result<u8> {
    let producer = args.producer.unwrap_or_else(default_producer);
    let mut publisher = Publisher::new(
        ctx.connector("publish"),
        args.stream,
        producer,
        PublisherOptions::default(),
    )?;
    match publish_stdin(&mut publisher).await {
        Ok(()) => Ok(EXIT_OK),
        // The daemon kept refusing (a full disk) until the retry window
        // ran out. After the error, say where the run stopped and how to
        // finish it: a re-run must reuse the producer name, which may have
        // been generated.
        Err(e @ Error::GaveUp { .. }) => {
            eprintln!("tether: {e}");
            eprintln!(
                "tether: {}",
                what_was_stored(publisher.acked_through(), publisher.producer())
            );
            Ok(e.exit_code())
        }
        Err(e) => Err(e),
    }
}

/// Publishes every stdin line, the line number as its producer seq, and
/// waits until all are durable.
async fn publish_stdin(publisher: &mut Publisher) -> Result<()> {
    publisher.connect().await?;

    let max_line = publisher.max_payload();
    let (tx, mut rx) = mpsc::channel(BATCHES_IN_FLIGHT);
    // The thread is not joined: on an early error the process exits while
    // it may still be blocked reading stdin.
    std::thread::spawn(move || {
        let outcome = lines::read_lines(std::io::stdin().lock(), max_line, |batch| {
            tx.blocking_send(Ok(batch)).is_ok()
        });
        if let Err(e) = outcome {
            let _ = tx.blocking_send(Err(e));
        }
    });

    let mut line_number = 0u64;
    while let Some(batch) = rx.recv().await {
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) => {
                // Leave a clean state behind: every line before the bad one
                // is stored.
                publisher.flush().await?;
                return Err(e);
            }
        };
        for line in batch {
            line_number += 1;
            publisher.publish(line_number, line).await?;
        }
        // Input may now pause (a pipe from a slow writer): send what we have
        // instead of holding it until the window fills.
        publisher.send().await?;
    }
    publisher.flush().await
}

/// What a run that gave up leaves behind: lines `1..=acked_through` are
/// stored, and re-running as `producer` on the same input stores the rest.
///
/// The lines after `acked_through` are said to be unconfirmed rather than
/// unstored: a line whose acknowledgement was lost with a session may be
/// stored all the same. The re-run is right either way, because the daemon
/// stores nothing twice for one producer and line number. It must start
/// from the same first line, since line numbers are the producer seqs.
fn what_was_stored(acked_through: u64, producer: &str) -> String {
    let stored = match acked_through {
        0 => "no line of this run is confirmed stored".to_owned(),
        1 => "line 1 of this run is stored; line 2 and later are not confirmed stored".to_owned(),
        n => format!(
            "lines 1-{n} of this run are stored; line {} and later are not confirmed stored",
            n + 1
        ),
    };
    let rest = if acked_through == 0 {
        "them"
    } else {
        "the rest"
    };
    format!(
        "{stored}. Run again with --producer {} and the same input, from its first line, \
         to store {rest}, each line once.",
        shell_quote(producer)
    )
}

/// `host-pid-nanos`: unique per run, and still telling where it came from.
fn default_producer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_control() || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .take(200)
        .collect();
    let host = if host.is_empty() {
        "tether".to_owned()
    } else {
        host
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{host}-{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_give_up_says_which_lines_are_stored_and_how_to_store_the_rest() {
        assert_eq!(
            what_was_stored(500, "after"),
            "lines 1-500 of this run are stored; line 501 and later are not confirmed \
             stored. Run again with --producer after and the same input, from its first \
             line, to store the rest, each line once."
        );
        assert_eq!(
            what_was_stored(1, "p"),
            "line 1 of this run is stored; line 2 and later are not confirmed stored. \
             Run again with --producer p and the same input, from its first line, to \
             store the rest, each line once."
        );
        assert_eq!(
            what_was_stored(0, "host-1-2"),
            "no line of this run is confirmed stored. Run again with --producer host-1-2 \
             and the same input, from its first line, to store them, each line once."
        );
    }

    #[test]
    fn producer_names_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(shell_quote("box.example-1234-99"), "box.example-1234-99");
        assert_eq!(shell_quote("a$b"), "'a$b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn default_producer_names_are_valid_and_unique() {
        let a = default_producer();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let b = default_producer();
        assert_ne!(a, b);
        tether_protocol::validate_name("producer", &a).unwrap();
        assert!(a.contains(&format!("-{}-", std::process::id())), "{a}");
    }
}
