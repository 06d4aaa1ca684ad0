//! `[mirror]`: where the mirror publishes, and which streams it takes.

use std::path::PathBuf;

use serde::Deserialize;

/// The subject prefix when `[mirror] subject_prefix` is not set.
pub const DEFAULT_SUBJECT_PREFIX: &str = "tether";

/// The JetStream stream when `[mirror] jetstream_stream` is not set.
pub const DEFAULT_JETSTREAM_STREAM: &str = "TETHER";

/// The mirror's settings; present only when `nats_url` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorConfig {
    /// The NATS server, `nats://HOST:4222` (several may be given, split by
    /// commas).
    pub nats_url: String,
    /// A NATS credentials file (JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// The second part of every subject; `None`: the host name.
    pub source: Option<String>,
    /// The first part of every subject, and the JetStream stream's
    /// subjects (`PREFIX.>`).
    pub subject_prefix: String,
    /// Globs of the streams mirrored; empty: all of them.
    pub streams: Vec<String>,
    /// The JetStream stream the subjects belong to, created if missing.
    pub jetstream_stream: String,
}

/// `[mirror]` as the file writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorSection {
    pub nats_url: Option<String>,
    pub creds: Option<PathBuf>,
    pub source: Option<String>,
    pub subject_prefix: Option<String>,
    pub streams: Option<Vec<String>>,
    pub jetstream_stream: Option<String>,
}

impl MirrorSection {
    /// Value checks that the types alone do not make.
    pub fn check(&self) -> Result<(), String> {
        if self.nats_url.as_deref().is_some_and(str::is_empty) {
            return Err("mirror.nats_url: empty; leave it out to turn the mirror off".into());
        }
        if let Some(prefix) = &self.subject_prefix {
            let bad = prefix.is_empty()
                || prefix.split('.').any(|t| {
                    t.is_empty() || t.contains(['*', '>']) || t.contains(char::is_whitespace)
                });
            if bad {
                return Err(format!(
                    "mirror.subject_prefix: {prefix:?} is not a NATS subject without wildcards"
                ));
            }
        }
        if self.source.as_deref().is_some_and(str::is_empty) {
            return Err("mirror.source: empty; leave it out to use the host name".into());
        }
        if let Some(name) = &self.jetstream_stream {
            if name.is_empty() || name.contains(['.', '*', '>', '/', '\\', ' ']) {
                return Err(format!(
                    "mirror.jetstream_stream: {name:?} is not a JetStream stream name"
                ));
            }
        }
        if self.streams.iter().flatten().any(String::is_empty) {
            return Err("mirror.streams: an empty glob matches no stream".into());
        }
        Ok(())
    }

    /// The settings the section gives; `None` without `nats_url`.
    pub fn config(&self) -> Option<MirrorConfig> {
        Some(MirrorConfig {
            nats_url: self.nats_url.clone()?,
            creds: self.creds.clone(),
            source: self.source.clone(),
            subject_prefix: self
                .subject_prefix
                .clone()
                .unwrap_or_else(|| DEFAULT_SUBJECT_PREFIX.to_owned()),
            streams: self.streams.clone().unwrap_or_default(),
            jetstream_stream: self
                .jetstream_stream
                .clone()
                .unwrap_or_else(|| DEFAULT_JETSTREAM_STREAM.to_owned()),
        })
    }
}

/// The subject of `stream`'s frames: `PREFIX.SOURCE.STREAM`, SOURCE and
/// STREAM escaped so that each stays one token whatever it holds.
pub fn subject(prefix: &str, source: &str, stream: &str) -> String {
    format!("{prefix}.{}.{}", escape(source), escape(stream))
}

/// `name` with every byte outside `[A-Za-z0-9_-]` written `%XX`: a dot
/// would split a subject token, `*` and `>` are wildcards, and `%` itself
/// must be escaped for the rule to be undone without doubt.
pub fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The host name, the default source; `localhost` when it cannot be read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn names_are_escaped_into_one_token_each() {
        assert_eq!(escape("build-1_a"), "build-1_a");
        assert_eq!(escape("a.b"), "a%2Eb");
        assert_eq!(escape("x*>%"), "x%2A%3E%25");
        assert_eq!(escape("é"), "%C3%A9");
        assert_eq!(
            subject("tether", "host.lan", "s.1"),
            "tether.host%2Elan.s%2E1"
        );
    }

    #[test]
    fn the_section_is_checked_and_defaults_are_filled() {
        let empty = MirrorSection::default();
        assert_eq!(empty.check(), Ok(()));
        assert_eq!(empty.config(), None);
        let section = MirrorSection {
            nats_url: Some("nats://127.0.0.1:4222".into()),
            ..MirrorSection::default()
        };
        let config = section.config().unwrap();
        assert_eq!(config.subject_prefix, "tether");
        assert_eq!(config.jetstream_stream, "TETHER");
        assert!(config.streams.is_empty());
        let bad = MirrorSection {
            subject_prefix: Some("a.>".into()),
            ..section
        };
        assert!(bad.check().unwrap_err().contains("mirror.subject_prefix"));
    }
}
