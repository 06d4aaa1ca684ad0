//! Wherever an execution id is accepted (ps, stop, checkpoint, step,
//! attach, wait, tail) its `--name` is too: the live
//! execution with that name, else the newest ended one, an exact id
//! winning. `run --name N` is refused while a live execution is named N,
//! also when several runs race for it.

use std::time::Duration;

use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);
const SLEEPER: &str = "echo up; exec sleep 300";

fn ps_id(sup: &Supervised, key: &str) -> String {
    sup.info(key)["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_name_works_in_ps_stop_checkpoint_and_step() {
    let sup = Supervised::start();
    let web = sup.run_sh(&["--name", "web"], SLEEPER);
    sup.wait_running(&web, TIMEOUT);
    assert_eq!(ps_id(&sup, "web"), web);

    let sb = sup.sb();
    sb.run_with_stdin(&["checkpoint", "save", "--execution", "web"], b"state-1")
        .assert_success();
    let loaded = sb.run(&["checkpoint", "load", "--execution", &web]);
    loaded.assert_success();
    assert_eq!(loaded.stdout, "state-1");
    let listed = sb.run(&["checkpoint", "list", "web", "--json"]);
    listed.assert_success();
    assert_eq!(listed.stdout.lines().count(), 1, "{}", listed.stdout);

    let put = sb.run_with_stdin(&["step", "put", "s1", "--execution", "web"], b"done");
    put.assert_success();
    let got = sb.run(&["step", "get", "s1", "--execution", &web]);
    got.assert_success();
    assert_eq!(got.stdout, "done");

    let stopped = sb.run(&["stop", "web", "--timeout", "5s"]);
    stopped.assert_success();
    assert_eq!(stopped.stdout, "cancelled\n");
    assert_eq!(sup.info(&web)["state"], "cancelled");
    // Stopped by SIGTERM: 128 + 15, by name as by id.
    sb.run(&["wait", "web"]).assert_code(143);
    let attached = sb.run(&["attach", "web"]);
    attached.assert_code(143);
    assert_eq!(attached.stdout, "up\n");
    let tailed = sb.run(&["tail", "web"]);
    tailed.assert_success();
    assert_eq!(tailed.stdout, "up\n");
}

#[test]
fn the_live_execution_wins_then_the_newest_ended_one() {
    let sup = Supervised::start();
    let first = sup.run_sh(&["--name", "job", "--restart", "never"], "exit 0");
    sup.wait_state(&first, "completed", TIMEOUT);
    let second = sup.run_sh(&["--name", "job", "--restart", "never"], "exit 0");
    sup.wait_state(&second, "completed", TIMEOUT);
    assert_eq!(ps_id(&sup, "job"), second);

    let live = sup.run_sh(&["--name", "job"], SLEEPER);
    sup.wait_running(&live, TIMEOUT);
    assert_eq!(ps_id(&sup, "job"), live);

    // An id matching exactly wins over a name.
    let impostor = sup.run_sh(&["--name", &first], SLEEPER);
    sup.wait_running(&impostor, TIMEOUT);
    assert_eq!(ps_id(&sup, &first), first);
    sup.sb().run(&["ps", "no-such-name"]).assert_code(3);
}

#[test]
fn a_run_with_the_name_of_a_live_execution_is_refused() {
    let sup = Supervised::start();
    let web = sup.run_sh(&["--name", "web"], SLEEPER);
    sup.wait_running(&web, TIMEOUT);
    let out = sup.sb().run(&["run", "--name", "web", "--", "true"]);
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "execution {web} is already running with the name \"web\""
        )),
        "{}",
        out.stderr
    );
    sup.sb()
        .run(&["stop", "web", "--timeout", "5s"])
        .assert_success();
    // Once it has ended, the name is free again.
    let again = sup.run_sh(&["--name", "web"], SLEEPER);
    assert_ne!(again, web);
}

#[test]
fn of_four_runs_racing_for_a_name_one_starts() {
    let sup = Supervised::start();
    let racers: Vec<_> = (0..4)
        .map(|i| {
            sup.sb().spawn(
                &format!("racer-{i}"),
                &["run", "--name", "race", "--", "sleep", "300"],
            )
        })
        .collect();
    let mut codes = Vec::new();
    let mut refusals = 0;
    for mut racer in racers {
        let status = racer.wait(TIMEOUT);
        codes.push(status.code());
        if racer
            .stderr()
            .contains("already running with the name \"race\"")
        {
            refusals += 1;
        }
    }
    codes.sort();
    assert_eq!(codes, [Some(0), Some(1), Some(1), Some(1)]);
    assert_eq!(refusals, 3);
    let out = sup.sb().run(&["ps", "--json"]);
    let named = out
        .stdout
        .lines()
        .filter(|l| l.contains("\"name\":\"race\""))
        .count();
    assert_eq!(named, 1, "{}", out.stdout);
}
