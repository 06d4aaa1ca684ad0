//! `tether stop`: SIGTERM, then SIGKILL once the timeout has passed; the
//! execution ends `cancelled`, and stopping it again answers at once.

use std::time::Duration;

use tether_tests::procs;
use tether_tests::supervise::{assert_event_order, number, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn stop_kills_a_worker_that_ignores_sigterm_after_the_timeout() {
    let sup = Supervised::start();
    let id = sup.run(&[
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo ready; while :; do sleep 0.1; done",
    ]);
    let pid = sup.wait_running(&id, TIMEOUT);
    // Only once it has printed has the shell set up its trap.
    sup.wait_line(&id, "ready", TIMEOUT);

    let out = sup.sb().run(&["stop", &id, "--timeout", "1s"]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    assert!(
        out.elapsed >= Duration::from_secs(1),
        "stop returned after {:?}, before the 1 s timeout",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(20),
        "stop took {:?}",
        out.elapsed
    );
    assert!(
        procs::wait_gone(pid, Duration::from_secs(5)),
        "the worker (pid {pid}) survived `tether stop`"
    );

    let info = sup.info(&id);
    assert_eq!(info["state"], "cancelled", "{info}");
    assert!(info["pid"].is_null(), "{info}");
    assert_eq!(
        number(&info, "restarts"),
        0,
        "a stopped worker was restarted: {info}"
    );
    assert_event_order(&sup.frames(&id), &["started pid", "cancelled"]);

    // Stopping what has ended answers at once with its final state.
    let out = sup.sb().run(&["stop", &id, "--timeout", "1s"]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    assert!(
        out.elapsed < Duration::from_secs(1),
        "took {:?}",
        out.elapsed
    );
}

#[test]
fn stop_ends_an_obedient_worker_without_waiting_for_the_timeout() {
    let sup = Supervised::start();
    let id = sup.run(&["--", "sleep", "300"]);
    let pid = sup.wait_running(&id, TIMEOUT);

    // The default timeout is 10 s; SIGTERM alone must do it.
    let out = sup.sb().run(&["stop", &id]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "stop of a worker that obeys SIGTERM took {:?}",
        out.elapsed
    );
    assert!(procs::wait_gone(pid, Duration::from_secs(5)));
    let info = sup.info(&id);
    assert_eq!(info["state"], "cancelled", "{info}");
}

#[test]
fn stop_during_backoff_cancels_the_next_attempt() {
    let sup = Supervised::start();
    let id = sup.run(&["--", "sh", "-c", "exit 1"]);
    // After attempt 3 the backoff is 2 s (less jitter): time enough to stop
    // it before attempt 4.
    sup.wait_for(&id, "in backoff after attempt 3", TIMEOUT, |v| {
        v["state"] == "backoff" && v["attempt"] == 3
    });

    let out = sup.sb().run(&["stop", &id]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    assert!(
        out.elapsed < Duration::from_secs(1),
        "took {:?}",
        out.elapsed
    );
    std::thread::sleep(Duration::from_secs(2));
    let info = sup.info(&id);
    assert_eq!(info["state"], "cancelled", "{info}");
    assert_eq!(
        number(&info, "attempt"),
        3,
        "a cancelled execution went on: {info}"
    );
}

#[test]
fn stop_and_ps_of_an_unknown_execution_exit_3() {
    let sup = Supervised::start();
    for args in [
        &["stop", "nosuch"][..],
        &["ps", "nosuch"],
        &["ps", "--json", "nosuch"],
    ] {
        let out = sup.sb().run(args);
        out.assert_code(3);
        assert!(
            out.stderr.contains("nosuch"),
            "`tether {}` does not name the execution: {:?}",
            args.join(" "),
            out.stderr
        );
    }
}
