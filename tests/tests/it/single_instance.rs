//! One daemon per state directory: a second one refuses at once, names the
//! holder, and leaves the first one serving.

use std::fs::File;
use std::process::Stdio;
use std::time::Duration;

use tether_tests::daemon;
use tether_tests::process::{read_lossy, wait_timeout};
use tether_tests::text::lines;
use tether_tests::Sandbox;

#[test]
fn second_daemon_on_the_same_state_dir_exits_at_once_naming_the_holder() {
    let sb = Sandbox::new();
    let first = sb.start_daemon();
    sb.publish("kept", &lines(1..=3));

    // Same socket and state directory: what running `tetherd &` twice does.
    let log = sb.file("second.log");
    let mut cmd = daemon::command(&sb.socket(), &sb.state_dir());
    cmd.stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    let mut second = cmd.spawn().unwrap();
    let status = wait_timeout(&mut second, Duration::from_secs(10)).unwrap_or_else(|| {
        let _ = second.kill();
        let _ = second.wait();
        panic!("a second tetherd on the same state dir was still running after 10 s")
    });
    let stderr = read_lossy(&log);

    assert!(!status.success(), "the second tetherd exited with {status}");
    assert!(
        stderr.contains("in use"),
        "stderr does not say the state dir is in use: {stderr:?}"
    );
    assert!(
        stderr.contains(&first.pid().to_string()),
        "stderr does not name the holder's pid {}: {stderr:?}",
        first.pid()
    );

    // The first daemon, its socket and its data are untouched.
    sb.run(&["status"]).assert_success();
    let out = sb.run(&["tail", "kept"]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=3));
}
