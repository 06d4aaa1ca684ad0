//! A worker inherits no descriptor but stdin, stdout and stderr: not those
//! the daemon was started with, nor those its shim was started with.
//!
//! Guards against descriptors left open by the shell that started tetherd
//! (fds 10 and 251 here) reaching every worker through the shim.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tether_tests::supervise::Supervised;
use tether_tests::{bins, Sandbox};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The worker lists its own descriptors (`$$` is the shell's pid, not
/// `ls`'s).
const LIST_FDS: &str = "ls /proc/$$/fd";

/// The worker's stdout, a line per frame.
fn output(sup: &Supervised, id: &str) -> String {
    sup.stdout_lines(id)
        .iter()
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn a_worker_inherits_nothing_the_daemon_was_started_with() {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon_after_shell("exec 10</dev/null 251</dev/null");
    for fd in [10, 251] {
        let path = format!("/proc/{}/fd/{fd}", daemon.pid());
        assert!(Path::new(&path).exists(), "tetherd was not given fd {fd}");
    }
    let sup = Supervised::with(sb, daemon);
    let id = sup.run(&["--", "sh", "-c", LIST_FDS]);
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(output(&sup, &id), "0\n1\n2\n");
}

#[test]
fn a_worker_inherits_nothing_its_shim_was_started_with() {
    let sb = Sandbox::new();
    // A shim started with a descriptor of its own, as one started by
    // anything other than this tetherd may be.
    let shim = sb.file("shim-with-fd-9");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nexec 9</dev/null\nexec {} \"$@\"\n",
            bins::tether_shim().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = sb.start_daemon_with_env(&[("TETHER_SHIM", shim.to_str().unwrap())]);
    let sup = Supervised::with(sb, daemon);
    // The worker's parent is its shim: it shows the shim still holds fd 9.
    let script = format!("test -e /proc/$PPID/fd/9 && echo shim-has-9; {LIST_FDS}");
    let id = sup.run(&["--", "sh", "-c", &script]);
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(output(&sup, &id), "shim-has-9\n0\n1\n2\n");
}
