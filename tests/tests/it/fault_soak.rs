//! The crash-loop soak, short enough for CI: two workers and two producers
//! write, three `tail -f` clients follow, and the daemon is `kill -9`'d
//! eight times at random moments, a shim once. Nothing acknowledged is
//! lost, no tailer prints a frame twice or skips one, no seq repeats.
//! `scripts/soak.sh` runs the same soak longer through `TETHER_SOAK_*`.

use tether_tests::soak::{self, Plan};

#[test]
fn a_crash_loop_loses_and_duplicates_nothing() {
    let plan = Plan::from_env(Plan {
        kills: 8,
        workers: 2,
        producers: 2,
        tailers: 3,
        lines: 1500,
        shim_kill_every: 5,
        seed: soak::clock_seed(),
    });
    eprintln!("soak plan: {plan:?}");
    let summary = soak::run(&plan);
    // The one line the long run's script looks for.
    println!("{summary}");
    assert_eq!(summary.kills, plan.kills);
    assert_eq!(
        (summary.lost, summary.duplicated),
        (0, 0),
        "{summary} (seed {})",
        plan.seed
    );
}
