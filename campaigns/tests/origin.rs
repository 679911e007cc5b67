//! Short version of the two-device campaign, run by CI (the long one is
//! `cargo run --release -p arbor-campaigns --bin origin -- --seconds N`).

use arbor_campaigns::origin::{run, Outcome};
use arbor_campaigns::Tally;

#[test]
fn copy_on_write_volumes_survive_cuts_of_either_device_and_full_pools() {
    let mut total = Outcome::default();
    for seed in 1000..1012 {
        total.add(run(seed, 400));
    }
    eprintln!("{total:?}");
    assert!(total.failures.is_empty(), "{:#?}", total.failures);
    // It proves something only if both kinds of space run out under
    // writes of the volume, and power is cut many times.
    assert!(total.ran_out_data > 0, "{total:?}");
    assert!(total.ran_out_metadata > 0, "{total:?}");
    assert!(total.cuts >= 12, "{total:?}");
    // And the volume grows (both kinds of home are among the seeds).
    assert!(total.growths > 0, "{total:?}");
}
