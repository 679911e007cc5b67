//! Short version of the isolation campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin isolation -- --seconds N`).

use arbor_campaigns::isolation::{run, Outcome};
use arbor_campaigns::Tally;

#[test]
fn deleted_data_never_shows_in_other_volumes_even_across_power_cuts() {
    let mut total = Outcome::default();
    for seed in 0..4 {
        total.add(run(seed, 60));
    }
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
    assert!(total.images >= 300, "only {} crash images", total.images);
    eprintln!("{total:?}");
}
