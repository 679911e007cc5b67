//! Short version of the power-cut campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin powercut -- --seconds N`).

use arbor_campaigns::powercut::{run, Config, Outcome};
use arbor_campaigns::Tally;

#[test]
fn record_replay_power_cuts_lose_nothing() {
    let mut total = Outcome::default();
    for seed in 0..16 {
        total.add(run(Config {
            steps: 200,
            ..Config::new(seed)
        }));
    }
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
    assert!(
        total.cut_points >= 1000,
        "only {} cut points",
        total.cut_points
    );
    assert!(total.images >= 2000, "only {} images", total.images);
    // Writes in place listed by the intent log, with cuts around them.
    assert!(
        total.durable_writes >= 16,
        "only {} intent log records",
        total.durable_writes
    );
    // Committed snapshots logged instead of committed, with cuts around
    // their records.
    assert!(
        total.logged_snapshots >= 8,
        "only {} logged snapshots",
        total.logged_snapshots
    );
    assert!(
        total.encrypted_runs >= 5,
        "{} encrypted runs",
        total.encrypted_runs
    );
    eprintln!("{total:?}");
}
