//! `Pool::diff_in` (a window of a diff) against `Pool::diff`: random
//! histories, random windows; every window reports exactly the whole
//! diff's chunks that overlap it, and chunk-aligned windows laid end to end
//! give the whole diff back.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{sim_pool, MIB};
use proptest::prelude::*;

const CHUNK: u64 = 4096;

/// Chunks of `ranges` (byte ranges), as a sorted list.
fn chunks(ranges: &[(u64, u64)]) -> Vec<u64> {
    ranges
        .iter()
        .flat_map(|&(o, l)| o / CHUNK..(o + l) / CHUNK)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_window_of_a_diff_is_the_diff_inside_the_window(
        before in proptest::collection::vec((0..4096u64, 1..64u64), 1..40),
        after in proptest::collection::vec((0..4096u64, 1..64u64, any::<bool>()), 1..40),
        windows in proptest::collection::vec((0..5000u64, 0..3000u64), 1..12),
        step in 1..700u64,
    ) {
        let (_disk, pool) = sim_pool(96 * MIB, CHUNK as u32);
        let v = pool.create_volume("v", 4096 * CHUNK).unwrap();
        for &(at, len) in &before {
            let len = len.min(4096 - at);
            pool.write(v, at * CHUNK, &vec![1u8; (len * CHUNK) as usize]).unwrap();
        }
        let s = pool.snapshot("v@s").unwrap();
        for &(at, len, discard) in &after {
            let len = len.min(4096 - at);
            if discard {
                pool.discard(v, at * CHUNK, len * CHUNK).unwrap();
            } else {
                pool.write(v, at * CHUNK, &vec![2u8; (len * CHUNK) as usize]).unwrap();
            }
        }
        let whole = chunks(&pool.diff(s, v).unwrap());
        for &(from, len) in &windows {
            // Byte bounds anywhere, not only on chunks.
            let (lo, hi) = (from * CHUNK / 3, (from + len) * CHUNK / 3 + 1);
            let got = chunks(&pool.diff_in(s, v, lo, hi).unwrap());
            let want: Vec<u64> = whole
                .iter()
                .copied()
                .filter(|&c| c * CHUNK < hi && (c + 1) * CHUNK > lo)
                .collect();
            prop_assert_eq!(got, want, "window {}..{}", lo, hi);
        }
        let mut joined = Vec::new();
        let mut at = 0;
        while at < 4096 {
            joined.extend(chunks(&pool.diff_in(s, v, at * CHUNK, (at + step) * CHUNK).unwrap()));
            at += step;
        }
        prop_assert_eq!(joined, whole);
    }
}
