//! `tether publish STREAM [--producer ID]`: each stdin line becomes one
//! frame of kind `data`.
//!
//! The producer seq of a line is its line number (1-based), so a re-run
//! with the same `--producer` and the same input stores nothing twice: the
//! daemon acknowledges lines it already has without storing them again.
//! Without `--producer` the name is unique per run. Exit 0 means every line
//! is durable.
//!
//! A thread reads stdin in large chunks and splits lines (see
//! [`super::lines`]) while the async side pipelines them to the daemon.

use clap::Args;
use tether::{Publisher, PublisherOptions, Result};
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

/// Runs `tether publish`.
pub async fn run(ctx: &Context, args: PublishArgs) -> Result<()> {
    let producer = args.producer.unwrap_or_else(default_producer);
    let mut publisher = Publisher::new(
        ctx.connector("publish"),
        args.stream,
        producer,
        PublisherOptions::default(),
    )?;
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
    fn default_producer_names_are_valid_and_unique() {
        let a = default_producer();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let b = default_producer();
        assert_ne!(a, b);
        tether_protocol::validate_name("producer", &a).unwrap();
        assert!(a.contains(&format!("-{}-", std::process::id())), "{a}");
    }
}
