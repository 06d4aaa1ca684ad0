//! Black-box behaviour tests of `tetherd` and `tether`: real processes, real
//! unix sockets, real redb files. A crash is `kill -9`.
//!
//! Each module proves one behaviour of the product contract; the helpers
//! they share live in the `tether_tests` support library.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apply;
mod attach_wait;
mod bad_input;
mod checkpoint_agent;
mod checkpoint_boundary;
mod checkpoint_cli;
mod checkpoint_corruption;
mod checkpoint_durability;
mod checkpoint_log;
mod checkpoint_support;
mod clean_start;
mod compaction;
mod config_keys;
mod crash_resume;
mod exec_crash_loop;
mod exec_family;
mod exec_ids;
mod exec_stop_signal;
mod exit_codes;
mod fault_clients;
mod fault_corrupt_store;
mod fault_damage;
mod fault_degraded;
mod fault_disk_full;
mod fault_repair;
mod fault_soak;
mod large_answers;
mod local_security;
mod local_security_admission;
mod local_security_client;
mod local_security_memory;
mod log_format;
mod metrics;
mod mirror;
mod names;
mod publish_tail;
mod remote_access;
mod remote_ssh;
mod remove;
mod replay_cutover;
mod run_environment;
mod run_pty;
mod shell_agent;
mod shell_friendliness;
mod shim_times;
mod signals;
mod single_instance;
mod slow_reader;
mod status_size;
mod step_cli;
mod supervise_bad_input;
mod supervise_lost;
mod supervise_output;
mod supervise_policy;
mod supervise_ps;
mod supervise_reattach;
mod supervise_resume;
mod supervise_stop;
mod systemd_activation;
mod systemd_config;
mod systemd_notify;
mod systemd_support;
mod tail_reading;
