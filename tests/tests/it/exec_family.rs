//! Labels and parents: `run --label`, `--parent` (the worker gets
//! `TETHER_PARENT_ID`), `ps --label` filtering, `ps --json` showing
//! labels, parent and children, and `stop --recursive` stopping the
//! descendants first, deepest generation first.

use std::time::Duration;

use serde_json::{json, Value};
use tether_tests::supervise::{find_event, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

fn ps_ids(sup: &Supervised, args: &[&str]) -> Vec<String> {
    let mut full = vec!["ps", "--json"];
    full.extend_from_slice(args);
    let out = sup.sb().run(&full);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            row["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Starts `p` (labels team=a, tier=1), its child `c` (team=a), which
/// prints its parent, and its grandchild `g`.
fn family(sup: &Supervised) {
    sup.run(&[
        "--id", "p", "--label", "team=a", "--label", "tier=1", "--", "sleep", "1000",
    ]);
    sup.run(&[
        "--id",
        "c",
        "--parent",
        "p",
        "--label",
        "team=a",
        "--",
        "sh",
        "-c",
        "echo \"parent=$TETHER_PARENT_ID\"; exec sleep 1000",
    ]);
    sup.run(&["--id", "g", "--parent", "c", "--", "sleep", "1000"]);
    for id in ["p", "c", "g"] {
        sup.wait_running(id, TIMEOUT);
    }
}

#[test]
fn ps_shows_labels_parents_and_children_and_filters_by_label() {
    let sup = Supervised::start();
    family(&sup);
    sup.wait_line("c", "parent=p", TIMEOUT);

    let p = sup.info("p");
    assert_eq!(p["labels"], json!({"team": "a", "tier": "1"}), "{p}");
    assert_eq!(p["parent"], Value::Null, "{p}");
    assert_eq!(p["children"], json!(["c"]), "{p}");
    let c = sup.info("c");
    assert_eq!(c["labels"], json!({"team": "a"}), "{c}");
    assert_eq!(c["parent"], "p", "{c}");
    assert_eq!(c["children"], json!(["g"]), "{c}");
    let g = sup.info("g");
    assert_eq!(g["labels"], json!({}), "{g}");
    assert_eq!(
        (g["parent"].as_str(), &g["children"]),
        (Some("c"), &json!([]))
    );

    assert_eq!(ps_ids(&sup, &["--label", "team=a"]), ["p", "c"]);
    assert_eq!(
        ps_ids(&sup, &["--label", "team=a", "--label", "tier=1"]),
        ["p"]
    );
    assert!(ps_ids(&sup, &["--label", "team=b"]).is_empty());

    let out = sup.sb().run(&["run", "--parent", "no-such", "--", "true"]);
    out.assert_code(3);
    assert!(out.stderr.contains("no-such"), "{}", out.stderr);
}

#[test]
fn stop_recursive_stops_the_descendants_deepest_first() {
    let sup = Supervised::start();
    family(&sup);
    sup.run(&["--id", "other", "--", "sleep", "1000"]);
    sup.wait_running("other", TIMEOUT);

    let out = sup
        .sb()
        .run(&["stop", "--recursive", "p", "--timeout", "5s"]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\ncancelled\ncancelled\n");
    for id in ["p", "c", "g"] {
        assert_eq!(sup.info(id)["state"], "cancelled", "{id}");
    }
    assert_eq!(sup.info("other")["state"], "running");
    // Each generation's stop ended before the next one's began.
    let cancelled_at = |id: &str| {
        let frames = sup.frames(id);
        find_event(&frames, 0, "cancelled")
            .unwrap_or_else(|| panic!("{id} has no cancelled event"))
            .1
            .ts_micros
    };
    let stopping_at = |id: &str| {
        let frames = sup.frames(id);
        find_event(&frames, 0, "stopping:")
            .unwrap_or_else(|| panic!("{id} has no stopping event"))
            .1
            .ts_micros
    };
    assert!(cancelled_at("g") <= stopping_at("c"));
    assert!(cancelled_at("c") <= stopping_at("p"));
}
