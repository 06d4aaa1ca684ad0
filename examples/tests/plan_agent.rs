//! The example agent outside tether: it must refuse clearly rather than
//! run without anywhere to keep its progress. (Being an integration test of
//! this package also makes `cargo test` build the `plan-agent` binary that
//! the black-box tests run under a real daemon.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn outside_tether_the_agent_names_the_missing_variable_and_fails() {
    let out = Command::new(env!("CARGO_BIN_EXE_plan-agent"))
        .env_remove("TETHER_EXECUTION_ID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TETHER_EXECUTION_ID is not set"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
