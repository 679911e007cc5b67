//! Every fuzz target (pool images, on-disk blocks, send streams, key records, NBD
//! handshake and requests) on its seeds, its saved regressions and a bounded number of
//! mutated inputs, on stable Rust. Coverage-guided runs: `fuzz/run.sh`.

use arbor_campaigns::hostile::{exercise, TARGETS};

fn mutations(name: &str) -> u64 {
    match name {
        // Each input opens, reads, checks and writes a whole pool.
        "open_pool" => 5000,
        _ => 5000,
    }
}

#[test]
fn every_fuzz_target_survives_its_seeds_regressions_and_mutations() {
    for target in &TARGETS {
        let runs = exercise(target, mutations(target.name), 1);
        eprintln!("{}: {runs} inputs", target.name);
        assert!(runs > mutations(target.name));
    }
}
