//! `tether status`: the daemon's version, pid, uptime, socket, state
//! directory, store size, counts and whether the store can be written.
//! `--json`: one object with the fields `version`, `protocol`, `pid`,
//! `uptime_secs`, `socket`, `state_dir`, `store_bytes`, `streams`,
//! `executions`, `connections` and `storage` (`{"degraded": null}`, or
//! the fault: `{"degraded": {"cause", "full", "since_micros"}}`; absent
//! from a daemon too old to say), and `mirror` when the daemon mirrors to
//! NATS (`nats_url`, `jetstream_stream`, `source`, `connected`, and
//! `streams`: `stream`, `mirrored_seq`, `last_seq`, `lag` each).

use std::time::Duration;

use tether::time::Rfc3339;
use tether::Result;
use tether_protocol::{MirrorInfo, Request, Response, StatusInfo, StorageState};

use super::{write_stdout, Context};

/// Runs `tether status`.
pub async fn run(ctx: &Context) -> Result<()> {
    let connector = ctx.connector("status");
    let (status, storage) = tether::sdk::status(&connector).await?;
    // A daemon too old to know the request refuses it; it has no mirror.
    let mirror = match connector.request(&Request::MirrorStatus).await {
        Ok(Response::MirrorStatus(info)) => info,
        _ => None,
    };
    let text = if ctx.json {
        let mut value = tether::json::status(&status, storage.as_ref())?;
        if let (Some(info), Some(object)) = (&mirror, value.as_object_mut()) {
            object.insert("mirror".into(), mirror_json(info));
        }
        value.to_string() + "\n"
    } else {
        human(&status, storage.as_ref()) + &mirror.as_ref().map(mirror_human).unwrap_or_default()
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

fn human(s: &StatusInfo, storage: Option<&StorageState>) -> String {
    let storage = storage.map(|state| match &state.degraded {
        None => "ok".to_owned(),
        Some(fault) => format!(
            "degraded ({}) since {}",
            fault.cause,
            Rfc3339(fault.since_micros)
        ),
    });
    let rows = [
        (
            "version",
            format!("{} (protocol {})", s.version, s.protocol),
        ),
        ("pid", s.pid.to_string()),
        ("uptime", uptime(Duration::from_secs(s.uptime_secs))),
        ("socket", s.socket.clone()),
        ("state dir", s.state_dir.clone()),
        ("store size", size(s.store_bytes)),
        ("streams", s.streams.to_string()),
        ("executions", s.executions.to_string()),
        ("connections", s.connections.to_string()),
    ];
    rows.iter()
        .map(|(key, value)| (*key, value))
        .chain(storage.as_ref().map(|value| ("storage", value)))
        .map(|(key, value)| format!("{:<13}{value}\n", format!("{key}:")))
        .collect()
}

/// The mirror's part: where it publishes, then one line per stream with
/// its lag (frames committed but not yet acknowledged by JetStream).
fn mirror_human(m: &MirrorInfo) -> String {
    let state = if m.connected {
        "connected"
    } else {
        "NATS unreachable"
    };
    let mut text = format!(
        "{:<13}{} (JetStream stream {}, source {}): {state}\n",
        "mirror:", m.nats_url, m.jetstream_stream, m.source
    );
    for s in &m.streams {
        text.push_str(&format!(
            "  {}: lag {} (mirrored through {} of {})\n",
            s.stream,
            s.last_seq.saturating_sub(s.mirrored_seq),
            s.mirrored_seq,
            s.last_seq
        ));
    }
    text
}

fn mirror_json(m: &MirrorInfo) -> serde_json::Value {
    let streams: Vec<_> = m
        .streams
        .iter()
        .map(|s| {
            serde_json::json!({
                "stream": s.stream,
                "mirrored_seq": s.mirrored_seq,
                "last_seq": s.last_seq,
                "lag": s.last_seq.saturating_sub(s.mirrored_seq),
            })
        })
        .collect();
    serde_json::json!({
        "nats_url": m.nats_url,
        "jetstream_stream": m.jetstream_stream,
        "source": m.source,
        "connected": m.connected,
        "streams": streams,
    })
}

/// `3d 4h 5m 6s`, leaving out leading zero units.
fn uptime(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    parts[first..]
        .iter()
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `1.5 MiB (1572864 bytes)`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {} ({bytes} bytes)", UNITS[unit])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn human_status_is_one_aligned_line_per_item() {
        let status = StatusInfo {
            version: "0.1.0".into(),
            protocol: 1,
            pid: 4242,
            uptime_secs: 3725,
            socket: "/run/tether/tether.sock".into(),
            state_dir: "/var/lib/tether".into(),
            store_bytes: 1_572_864,
            streams: 3,
            executions: 0,
            connections: 1,
        };
        assert_eq!(
            human(&status, None),
            "version:     0.1.0 (protocol 1)\n\
             pid:         4242\n\
             uptime:      1h 2m 5s\n\
             socket:      /run/tether/tether.sock\n\
             state dir:   /var/lib/tether\n\
             store size:  1.5 MiB (1572864 bytes)\n\
             streams:     3\n\
             executions:  0\n\
             connections: 1\n"
        );
        let ok = StorageState { degraded: None };
        assert!(human(&status, Some(&ok)).ends_with("connections: 1\nstorage:     ok\n"));
        let degraded = StorageState {
            degraded: Some(tether_protocol::StorageFault {
                cause: "storage full: No space left on device (os error 28)".into(),
                full: true,
                since_micros: 1_764_000_000_000_000,
            }),
        };
        assert!(human(&status, Some(&degraded)).ends_with(
            "storage:     degraded (storage full: No space left on device (os error 28)) \
             since 2025-11-24T16:00:00.000000Z\n"
        ));
    }

    #[test]
    fn the_mirror_part_names_the_server_and_each_lag() {
        let mirror = MirrorInfo {
            nats_url: "nats://n:4222".into(),
            jetstream_stream: "TETHER".into(),
            source: "build1".into(),
            connected: false,
            streams: vec![tether_protocol::MirrorStreamInfo {
                stream: "jobs".into(),
                mirrored_seq: 100,
                last_seq: 1100,
            }],
        };
        assert_eq!(
            mirror_human(&mirror),
            "mirror:      nats://n:4222 (JetStream stream TETHER, source build1): \
             NATS unreachable\n  jobs: lag 1000 (mirrored through 100 of 1100)\n"
        );
        assert_eq!(mirror_json(&mirror)["streams"][0]["lag"], 1000);
    }

    #[test]
    fn sizes_and_uptimes_read_naturally() {
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(2048), "2.0 KiB (2048 bytes)");
        assert_eq!(uptime(Duration::from_secs(0)), "0s");
        assert_eq!(uptime(Duration::from_secs(90_061)), "1d 1h 1m 1s");
    }
}
