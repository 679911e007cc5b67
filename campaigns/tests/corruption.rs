//! Short version of the corruption campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin corruption -- --seconds N`).

use arbor_campaigns::corruption::{run, DAMAGES, TARGETS};

#[test]
fn damaged_pools_are_reported_and_never_return_wrong_data() {
    let outcome = run(1, 3);
    assert!(outcome.failures.is_empty(), "{:#?}", outcome.failures);
    for target in TARGETS {
        let tried: u64 = DAMAGES
            .iter()
            .filter_map(|d| outcome.tallies.get(&(target, *d)))
            .map(|t| t.trials)
            .sum();
        assert!(tried > 0, "{target:?} was never damaged");
    }
    eprintln!("{} trials: {:#?}", outcome.trials(), outcome.tallies);
}
