//! Short version of the exhaustion campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin exhaustion -- --seconds N`).

use arbor_campaigns::exhaustion::{run, Outcome};
use arbor_campaigns::Tally;

#[test]
fn failed_operations_leave_no_trace_on_a_pool_that_keeps_running_out() {
    let mut total = Outcome::default();
    for seed in 1000..1008 {
        total.add(run(seed, 300));
    }
    eprintln!("{total:?}");
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
    assert!(total.power_cuts + total.reopens >= 6);
    assert!(
        total.resize_races >= 8,
        "{} raced shrinks",
        total.resize_races
    );
    assert!(total.growths >= 3, "{} growths", total.growths);
    assert!(
        total.encrypted_runs >= 2,
        "{} encrypted runs",
        total.encrypted_runs
    );
    // The campaign proves something only if the pool does run out, of both
    // kinds of space, in writes and in the operations that take metadata.
    let no_space = total.ran_out_of("NoSpace");
    let metadata = total.ran_out_of("MetadataFull");
    assert!(
        no_space.contains(&"write") && metadata.contains(&"write"),
        "{}",
        total.ran_out_summary()
    );
    assert!(
        metadata.len() >= 3,
        "few operations ran out of metadata: {}",
        total.ran_out_summary()
    );
}
