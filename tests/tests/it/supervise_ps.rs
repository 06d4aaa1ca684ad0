//! `tether ps` lists the executions that have not ended (`--all`: every
//! one), execution ids are `<name or program>-<6 base32 chars>`, and
//! `tether status` counts executions.

use std::time::Duration;

use serde_json::Value;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The ids listed by `tether ps --json ARGS...`.
fn listed(sup: &Supervised, args: &[&str]) -> Vec<String> {
    let mut full = vec!["ps", "--json"];
    full.extend_from_slice(args);
    let out = sup.sb().run(&full);
    out.assert_success();
    out.stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Asserts `id` is `prefix-` followed by six lowercase base32 characters.
fn assert_id_shape(id: &str, prefix: &str) {
    let suffix = id
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .unwrap_or_else(|| panic!("id {id:?} does not start with {prefix:?}-"));
    assert!(
        suffix.len() == 6 && suffix.chars().all(|c| matches!(c, 'a'..='z' | '2'..='7')),
        "id {id:?} does not end in 6 lowercase base32 characters"
    );
}

#[test]
fn ps_lists_live_executions_all_lists_ended_ones_and_status_counts_them() {
    let sup = Supervised::start();
    let named = sup.run(&["--name", "agent", "--", "sleep", "300"]);
    let ended = sup.run(&["--", "/bin/true"]);
    assert_id_shape(&named, "agent");
    assert_id_shape(&ended, "true");
    sup.wait_running(&named, TIMEOUT);
    let info = sup.wait_state(&ended, "completed", TIMEOUT);
    assert_eq!(info["name"], Value::Null, "{info}");

    assert_eq!(listed(&sup, &[]), [named.as_str()]);
    let mut all = listed(&sup, &["--all"]);
    all.sort();
    let mut want = vec![named.clone(), ended.clone()];
    want.sort();
    assert_eq!(all, want);
    assert_eq!(sup.info(&named)["name"], "agent");

    let out = sup.sb().run(&["status", "--json"]);
    out.assert_success();
    let status: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(status["executions"], 2, "{status}");

    // The table has one row per live execution, under a header.
    let out = sup.sb().run(&["ps"]);
    out.assert_success();
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    assert!(rows[0].starts_with("ID"), "{}", out.stdout);
    assert!(
        rows[1].starts_with(&named) && rows[1].contains("running"),
        "{}",
        out.stdout
    );
}
