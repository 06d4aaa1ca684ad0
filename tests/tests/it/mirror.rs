//! The NATS JetStream mirror: every committed frame of the mirrored
//! streams lands in JetStream exactly once, in seq order, with its
//! headers, across `kill -9` of the daemon and a restart of nats-server;
//! daemons of different sources share one JetStream stream; producers go
//! on while NATS is away; compaction waits for the mirror.
//!
//! Each test starts its own `nats-server -js` on a free port with its own
//! store directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tether_tests::text::{line, lines};
use tether_tests::wait::wait_until;
use tether_tests::{Background, Daemon, Sandbox, Signal};
use tetherd::mirror::read_back::{read_all, Held};

/// How long the mirror may take to catch up: debug builds on a loaded
/// two-core machine, through NATS's own reconnect delays.
const CATCH_UP: Duration = Duration::from_secs(180);

/// A `nats-server -js` of one test, on a port of its own.
struct Nats {
    port: u16,
    dir: PathBuf,
    server: Option<Background>,
    starts: u32,
}

impl Nats {
    /// Picks a free port; starts the server when `start`.
    fn new(sb: &Sandbox, start: bool) -> Nats {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("cannot find a free port: {e}"));
        let mut nats = Nats {
            port,
            dir: sb.file("nats"),
            server: None,
            starts: 0,
        };
        if start {
            nats.start();
        }
        nats
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server on the same port and store, and waits until it
    /// accepts connections.
    fn start(&mut self) {
        assert!(self.server.is_none(), "nats-server is already running");
        self.starts += 1;
        let mut cmd = Command::new("nats-server");
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-sd",
        ])
        .arg(&self.dir);
        let parent = self.dir.parent().unwrap_or(Path::new("/"));
        let name = format!("nats-{}", self.starts);
        self.server = Some(Background::spawn(&name, cmd, parent));
        let port = self.port;
        wait_until(Duration::from_secs(30), "nats-server to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Stops the server (SIGTERM: its store stays) and waits for it.
    fn stop(&mut self) {
        let mut server = self.server.take().expect("nats-server is not running");
        server.signal(Signal::Term);
        server.wait(Duration::from_secs(30));
    }

    /// Every message of the JetStream stream `TETHER`.
    fn read(&self) -> Vec<Held> {
        read_all(&self.url(), "TETHER").unwrap_or_else(|e| panic!("reading JetStream: {e}"))
    }
}

/// Writes a config mirroring `globs` (all when empty) to `nats` as
/// `source`, and returns its path.
fn mirror_config(sb: &Sandbox, name: &str, nats: &Nats, source: &str, globs: &[&str]) -> PathBuf {
    let path = sb.file(name);
    let mut text = format!(
        "[mirror]\nnats_url = \"{}\"\nsource = \"{source}\"\n",
        nats.url()
    );
    if !globs.is_empty() {
        let quoted: Vec<String> = globs.iter().map(|g| format!("{g:?}")).collect();
        text.push_str(&format!("streams = [{}]\n", quoted.join(", ")));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// A daemon of `sb` started with the config file `config`.
fn start_daemon(sb: &Sandbox, config: &Path) -> Daemon {
    sb.start_daemon_with_env(&[("TETHER_CONFIG", config.to_str().unwrap())])
}

/// `tether --json status`'s `mirror` part.
fn mirror_status(sb: &Sandbox) -> serde_json::Value {
    let out = sb.run(&["--json", "status"]);
    out.assert_success();
    let status: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("status is not JSON: {e}: {}", out.stdout));
    status["mirror"].clone()
}

/// `(mirrored_seq, last_seq)` of `stream` in the mirror's status.
fn mirrored(sb: &Sandbox, stream: &str) -> Option<(u64, u64)> {
    let mirror = mirror_status(sb);
    let row = mirror["streams"]
        .as_array()?
        .iter()
        .find(|s| s["stream"] == stream)?
        .clone();
    Some((row["mirrored_seq"].as_u64()?, row["last_seq"].as_u64()?))
}

/// Waits until JetStream has acknowledged `stream` through `seq`.
fn wait_mirrored(sb: &Sandbox, stream: &str, seq: u64) {
    wait_until(
        CATCH_UP,
        &format!("the mirror of {stream} to reach {seq}"),
        || mirrored(sb, stream) == Some((seq, seq)),
    );
}

/// The header `name` of `message`.
fn header<'a>(message: &'a Held, name: &str) -> &'a str {
    message
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} header on {message:?}"))
}

/// Asserts that `subject` holds frames 1..=`count` of `stream` from
/// `source`, each once, in order, with the right headers.
fn assert_exactly_once(held: &[Held], subject: &str, source: &str, stream: &str, count: u64) {
    let on_subject: Vec<&Held> = held.iter().filter(|m| m.subject == subject).collect();
    let seqs: Vec<u64> = on_subject
        .iter()
        .map(|m| header(m, "Tether-Seq").parse().unwrap())
        .collect();
    let expected: Vec<u64> = (1..=count).collect();
    if seqs != expected {
        let extra = seqs.len() as i64 - count as i64;
        let at = seqs
            .iter()
            .zip(&expected)
            .position(|(a, b)| a != b)
            .unwrap_or(seqs.len().min(expected.len()));
        panic!(
            "{subject}: {} messages ({extra:+} against {count}); from index {at}: {:?}",
            seqs.len(),
            &seqs[at.saturating_sub(2)..(at + 4).min(seqs.len())]
        );
    }
    for (message, seq) in on_subject.iter().zip(1..) {
        assert_eq!(
            String::from_utf8_lossy(&message.payload),
            line(seq).trim_end(),
            "{subject} seq {seq}"
        );
        assert_eq!(
            header(message, "Nats-Msg-Id"),
            format!("{source}:{stream}:{seq}")
        );
        assert_eq!(header(message, "Tether-Kind"), "data");
        let ts: u64 = header(message, "Tether-Ts").parse().unwrap();
        assert!(
            ts > 1_600_000_000_000_000,
            "Tether-Ts {ts} is not in microseconds"
        );
    }
}

#[test]
fn frames_reach_jetstream_exactly_once_across_crashes_and_a_nats_restart() {
    let sb = Sandbox::new();
    let mut nats = Nats::new(&sb, true);
    let config = mirror_config(&sb, "tetherd.toml", &nats, "host-a", &[]);
    let mut daemon = start_daemon(&sb, &config);
    let streams = ["jobs", "a.b"];
    let publish = |from: u64, to: u64| {
        for stream in streams {
            sb.publish(stream, &lines(from..=to));
        }
    };

    publish(1, 4000);
    daemon.kill9();
    daemon.restart();
    publish(4001, 8000);
    nats.stop();
    nats.start();
    publish(8001, 10_000);
    daemon.kill9();
    daemon.restart();
    publish(10_001, 12_500);

    for stream in streams {
        wait_mirrored(&sb, stream, 12_500);
    }
    let held = nats.read();
    assert_exactly_once(&held, "tether.host-a.jobs", "host-a", "jobs", 12_500);
    assert_exactly_once(&held, "tether.host-a.a%2Eb", "host-a", "a.b", 12_500);
    assert_eq!(held.len(), 25_000, "JetStream holds nothing else");
}

#[test]
fn two_daemons_of_different_sources_share_one_jetstream_stream() {
    let sb_a = Sandbox::new();
    let sb_b = Sandbox::new();
    let nats = Nats::new(&sb_a, true);
    let config_a = mirror_config(&sb_a, "a.toml", &nats, "host-a", &["jobs"]);
    let config_b = mirror_config(&sb_b, "b.toml", &nats, "host-b", &["jobs"]);
    let _a = start_daemon(&sb_a, &config_a);
    let _b = start_daemon(&sb_b, &config_b);
    sb_a.publish("jobs", &lines(1..=100));
    sb_b.publish("jobs", &lines(1..=150));
    sb_b.publish("not-mirrored", &lines(1..=10));
    wait_mirrored(&sb_a, "jobs", 100);
    wait_mirrored(&sb_b, "jobs", 150);
    assert_eq!(mirrored(&sb_b, "not-mirrored"), None);
    let held = nats.read();
    assert_eq!(held.len(), 250);
    assert_exactly_once(&held, "tether.host-a.jobs", "host-a", "jobs", 100);
    assert_exactly_once(&held, "tether.host-b.jobs", "host-b", "jobs", 150);
}

#[test]
fn producers_go_on_while_nats_is_down_and_the_mirror_catches_up() {
    let sb = Sandbox::new();
    let mut nats = Nats::new(&sb, true);
    let config = mirror_config(&sb, "tetherd.toml", &nats, "host-a", &[]);
    let daemon = start_daemon(&sb, &config);
    sb.publish("jobs", &lines(1..=100));
    wait_mirrored(&sb, "jobs", 100);

    nats.stop();
    // Publishing succeeds at once: the mirror holds nothing up.
    sb.publish("jobs", &lines(101..=1100));
    assert_eq!(mirrored(&sb, "jobs"), Some((100, 1100)));
    wait_until(CATCH_UP, "status to say NATS is unreachable", || {
        mirror_status(&sb)["connected"] == false
    });
    let metrics = sb.run(&["metrics"]);
    metrics.assert_success();
    assert!(
        metrics
            .stdout
            .contains("tether_mirror_lag_frames{stream=\"jobs\"} 1000\n"),
        "{}",
        metrics.stdout
    );
    let human = sb.run(&["status"]);
    human.assert_success();
    assert!(
        human.stdout.contains(&format!(
            "mirror:      {} (JetStream stream TETHER, source host-a): NATS unreachable\n  \
             jobs: lag 1000 (mirrored through 100 of 1100)\n",
            nats.url()
        )),
        "{}",
        human.stdout
    );

    nats.start();
    wait_mirrored(&sb, "jobs", 1100);
    assert_exactly_once(&nats.read(), "tether.host-a.jobs", "host-a", "jobs", 1100);
    let logs = daemon.logs();
    let warnings = logs.matches("is unreachable").count();
    assert_eq!(warnings, 1, "one warning per outage:\n{logs}");
}

/// `(first_seq, last_seq)` of `stream`, and its consumers' names.
fn stream_row(sb: &Sandbox, stream: &str) -> ((u64, u64), Vec<String>) {
    let out = sb.run(&["--json", "streams"]);
    out.assert_success();
    for row in out.stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(row).unwrap();
        if v["name"] == stream {
            let consumers = v["consumers"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|c| c["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let range = (
                v["first_seq"].as_u64().unwrap(),
                v["last_seq"].as_u64().unwrap(),
            );
            return (range, consumers);
        }
    }
    panic!("no stream {stream} in {}", out.stdout);
}

#[test]
fn compaction_waits_for_the_mirror() {
    let sb = Sandbox::new();
    let mut nats = Nats::new(&sb, false);
    let config = mirror_config(&sb, "tetherd.toml", &nats, "host-a", &["jobs"]);
    let _daemon = start_daemon(&sb, &config);
    sb.publish("jobs", &lines(1..=100));
    sb.publish("other", &lines(1..=100));
    wait_until(CATCH_UP, "the mirror's consumer on jobs", || {
        stream_row(&sb, "jobs")
            .1
            .contains(&"tether-mirror".to_owned())
    });
    for stream in ["jobs", "other"] {
        let out = sb.run(&["tail", stream, "--consumer", "c", "--count", "100"]);
        out.assert_success();
    }
    // The consumer acked "other" after "jobs"; once "other" is compacted,
    // "jobs" would have been too but for the mirror.
    wait_until(CATCH_UP, "compaction of the stream not mirrored", || {
        stream_row(&sb, "other").0 == (101, 100)
    });
    assert_eq!(stream_row(&sb, "jobs").0, (1, 100));

    nats.start();
    wait_mirrored(&sb, "jobs", 100);
    wait_until(CATCH_UP, "compaction of the mirrored frames", || {
        stream_row(&sb, "jobs").0 == (101, 100)
    });
    assert_exactly_once(&nats.read(), "tether.host-a.jobs", "host-a", "jobs", 100);
}

#[test]
fn a_reload_turns_the_mirror_on() {
    let sb = Sandbox::new();
    let nats = Nats::new(&sb, true);
    let config = sb.file("tetherd.toml");
    std::fs::write(&config, "").unwrap();
    let daemon = start_daemon(&sb, &config);
    sb.publish("jobs", &lines(1..=50));
    assert_eq!(mirror_status(&sb), serde_json::Value::Null);

    let mirrored_config = mirror_config(&sb, "mirror.toml", &nats, "host-a", &[]);
    std::fs::copy(&mirrored_config, &config).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success(), "kill -HUP failed");
    wait_mirrored(&sb, "jobs", 50);
    assert_exactly_once(&nats.read(), "tether.host-a.jobs", "host-a", "jobs", 50);
}
