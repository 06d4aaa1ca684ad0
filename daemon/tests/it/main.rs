//! The daemon's integration tests, linked as one binary: the library driven
//! in-process (`engine_*` the queue, `checkpoint_*` checkpoints,
//! `supervisor_*` and `notify_run` a whole daemon), the store under injected
//! faults (`storage_faults`), and the `tetherd` binary's command line
//! (`cli`).
//!
//! The tests use the crate's `test-hooks` feature (damaging a store file,
//! injecting storage faults); `Cargo.toml` turns it on for them through the
//! crate's dev-dependency on itself. The harness the supervisor and
//! checkpoint tests share lives in `support`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod checkpoint_log;
mod checkpoint_resume;
mod checkpoint_store;
mod cli;
mod engine_follow;
mod engine_model;
mod engine_store;
mod gates;
mod notify_run;
mod storage_faults;
mod supervisor_lifecycle;
mod supervisor_records;
mod support;
