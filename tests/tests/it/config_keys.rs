//! Every `tetherd` flag has a config key: a daemon started with the config
//! file alone takes its socket and state directory from it, and
//! durations there take units.

use std::process::{Command, Stdio};

use tether_tests::{bins, Sandbox};

use crate::systemd_support::Tetherd;

#[test]
fn the_socket_and_state_directory_come_from_the_config_file() {
    let sb = Sandbox::new();
    let file = sb.file("tetherd.toml");
    std::fs::write(
        &file,
        format!(
            "state_dir = {:?}\nlog_format = \"json\"\n[socket]\npath = {:?}\n\
             [retention]\nmax_age = \"12h\"\n",
            sb.state_dir(),
            sb.socket()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bins::tetherd());
    cmd.arg("--config").arg(&file);
    for var in [
        "TETHER_SOCKET",
        "TETHER_STATE_DIR",
        "RUNTIME_DIRECTORY",
        "STATE_DIRECTORY",
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "TETHER_LOG",
    ] {
        cmd.env_remove(var);
    }
    let log = std::fs::File::create(sb.file("d.log")).unwrap();
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    let daemon = Tetherd::start(cmd, &sb, "d.log");
    assert!(sb.state_dir().join("tether.redb").exists());
    let first = daemon.log();
    let first = first.lines().next().unwrap_or_default();
    let line: serde_json::Value = serde_json::from_str(first).unwrap();
    assert_eq!(
        line["fields"]["state_dir"].as_str(),
        sb.state_dir().to_str(),
        "{first}"
    );
    sb.publish("s", "x\n");
    let out = sb.run(&["tail", "s"]);
    out.assert_success();
    assert_eq!(out.stdout, "x\n");
}
