//! `tether apply FILE`: declared executions are started once, left alone
//! while their spec matches, listed when it differs (exit 1) and replaced
//! with `--replace`; a bad file exits 2 naming its line.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Two long-running workers, each appending its name to `starts` in the
/// file's directory when it starts. `web_echo` is what `web` prints first.
fn two(web_echo: &str) -> String {
    format!(
        r#"[[execution]]
id = "web"
cmd = ["sh", "-c", "echo {web_echo}; echo web >> starts; exec sleep 1000"]

[[execution]]
id = "worker"
cmd = ["sh", "-c", "echo worker >> starts; exec sleep 1000"]
env = {{ MODE = "fast" }}
labels = {{ team = "a" }}
restart = "always"
"#
    )
}

/// Writes `text` as `jobs.toml` in the sandbox and returns its path.
fn write(sup: &Supervised, text: &str) -> String {
    let path = sup.sb().file("jobs.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Every execution `ps --all --json` lists, by id, sorted.
fn all_ids(sup: &Supervised) -> Vec<String> {
    let out = sup.sb().run(&["ps", "--all", "--json"]);
    out.assert_success();
    let mut ids: Vec<String> = out
        .stdout
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            row["id"].as_str().unwrap().to_owned()
        })
        .collect();
    ids.sort();
    ids
}

/// The sorted lines of the `starts` file once it has `count` of them.
fn wait_starts(sup: &Supervised, count: usize) -> Vec<String> {
    let path: PathBuf = sup.sb().file("starts");
    let begin = Instant::now();
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= count || begin.elapsed() > TIMEOUT {
            lines.sort();
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn submitted(sup: &Supervised, id: &str) -> usize {
    let events = sup.events(id);
    events.iter().filter(|e| e.starts_with("submitted")).count()
}

#[test]
fn a_file_starts_what_is_missing_and_then_leaves_it_alone() {
    let sup = Supervised::start();
    let file = write(&sup, &two("v1"));
    let out = sup.sb().run(&["apply", &file]);
    out.assert_success();
    assert_eq!(out.stdout, "started web\nstarted worker\n");
    sup.wait_running("web", TIMEOUT);
    sup.wait_running("worker", TIMEOUT);
    assert_eq!(wait_starts(&sup, 2), ["web", "worker"]);

    // The declared spec is what was stored: the file's directory, only
    // the declared environment, the labels.
    let dir = std::fs::canonicalize(sup.sb().path()).unwrap();
    let worker = sup.info("worker");
    assert_eq!(worker["cwd"], dir.display().to_string(), "{worker}");
    assert_eq!(worker["env_keys"], serde_json::json!(["MODE"]), "{worker}");
    assert_eq!(
        worker["labels"],
        serde_json::json!({"team": "a"}),
        "{worker}"
    );
    assert_eq!(worker["restart"], "always", "{worker}");

    let again = sup.sb().run(&["apply", &file]);
    again.assert_success();
    assert_eq!(again.stdout, "unchanged web\nunchanged worker\n");
    assert_eq!(all_ids(&sup), ["web", "worker"]);
    for id in ["web", "worker"] {
        assert_eq!(sup.info(id)["attempt"], 1, "{id}");
        assert_eq!(submitted(&sup, id), 1, "{id}");
    }
    assert_eq!(wait_starts(&sup, 2), ["web", "worker"]);

    let json = sup.sb().run(&["apply", "--json", &file]);
    json.assert_success();
    assert_eq!(
        json.stdout,
        "{\"id\":\"web\",\"result\":\"unchanged\",\"fields\":[]}\n\
         {\"id\":\"worker\",\"result\":\"unchanged\",\"fields\":[]}\n"
    );
}

#[test]
fn a_changed_command_differs_until_it_is_replaced() {
    let sup = Supervised::start();
    let file = write(&sup, &two("v1"));
    sup.sb().run(&["apply", &file]).assert_success();
    sup.wait_line("web", "v1", TIMEOUT);
    let old_pid = sup.wait_running("web", TIMEOUT);

    write(&sup, &two("v2"));
    let out = sup.sb().run(&["apply", &file]);
    out.assert_code(1);
    assert_eq!(out.stdout, "differs web: cmd\nunchanged worker\n");
    assert_eq!(sup.info("web")["pid"], old_pid, "nothing was restarted");

    let replaced = sup.sb().run(&["apply", "--replace", &file]);
    replaced.assert_success();
    assert_eq!(replaced.stdout, "replaced web\nunchanged worker\n");
    sup.wait_line("web", "v2", TIMEOUT);
    let info = sup.wait_running("web", TIMEOUT);
    assert_ne!(info, old_pid);
    assert_eq!(all_ids(&sup), ["web", "worker"]);
    let web = sup.info("web");
    assert_eq!(
        web["command"][2].as_str().map(|c| c.contains("v2")),
        Some(true)
    );

    let after = sup.sb().run(&["apply", &file]);
    after.assert_success();
    assert_eq!(after.stdout, "unchanged web\nunchanged worker\n");
}

#[test]
fn a_bad_file_exits_2_naming_the_line_and_starts_nothing() {
    let sup = Supervised::start();
    let file = write(
        &sup,
        "[[execution]]\nid = \"a\"\ncmd = [\"true\"]\ncolour = \"red\"\n",
    );
    let out = sup.sb().run(&["apply", &file]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr
            .starts_with(&format!("tether: {file}:4: unknown field `colour`")),
        "{}",
        out.stderr
    );

    let file = write(
        &sup,
        "[[execution]]\nid = \"a\"\ncmd = [\"true\"]\n\n[[execution]]\nid = \"a\"\ncmd = [\"false\"]\n",
    );
    let out = sup.sb().run(&["apply", &file]);
    out.assert_code(2);
    assert_eq!(
        out.stderr,
        format!("tether: {file}:6: duplicate id \"a\" (first declared on line 2)\n")
    );
    assert!(all_ids(&sup).is_empty());
}

#[test]
fn concurrent_applies_start_each_execution_once() {
    let sup = Supervised::start();
    let file = write(&sup, &two("v1"));
    let sb = sup.sb();
    let file = file.as_str();
    let outputs: Vec<_> = std::thread::scope(|scope| {
        let applies: Vec<_> = (0..4)
            .map(|_| scope.spawn(move || sb.run(&["apply", file])))
            .collect();
        applies.into_iter().map(|a| a.join().unwrap()).collect()
    });
    for out in &outputs {
        out.assert_success();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{}", out.stdout);
        for (line, id) in lines.iter().zip(["web", "worker"]) {
            assert!(
                *line == format!("started {id}") || *line == format!("unchanged {id}"),
                "{}",
                out.stdout
            );
        }
    }
    sup.wait_running("web", TIMEOUT);
    sup.wait_running("worker", TIMEOUT);
    assert_eq!(all_ids(&sup), ["web", "worker"]);
    for id in ["web", "worker"] {
        assert_eq!(sup.info(id)["attempt"], 1, "{id}");
        assert_eq!(submitted(&sup, id), 1, "{id}");
    }
    assert_eq!(wait_starts(&sup, 2), ["web", "worker"]);
}
