//! The config file (`tetherd.toml`) and the `TETHER_*` environment
//! overrides.
//!
//! Layers, later ones winning: built-in defaults, the file, the environment,
//! command-line flags. Every key is checked when it is read: an unknown key
//! or a bad value is an error that names the key (or the variable), so a
//! typo never silently falls back to a default.
//!
//! Environment overrides: `TETHER_LOG`, `TETHER_MAX_FRAME_LEN`,
//! `TETHER_MAX_CONNECTIONS`, `TETHER_MAX_PARTIAL_BYTES`,
//! `TETHER_SOCKET_MODE`, `TETHER_SOCKET_GROUP`,
//! `TETHER_READERS_GROUP`,
//! `TETHER_MAX_CONNECTIONS_PER_UID`,
//! `TETHER_RETENTION_MAX_FRAMES`, `TETHER_RETENTION_MAX_BYTES`,
//! `TETHER_RETENTION_MAX_AGE` (a duration such as `30d`; a bare number is
//! seconds), `TETHER_MAX_RESTARTS`, `TETHER_LOG_CAPACITY` and
//! `TETHER_LOG_FORMAT`.
//! `TETHER_CONFIG` names the file itself.
//!
//! Durations take units (`30s`, `12h`, `30d`, as humantime reads them); a
//! bare number is seconds, so the older keys such as `max_age_secs` still
//! read. The shipped sample, `systemd/tetherd.toml`, lists every key with
//! its default; a test keeps the two in step.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tether_protocol::paths::Env;

use super::{Config, LogFormat};
use crate::{Error, Result};

/// The config file's name inside the config directory.
pub const FILE_NAME: &str = "tetherd.toml";

/// The smallest accepted `log_capacity`: a few records of a small batch.
const MIN_LOG_CAPACITY: u64 = 64 * 1024;

/// The smallest accepted `max_frame_len`: a message must hold its
/// envelope and leave a payload room for a line of text.
const MIN_FRAME_LEN: u64 = tether_protocol::FRAME_ENVELOPE as u64 + 1024;

/// The largest accepted `max_frame_len`: the length prefix is a u32.
const MAX_FRAME_LEN: u64 = u32::MAX as u64;

/// The smallest accepted `max_partial_bytes`: room for a few messages in
/// progress.
const MIN_PARTIAL_BYTES: u64 = 1024 * 1024;

/// Where the config file is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSource {
    /// The file.
    pub path: PathBuf,
    /// Named by `--config` or `TETHER_CONFIG`: then a missing file is an
    /// error. The default file may be missing.
    pub explicit: bool,
}

impl ConfigSource {
    /// `flag` (from `--config` or `TETHER_CONFIG`) if given, else
    /// `tetherd.toml` in [`config_dir`]. `None` when no directory is known.
    pub fn resolve(flag: Option<PathBuf>, env: Env<'_>) -> Option<ConfigSource> {
        if let Some(path) = flag {
            return Some(ConfigSource {
                path,
                explicit: true,
            });
        }
        config_dir(env).map(|dir| ConfigSource {
            path: dir.join(FILE_NAME),
            explicit: false,
        })
    }

    /// Reads and checks the file. A missing default file is an empty
    /// config; a missing explicit one is an error naming it.
    pub fn load(&self) -> Result<FileConfig> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => FileConfig::parse(&text, &self.path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.explicit => {
                Ok(FileConfig::default())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Config(format!(
                "config file {} does not exist",
                self.path.display()
            ))),
            Err(e) => Err(Error::io(
                format!("cannot read config file {}", self.path.display()),
                e,
            )),
        }
    }
}

/// The config directory: `$CONFIGURATION_DIRECTORY` (systemd's
/// `ConfigurationDirectory=`), else `/etc/tether` for root, else
/// `$XDG_CONFIG_HOME/tether`, else `~/.config/tether`.
pub fn config_dir(env: Env<'_>) -> Option<PathBuf> {
    let get = |name: &str| (env.var)(name).filter(|v| !v.is_empty());
    if let Some(dirs) = get("CONFIGURATION_DIRECTORY") {
        // systemd may pass several colon-separated directories; ours is first.
        let first = dirs.split(':').next().unwrap_or(&dirs).to_owned();
        return Some(PathBuf::from(first));
    }
    if env.uid == 0 {
        return Some(PathBuf::from("/etc/tether"));
    }
    if let Some(dir) = get("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(dir).join("tether"));
    }
    get("HOME").map(|home| PathBuf::from(home).join(".config/tether"))
}

/// The contents of `tetherd.toml`. Every key is optional; an absent key
/// leaves the built-in default (or the flag) in force.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The tracing filter, e.g. `"info"` or `"tetherd=debug,info"`.
    pub log_level: Option<String>,
    /// Largest accepted message in bytes.
    pub max_frame_len: Option<u64>,
    /// Connections served at once.
    pub max_connections: Option<u64>,
    /// Connections one uid other than root and the daemon's own may hold.
    pub max_connections_per_uid: Option<u64>,
    /// Bytes of partly received messages held across connections.
    pub max_partial_bytes: Option<u64>,
    /// The write-ahead log's size in bytes, for a store whose log does not
    /// wrap yet.
    pub log_capacity: Option<u64>,
    /// `text` or `json` (see [`LogFormat`]).
    pub log_format: Option<LogFormat>,
    /// The directory of the store (`--state-dir`).
    pub state_dir: Option<PathBuf>,
    /// The shim program (`--shim`).
    pub shim: Option<PathBuf>,
    /// Checkpoints kept per execution (`--checkpoint-keep`).
    pub checkpoint_keep: Option<u32>,
    /// Largest checkpoint accepted, in bytes (`--max-checkpoint-bytes`).
    pub max_checkpoint_bytes: Option<u64>,
    /// The socket the daemon binds itself.
    #[serde(default)]
    pub socket: SocketSection,
    /// Who may connect besides the daemon's own user and root.
    #[serde(default)]
    pub access: AccessSection,
    /// Default per-stream retention limits.
    #[serde(default)]
    pub retention: RetentionSection,
    /// Defaults for supervised runs.
    #[serde(default)]
    pub restart: RestartSection,
    /// What `tether metrics` shows, and where else it is served.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// How long ended executions are kept.
    #[serde(default)]
    pub executions: ExecutionsSection,
    /// Bounds of the executions' inboxes.
    #[serde(default)]
    pub inbox: InboxSection,
    /// Where frames are mirrored (NATS JetStream).
    #[serde(default)]
    pub mirror: crate::mirror::MirrorSection,
}

/// `[executions]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionsSection {
    /// How long an ended execution is kept: a duration, or `"off"` to
    /// keep them all (`Some(None)`).
    #[serde(default, deserialize_with = "duration_or_off")]
    pub keep_ended: Option<Option<Duration>>,
}

/// `[metrics]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Globs of the streams shown one by one; the rest are summed.
    pub streams: Option<Vec<String>>,
    /// `host:port` to serve the metrics on over HTTP, at `/metrics`.
    pub listen: Option<SocketAddr>,
}

/// `[socket]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocketSection {
    /// Where to listen (`--socket`).
    pub path: Option<PathBuf>,
    /// Permission bits, written in octal: `mode = 0o660`.
    pub mode: Option<u32>,
    /// Group name or numeric gid given to the socket.
    pub group: Option<String>,
}

/// `[access]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSection {
    /// Group name or numeric gid whose members may only read.
    pub readers: Option<String>,
    /// Group names or numeric gids whose members may answer questions
    /// (and read).
    pub answerers: Option<Vec<String>>,
}

/// `[inbox]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxSection {
    /// Messages one execution's inbox holds at most.
    pub max_messages: Option<u64>,
}

/// `[retention]`; 0 means no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSection {
    /// Frames kept per stream.
    pub max_frames: Option<u64>,
    /// Payload bytes kept per stream.
    pub max_bytes: Option<u64>,
    /// Age of the oldest frame kept: a duration, or a number of seconds
    /// (read from `max_age_secs` too, the key's older name).
    #[serde(default, alias = "max_age_secs", deserialize_with = "duration")]
    pub max_age: Option<Duration>,
}

/// `[restart]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSection {
    /// Restarts allowed to a run that does not pass `--max-restarts`.
    pub max_restarts: Option<u32>,
    /// Failures without progress in a row that end a run that does not
    /// pass `--max-failures-without-progress`.
    pub max_failures_without_progress: Option<u32>,
}

impl FileConfig {
    /// Parses and checks `text`; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig> {
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            Error::Config(format!("{}: {}", path.display(), e.to_string().trim_end()))
        })?;
        file.check()
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(file)
    }

    /// Value checks that the types alone do not make.
    fn check(&self) -> std::result::Result<(), String> {
        if let Some(level) = &self.log_level {
            check_log_level("log_level", level)?;
        }
        if let Some(n) = self.max_frame_len {
            check_frame_len("max_frame_len", n)?;
        }
        if let Some(n) = self.max_connections {
            check_connections("max_connections", n)?;
        }
        if let Some(n) = self.max_connections_per_uid {
            check_connections("max_connections_per_uid", n)?;
        }
        if let Some(n) = self.max_partial_bytes {
            check_partial_bytes("max_partial_bytes", n)?;
        }
        if let Some(n) = self.log_capacity {
            check_log_capacity("log_capacity", n)?;
        }
        if let Some(mode) = self.socket.mode {
            check_mode("socket.mode", mode)?;
        }
        if let Some(group) = &self.socket.group {
            check_group("socket.group", group)?;
        }
        if let Some(group) = &self.access.readers {
            check_group("access.readers", group)?;
        }
        for group in self.access.answerers.iter().flatten() {
            check_group("access.answerers", group)?;
        }
        if self.inbox.max_messages == Some(0) {
            return Err("inbox.max_messages: must be at least 1".into());
        }
        if self.checkpoint_keep == Some(0) {
            return Err("checkpoint_keep: must be at least 1".into());
        }
        for glob in self.metrics.streams.iter().flatten() {
            if glob.is_empty() {
                return Err("metrics.streams: an empty glob matches no stream".into());
            }
        }
        self.mirror.check()
    }
}

/// Reads a duration: a string with units (`"30s"`, `"12h"`, `"30d"`), or
/// a whole number of seconds.
fn duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<Duration>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"30s\", \"12h\" or \"30d\", or seconds")
        }
        fn visit_u64<E: serde::de::Error>(self, secs: u64) -> std::result::Result<Self::Value, E> {
            Ok(Some(Duration::from_secs(secs)))
        }
        fn visit_i64<E: serde::de::Error>(self, secs: i64) -> std::result::Result<Self::Value, E> {
            u64::try_from(secs)
                .map(|secs| Some(Duration::from_secs(secs)))
                .map_err(|_| E::custom(format!("{secs} seconds is negative")))
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> std::result::Result<Self::Value, E> {
            parse_duration(text).map(Some).map_err(E::custom)
        }
    }
    d.deserialize_any(Visitor)
}

/// Reads a duration as [`duration`] does, or `"off"` (`Some(None)`).
fn duration_or_off<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<Duration>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Secs(secs) => Ok(Some(Some(Duration::from_secs(secs)))),
        Raw::Text(text) if text.trim() == "off" => Ok(Some(None)),
        Raw::Text(text) => parse_duration(&text)
            .map(|d| Some(Some(d)))
            .map_err(serde::de::Error::custom),
    }
}

/// Parses `"30d"`, `"12h 30m"` or `"90"` (seconds).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as \"30s\", \"12h\" or \"30d\": {e}"))
}

impl Config {
    /// Applies every key the file sets.
    pub fn apply_file(&mut self, file: &FileConfig) {
        if let Some(level) = &file.log_level {
            self.log_level = level.clone();
        }
        if let Some(n) = file.max_frame_len {
            self.max_frame_len = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = file.max_connections {
            self.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = file.max_connections_per_uid {
            self.max_connections_per_uid = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = file.max_partial_bytes {
            self.max_partial_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = file.log_capacity {
            self.log_capacity = n;
        }
        if let Some(mode) = file.socket.mode {
            self.socket_mode = mode;
        }
        if let Some(group) = &file.socket.group {
            self.socket_group = Some(group.clone());
        }
        if let Some(group) = &file.access.readers {
            self.readers_group = Some(group.clone());
        }
        if let Some(groups) = &file.access.answerers {
            self.answerers = groups.clone();
        }
        if let Some(n) = file.inbox.max_messages {
            self.inbox_max_messages = n;
        }
        let r = &file.retention;
        set_limit(&mut self.retention.max_frames, r.max_frames);
        set_limit(&mut self.retention.max_bytes, r.max_bytes);
        if let Some(age) = r.max_age {
            self.retention.max_age = (!age.is_zero()).then_some(age);
        }
        if let Some(n) = file.restart.max_restarts {
            self.default_max_restarts = Some(n);
        }
        if let Some(format) = file.log_format {
            self.log_format = format;
        }
        if let Some(shim) = &file.shim {
            self.shim = Some(shim.clone());
        }
        if let Some(n) = file.checkpoint_keep {
            self.checkpoint_keep = n.max(1) as usize;
        }
        if let Some(n) = file.max_checkpoint_bytes {
            self.max_checkpoint_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(keep) = file.executions.keep_ended {
            self.keep_ended = keep;
        }
        if let Some(globs) = &file.metrics.streams {
            self.metrics.streams = globs.clone();
        }
        if let Some(addr) = file.metrics.listen {
            self.metrics.listen = Some(addr);
        }
        if let Some(n) = file.restart.max_failures_without_progress {
            self.default_max_failures_without_progress = Some(n);
        }
        if let Some(mirror) = file.mirror.config() {
            self.mirror = Some(mirror);
        }
    }

    /// Applies the `TETHER_*` overrides that are set (see the module
    /// documentation for the list). A bad value is an error naming the
    /// variable.
    pub fn apply_env(&mut self, env: Env<'_>) -> Result<()> {
        let get = |name: &str| (env.var)(name).filter(|v| !v.is_empty());
        let fail = |name: &str, msg: String| Error::Config(format!("${name}: {msg}"));
        // The checks name the key they were given, here the variable.
        let bad = |msg: String| Error::Config(format!("${msg}"));
        if let Some(level) = get("TETHER_LOG") {
            check_log_level("TETHER_LOG", &level).map_err(bad)?;
            self.log_level = level;
        }
        if let Some(v) = get("TETHER_MAX_FRAME_LEN") {
            let n = number("TETHER_MAX_FRAME_LEN", &v)?;
            check_frame_len("TETHER_MAX_FRAME_LEN", n).map_err(bad)?;
            self.max_frame_len = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = get("TETHER_MAX_CONNECTIONS") {
            let n = number("TETHER_MAX_CONNECTIONS", &v)?;
            check_connections("TETHER_MAX_CONNECTIONS", n).map_err(bad)?;
            self.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = get("TETHER_MAX_CONNECTIONS_PER_UID") {
            let n = number("TETHER_MAX_CONNECTIONS_PER_UID", &v)?;
            check_connections("TETHER_MAX_CONNECTIONS_PER_UID", n).map_err(bad)?;
            self.max_connections_per_uid = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(v) = get("TETHER_MAX_PARTIAL_BYTES") {
            let n = number("TETHER_MAX_PARTIAL_BYTES", &v)?;
            check_partial_bytes("TETHER_MAX_PARTIAL_BYTES", n).map_err(bad)?;
            self.max_partial_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = get("TETHER_SOCKET_MODE") {
            let digits = v.trim_start_matches("0o");
            let mode = u32::from_str_radix(digits, 8).map_err(|_| {
                fail(
                    "TETHER_SOCKET_MODE",
                    format!("{v:?} is not an octal permission mode such as 660"),
                )
            })?;
            check_mode("TETHER_SOCKET_MODE", mode).map_err(bad)?;
            self.socket_mode = mode;
        }
        if let Some(group) = get("TETHER_SOCKET_GROUP") {
            check_group("TETHER_SOCKET_GROUP", &group).map_err(bad)?;
            self.socket_group = Some(group);
        }
        if let Some(group) = get("TETHER_READERS_GROUP") {
            check_group("TETHER_READERS_GROUP", &group).map_err(bad)?;
            self.readers_group = Some(group);
        }
        if let Some(v) = get("TETHER_RETENTION_MAX_FRAMES") {
            let n = number("TETHER_RETENTION_MAX_FRAMES", &v)?;
            set_limit(&mut self.retention.max_frames, Some(n));
        }
        if let Some(v) = get("TETHER_RETENTION_MAX_BYTES") {
            let n = number("TETHER_RETENTION_MAX_BYTES", &v)?;
            set_limit(&mut self.retention.max_bytes, Some(n));
        }
        if let Some(v) = get("TETHER_RETENTION_MAX_AGE") {
            let age = parse_duration(&v).map_err(|e| fail("TETHER_RETENTION_MAX_AGE", e))?;
            self.retention.max_age = (!age.is_zero()).then_some(age);
        }
        if let Some(v) = get("TETHER_LOG_FORMAT") {
            self.log_format = match v.as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                _ => {
                    return Err(fail(
                        "TETHER_LOG_FORMAT",
                        format!("{v:?} is not a log format (text or json)"),
                    ))
                }
            };
        }
        if let Some(v) = get("TETHER_LOG_CAPACITY") {
            let n = number("TETHER_LOG_CAPACITY", &v)?;
            check_log_capacity("TETHER_LOG_CAPACITY", n).map_err(bad)?;
            self.log_capacity = n;
        }
        if let Some(v) = get("TETHER_MAX_RESTARTS") {
            let n = number("TETHER_MAX_RESTARTS", &v)?;
            let n = u32::try_from(n)
                .map_err(|_| fail("TETHER_MAX_RESTARTS", format!("{n} is too large")))?;
            self.default_max_restarts = Some(n);
        }
        Ok(())
    }

    /// The keys whose value differs between `self` (running) and `new` (just
    /// reloaded) and that only take effect after a restart. Retention and
    /// the log level are applied live and are not listed.
    pub fn needs_restart(&self, new: &Config) -> Vec<&'static str> {
        let mut keys = Vec::new();
        let mut differs = |key: &'static str, changed: bool| {
            if changed {
                keys.push(key);
            }
        };
        differs("socket path", self.socket != new.socket);
        differs("state directory", self.state_dir != new.state_dir);
        differs("max_frame_len", self.max_frame_len != new.max_frame_len);
        differs(
            "max_connections",
            self.max_connections != new.max_connections,
        );
        differs(
            "max_connections_per_uid",
            self.max_connections_per_uid != new.max_connections_per_uid,
        );
        differs(
            "max_partial_bytes",
            self.max_partial_bytes != new.max_partial_bytes,
        );
        differs("socket.mode", self.socket_mode != new.socket_mode);
        differs("socket.group", self.socket_group != new.socket_group);
        differs("access.readers", self.readers_group != new.readers_group);
        differs("access.answerers", self.answerers != new.answerers);
        differs(
            "inbox.max_messages",
            self.inbox_max_messages != new.inbox_max_messages,
        );
        differs(
            "restart.max_restarts",
            self.default_max_restarts != new.default_max_restarts,
        );
        differs(
            "restart.max_failures_without_progress",
            self.default_max_failures_without_progress != new.default_max_failures_without_progress,
        );
        differs("shim", self.shim != new.shim);
        differs("log_capacity", self.log_capacity != new.log_capacity);
        differs(
            "checkpoint_keep",
            self.checkpoint_keep != new.checkpoint_keep,
        );
        differs(
            "max_checkpoint_bytes",
            self.max_checkpoint_bytes != new.max_checkpoint_bytes,
        );
        differs("log_format", self.log_format != new.log_format);
        differs("executions.keep_ended", self.keep_ended != new.keep_ended);
        differs(
            "metrics.streams",
            self.metrics.streams != new.metrics.streams,
        );
        differs("metrics.listen", self.metrics.listen != new.metrics.listen);
        keys
    }
}

/// A retention limit where 0 means "no limit"; `None` leaves it as is.
fn set_limit(limit: &mut Option<u64>, value: Option<u64>) {
    if let Some(n) = value {
        *limit = (n > 0).then_some(n);
    }
}

/// Parses the decimal value of environment variable `name`.
fn number(name: &str, value: &str) -> Result<u64> {
    value.trim().parse().map_err(|_| {
        Error::Config(format!(
            "${name}: {value:?} is not a non-negative whole number"
        ))
    })
}

fn check_log_level(key: &str, level: &str) -> std::result::Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(level)
        .map(drop)
        .map_err(|e| {
            format!("{key}: {level:?} is not a log filter (try \"info\" or \"debug\"): {e}")
        })
}

fn check_frame_len(key: &str, n: u64) -> std::result::Result<(), String> {
    if (MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&n) {
        Ok(())
    } else {
        Err(format!(
            "{key}: {n} is out of range ({MIN_FRAME_LEN} to {MAX_FRAME_LEN} bytes)"
        ))
    }
}

fn check_log_capacity(key: &str, n: u64) -> std::result::Result<(), String> {
    if n < MIN_LOG_CAPACITY {
        return Err(format!(
            "{key} = {n}: the log needs at least {MIN_LOG_CAPACITY} bytes"
        ));
    }
    Ok(())
}

fn check_partial_bytes(key: &str, n: u64) -> std::result::Result<(), String> {
    if n < MIN_PARTIAL_BYTES {
        return Err(format!(
            "{key} = {n}: must be at least {MIN_PARTIAL_BYTES} bytes"
        ));
    }
    Ok(())
}

fn check_connections(key: &str, n: u64) -> std::result::Result<(), String> {
    if n == 0 {
        Err(format!("{key}: must be at least 1"))
    } else {
        Ok(())
    }
}

fn check_mode(key: &str, mode: u32) -> std::result::Result<(), String> {
    if mode > 0o777 {
        return Err(format!(
            "{key}: {mode:#o} is not a permission mode; write it in octal, e.g. 0o660"
        ));
    }
    // The daemon's own user must keep access, or the shims it starts (which
    // run as that user) could not reach it.
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "{key}: {mode:#o} takes read and write away from the daemon's own user"
        ));
    }
    Ok(())
}

fn check_group(key: &str, group: &str) -> std::result::Result<(), String> {
    if group.is_empty() || group.contains([':', '\n', '/']) {
        Err(format!("{key}: {group:?} is not a group name or gid"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeSet;

    use super::*;

    fn parse(text: &str) -> Result<FileConfig> {
        FileConfig::parse(text, Path::new("/etc/tether/tetherd.toml"))
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name: &str| {
            owned
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn base() -> Config {
        Config::new("/s".into(), "/st".into())
    }

    #[test]
    fn the_shipped_sample_parses_and_changes_no_default() {
        let sample = include_str!("../../../systemd/tetherd.toml");
        let file = parse(sample).unwrap();
        let mut config = base();
        config.apply_file(&file);
        assert_eq!(format!("{config:?}"), format!("{:?}", base()));
    }

    /// The names a struct accepts, read from its own "unknown field" error
    /// for `text`; `None` when `text` fails for another reason.
    fn fields_named_by(text: &str) -> Option<Vec<String>> {
        let err = toml::from_str::<FileConfig>(text).unwrap_err().to_string();
        let (_, list) = err.split_once("unknown field `__probe`, expected")?;
        let list = list.lines().next().unwrap_or("");
        Some(
            list.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Every key the config structs accept, as `key` or `section.key`.
    fn accepted_keys() -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for key in fields_named_by("__probe = 1").unwrap() {
            match fields_named_by(&format!("[{key}]\n__probe = 1\n")) {
                Some(fields) => keys.extend(fields.iter().map(|f| format!("{key}.{f}"))),
                None => {
                    keys.insert(key);
                }
            }
        }
        keys
    }

    /// Every key the sample sets or shows commented out.
    fn sample_keys(sample: &str) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        let mut section = String::new();
        for line in sample.lines() {
            let line = line.trim_start_matches('#').trim_start();
            if let Some(rest) = line.strip_prefix('[') {
                section = rest.split(']').next().unwrap().to_owned();
                continue;
            }
            let Some((key, _)) = line.split_once(" = ") else {
                continue;
            };
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.insert(if section.is_empty() {
                    key.to_owned()
                } else {
                    format!("{section}.{key}")
                });
            }
        }
        keys
    }

    #[test]
    fn the_shipped_sample_lists_every_key_and_no_other() {
        let accepted = accepted_keys();
        // A sanity check of the probing itself.
        assert!(accepted.contains("retention.max_frames"), "{accepted:?}");
        assert!(accepted.contains("log_level"), "{accepted:?}");
        let sample = sample_keys(include_str!("../../../systemd/tetherd.toml"));
        // An older name still read is not listed again.
        let accepted: BTreeSet<String> = accepted
            .into_iter()
            .filter(|k| k != "retention.max_age_secs")
            .collect();
        let missing: Vec<_> = accepted.difference(&sample).collect();
        assert!(missing.is_empty(), "the sample lacks {missing:?}");
        let unknown: Vec<_> = sample.difference(&accepted).collect();
        assert!(
            unknown.is_empty(),
            "the sample has keys no struct reads: {unknown:?}"
        );
    }

    #[test]
    fn durations_take_units_and_bare_seconds() {
        let age = |text: &str| {
            let mut config = base();
            config.apply_file(&parse(text).unwrap());
            config.retention.max_age
        };
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(age("[retention]\nmax_age = \"30d\"\n"), Some(30 * day));
        assert_eq!(age("[retention]\nmax_age = \"12h\"\n"), Some(day / 2));
        assert_eq!(
            age("[retention]\nmax_age = 60\n"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            age("[retention]\nmax_age_secs = 60\n"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(age("[retention]\nmax_age = \"0s\"\n"), None);
        let err = parse("[retention]\nmax_age = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_age") && err.contains("soon"), "{err}");
    }

    #[test]
    fn a_full_file_sets_every_key() {
        let file = parse(
            r#"
            log_level = "debug"
            max_frame_len = 65536
            max_connections = 10
            max_connections_per_uid = 2
            max_partial_bytes = 8388608
            log_capacity = 1048576
            [socket]
            mode = 0o660
            group = "tether"
            [access]
            readers = "tether-readers"
            [retention]
            max_frames = 100
            max_bytes = 0
            max_age_secs = 60
            [restart]
            max_restarts = 5
            max_failures_without_progress = 7
            [metrics]
            streams = ["a-*"]
            listen = "127.0.0.1:9464"
            "#,
        )
        .unwrap();
        let mut config = base();
        config.apply_file(&file);
        assert_eq!(config.log_level, "debug");
        assert_eq!(config.max_frame_len, 65536);
        assert_eq!(config.max_connections, 10);
        assert_eq!(config.max_connections_per_uid, Some(2));
        assert_eq!(config.max_partial_bytes, 8 << 20);
        assert_eq!(config.socket_mode, 0o660);
        assert_eq!(config.socket_group.as_deref(), Some("tether"));
        assert_eq!(config.readers_group.as_deref(), Some("tether-readers"));
        assert_eq!(config.retention.max_frames, Some(100));
        assert_eq!(config.retention.max_bytes, None, "0 means no limit");
        assert_eq!(config.retention.max_age, Some(Duration::from_secs(60)));
        assert_eq!(config.default_max_restarts, Some(5));
        assert_eq!(config.default_max_failures_without_progress, Some(7));
        assert_eq!(config.log_capacity, 1024 * 1024);
        assert_eq!(config.metrics.streams, vec!["a-*".to_owned()]);
        assert_eq!(
            config.metrics.listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
    }

    #[test]
    fn an_empty_file_changes_nothing() {
        let mut config = base();
        config.apply_file(&parse("").unwrap());
        assert_eq!(config.retention, base().retention);
        assert_eq!(config.log_level, super::super::DEFAULT_LOG_LEVEL);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("[retention]\nmax_frame = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_frame"), "{err}");
        assert!(err.contains("/etc/tether/tetherd.toml"), "{err}");
        let err = parse("colour = 1\n").unwrap_err().to_string();
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = parse("max_connections = 0\n").unwrap_err().to_string();
        assert!(err.contains("max_connections"), "{err}");
        let err = parse("max_connections_per_uid = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_connections_per_uid"), "{err}");
        let err = parse("[socket]\nmode = 660\n").unwrap_err().to_string();
        assert!(err.contains("socket.mode"), "{err}");
        let err = parse("log_capacity = 4096\n").unwrap_err().to_string();
        assert!(
            err.contains("log_capacity = 4096") && err.contains("65536"),
            "{err}"
        );
        let err = parse("max_partial_bytes = 1000\n").unwrap_err().to_string();
        assert!(
            err.contains("max_partial_bytes = 1000") && err.contains("1048576"),
            "{err}"
        );
        let err = parse("log_level = \"loud=[\"\n").unwrap_err().to_string();
        assert!(err.contains("log_level"), "{err}");
        let err = parse("[retention]\nmax_frames = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_frames"), "{err}");
    }

    #[test]
    fn environment_overrides_and_names_bad_variables() {
        let var = env_of(&[
            ("TETHER_RETENTION_MAX_FRAMES", "7"),
            ("TETHER_SOCKET_MODE", "0660"),
            ("TETHER_MAX_RESTARTS", "3"),
            ("TETHER_MAX_CONNECTIONS_PER_UID", "5"),
            ("TETHER_MAX_PARTIAL_BYTES", "2097152"),
        ]);
        let mut config = base();
        config
            .apply_env(Env {
                var: &var,
                uid: 1000,
            })
            .unwrap();
        assert_eq!(config.retention.max_frames, Some(7));
        assert_eq!(config.socket_mode, 0o660);
        assert_eq!(config.default_max_restarts, Some(3));
        assert_eq!(config.max_connections_per_uid, Some(5));
        assert_eq!(config.max_partial_bytes, 2 << 20);

        let var = env_of(&[("TETHER_RETENTION_MAX_BYTES", "lots")]);
        let err = base()
            .apply_env(Env {
                var: &var,
                uid: 1000,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("TETHER_RETENTION_MAX_BYTES"), "{err}");
    }

    #[test]
    fn config_dir_follows_systemd_then_root_then_xdg() {
        let dir = |vars: &[(&str, &str)], uid| {
            let var = env_of(vars);
            config_dir(Env { var: &var, uid })
        };
        assert_eq!(
            dir(&[("CONFIGURATION_DIRECTORY", "/etc/t:/x")], 0),
            Some(PathBuf::from("/etc/t"))
        );
        assert_eq!(dir(&[], 0), Some(PathBuf::from("/etc/tether")));
        assert_eq!(
            dir(&[("XDG_CONFIG_HOME", "/c"), ("HOME", "/h")], 7),
            Some(PathBuf::from("/c/tether"))
        );
        assert_eq!(
            dir(&[("HOME", "/h")], 7),
            Some(PathBuf::from("/h/.config/tether"))
        );
        assert_eq!(dir(&[], 7), None);
    }

    #[test]
    fn a_missing_default_file_is_fine_but_a_named_one_is_not() {
        let path = PathBuf::from("/nonexistent/tetherd.toml");
        let default = ConfigSource {
            path: path.clone(),
            explicit: false,
        };
        assert_eq!(default.load().unwrap(), FileConfig::default());
        let named = ConfigSource {
            path,
            explicit: true,
        };
        let err = named.load().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tetherd.toml"), "{err}");
    }

    #[test]
    fn only_changes_that_cannot_apply_live_need_a_restart() {
        let old = base();
        let mut new = base();
        new.retention.max_frames = Some(1);
        new.log_level = "debug".into();
        assert!(old.needs_restart(&new).is_empty());
        new.max_connections = 1;
        assert_eq!(old.needs_restart(&new), vec!["max_connections"]);
    }
}
