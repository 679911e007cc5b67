//! Short version of the exhaustion campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin exhaustion -- --seconds N`).

use arbor_campaigns::exhaustion::{run, Outcome};
use arbor_campaigns::Tally;

/// Runs seeds 1000..1008 of 300 operations each.
fn run_seeds(spanning: bool) -> Outcome {
    let mut total = Outcome::default();
    for seed in 1000..1008 {
        total.add(run(seed, 300, spanning));
    }
    total
}

#[test]
#[ignore = "open: with single-chunk operations these seeds rarely fill the pool (0 of 2,400 ran out); the workload must fill it before this joins CI"]
fn failed_operations_leave_no_trace_on_a_pool_that_keeps_running_out() {
    let total = run_seeds(false);
    eprintln!("{total:?}");
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
    assert!(
        total.resource_failures >= 20,
        "only {} operations ran out of space",
        total.resource_failures
    );
    assert!(total.power_cuts + total.reopens >= 6);
}

/// The known gap: a write (or a discard or zeroing with partial ends) over
/// several chunks that runs out of space part way keeps the chunks it did.
/// Run with `--ignored` to see it; it must pass once writes plan all their
/// chunks before any data I/O.
#[test]
#[ignore = "open: multi-chunk writes are not atomic when space runs out part way (docs/RELIABILITY.md)"]
fn failed_multi_chunk_writes_leave_no_trace() {
    let total = run_seeds(true);
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
}
