//! Short version of the corruption campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin corruption -- --seconds N`).

use arbor_campaigns::corruption::{has_target, run, DAMAGES, TARGETS, VERSIONS};

#[test]
fn damaged_pools_are_reported_and_never_return_wrong_data() {
    let outcome = run(1, 3);
    assert!(outcome.failures.is_empty(), "{:#?}", outcome.failures);
    for version in VERSIONS {
        for target in TARGETS.into_iter().filter(|&t| has_target(version, t)) {
            let tried: u64 = DAMAGES
                .iter()
                .filter_map(|d| outcome.tallies.get(&(version, target, *d)))
                .map(|t| t.trials)
                .sum();
            assert!(tried > 0, "version {version}: {target:?} was never damaged");
        }
    }
    eprintln!("{} trials: {:#?}", outcome.trials(), outcome.tallies);
}
