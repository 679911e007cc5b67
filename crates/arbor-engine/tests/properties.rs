//! Properties (format version 4) and group snapshots: values that layers
//! above the engine keep in the pool, set atomically whatever runs out or
//! wherever power is cut; snapshots of several volumes in one commit.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{CreateOptions, Durability, Error, Pool, Refusal, Resource};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn value(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

#[test]
fn properties_set_read_replace_remove_and_survive_reopen() {
    let (disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("v", MIB).unwrap();
    assert_eq!(pool.property(None, "policy.1").unwrap(), None);
    pool.set_property(None, "policy.1", b"first").unwrap();
    pool.set_property(None, "policy.2", &value(7, 65536))
        .unwrap();
    pool.set_property(Some(v), "note", b"mine").unwrap();
    pool.set_property(None, "policy.1", b"second").unwrap();
    assert_eq!(pool.property(None, "policy.1").unwrap().unwrap(), b"second");
    assert_eq!(pool.property_keys(None).unwrap(), ["policy.1", "policy.2"]);
    assert_eq!(pool.property_keys(Some(v)).unwrap(), ["note"]);
    // Properties are no volumes.
    assert_eq!(pool.list().unwrap().len(), 1);
    assert!(pool.lookup("0%prop%policy.1").is_err());
    // Limits and names.
    assert!(matches!(
        pool.set_property(None, "big", &vec![0; 65537]),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.set_property(None, "a%b", b"x"),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(pool.remove_property(None, "policy.2").unwrap());
    assert!(!pool.remove_property(None, "policy.2").unwrap());
    pool.flush().unwrap();
    assert_clean(&pool);
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(pool.property(None, "policy.1").unwrap().unwrap(), b"second");
    assert_eq!(pool.property(None, "policy.2").unwrap(), None);
    let v = pool.lookup("v").unwrap();
    assert_eq!(pool.property(Some(v), "note").unwrap().unwrap(), b"mine");
    // A volume's properties go with it, and their space is reclaimed.
    pool.delete("v").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.remove_property(None, "policy.1").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.flush().unwrap();
    assert_eq!(
        pool.pool_stats().unwrap().data_used_bytes,
        0,
        "a property leaked"
    );
    assert_clean(&pool);
}

#[test]
fn older_pools_need_an_upgrade_for_properties() {
    let disk = SimDisk::new(32 * MIB);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        format_version: arbor_format::FormatVersion::new(3).unwrap(),
        ..small_opts(4096)
    };
    let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
    assert!(matches!(
        pool.set_property(None, "p", b"x"),
        Err(Error::Refused(Refusal::Unsupported(_)))
    ));
    assert!(pool.upgrade().unwrap());
    assert_eq!(pool.format_version().number(), arbor_format::FORMAT_VERSION);
    pool.set_property(None, "p", b"x").unwrap();
    drop(pool);
    assert_eq!(reopen(&disk).property(None, "p").unwrap().unwrap(), b"x");
}

/// Two threads set the same key at once, over and over (the daemon's scrub
/// loop saving where it stands while a user stops the scrub): every set
/// succeeds, the value read is always one of those set, and the last set
/// is what stays; no staged record is left (the pool checks clean).
/// (Regression: a set staged its record, and a second set of the key
/// deleted that record before the first installed it, which then failed
/// with "property … was set again meanwhile".)
#[test]
fn sets_of_one_key_at_once_all_succeed_and_the_last_stays() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let pool = Arc::new(pool);
    let rounds = 200u16;
    let writers: Vec<_> = (0..2u8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                for i in 0..rounds {
                    let mine = [&[t][..], &i.to_le_bytes()[..]].concat();
                    pool.set_property(None, "arbor.scrub", &mine)
                        .unwrap_or_else(|e| panic!("writer {t}, set {i}: {e}"));
                    let read = pool.property(None, "arbor.scrub").unwrap().unwrap();
                    assert_eq!(read.len(), 3, "{read:?}");
                    assert!(read[0] < 2, "{read:?}");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let last = pool.property(None, "arbor.scrub").unwrap().unwrap();
    assert_eq!(&last[1..], &(rounds - 1).to_le_bytes(), "{last:?}");
    pool.set_property(None, "arbor.scrub", b"after").unwrap();
    assert_eq!(
        pool.property(None, "arbor.scrub").unwrap().unwrap(),
        b"after"
    );
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.flush().unwrap();
    assert_clean(&pool);
}

/// Out of data space or metadata, a set fails and leaves the old value and
/// no staged record (no leaked chunk, the pool checks clean).
#[test]
fn a_set_that_runs_out_of_space_keeps_the_old_value() {
    let (_disk, pool) = sim_pool(16 * MIB, 4096);
    pool.set_property(None, "p", b"old").unwrap();
    let v = pool.create_volume("fill", 64 * MIB).unwrap();
    let mut at = 0;
    loop {
        match pool.write(v, at, &value(1, 65536)) {
            Ok(()) => at += 65536,
            Err(Error::Exhausted(Resource::DataSpace)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    pool.flush().unwrap();
    let used = pool.pool_stats().unwrap().data_used_bytes;
    for _ in 0..3 {
        let e = pool.set_property(None, "p", &value(2, 20000)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Exhausted(Resource::DataSpace) | Error::Exhausted(Resource::Metadata)
            ),
            "{e}"
        );
        assert_eq!(pool.property(None, "p").unwrap().unwrap(), b"old");
        pool.flush().unwrap();
        assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used);
        assert_clean(&pool);
    }
    // Space back, the set works.
    pool.delete("fill").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.set_property(None, "p", b"new").unwrap();
    assert_eq!(pool.property(None, "p").unwrap().unwrap(), b"new");
}

/// Power cut at every point of a set: the pool opens with the old value or
/// the new one, checks clean, and a later set works (a staged record left
/// by the cut is replaced, not leaked).
#[test]
fn a_power_cut_during_a_set_leaves_the_old_value_or_the_new() {
    let mut saw = [false; 2];
    for cut in 1..40u64 {
        for seed in 0..3u64 {
            let (disk, pool) = sim_pool(16 * MIB, 4096);
            pool.set_property(None, "p", &value(1, 3000)).unwrap();
            let handle = disk.handle();
            handle.cut_power_after(cut);
            let done = pool.set_property(None, "p", &value(2, 9000)).is_ok();
            drop(pool);
            let mut rng = StdRng::seed_from_u64(cut * 10 + seed);
            let crashed = SimDisk::from_image(handle.crash_image(&mut rng));
            let pool = reopen(&crashed);
            let got = pool.property(None, "p").unwrap().unwrap();
            if done {
                assert_eq!(
                    got,
                    value(2, 9000),
                    "cut {cut}: an acknowledged set was lost"
                );
            }
            if got == value(1, 3000) {
                saw[0] = true;
            } else {
                assert_eq!(got, value(2, 9000), "cut {cut}: a mixed value");
                saw[1] = true;
            }
            assert_clean(&pool);
            pool.set_property(None, "p", b"again").unwrap();
            while pool.reclaim(1000).unwrap() > 0 {}
            pool.remove_property(None, "p").unwrap();
            while pool.reclaim(1000).unwrap() > 0 {}
            pool.flush().unwrap();
            assert_eq!(
                pool.pool_stats().unwrap().data_used_bytes,
                0,
                "cut {cut}: a staged value leaked"
            );
        }
    }
    assert!(saw[0] && saw[1], "cuts never fell on both sides: {saw:?}");
}

#[test]
fn a_group_snapshot_is_one_commit_or_nothing() {
    let (disk, pool) = sim_pool(32 * MIB, 4096);
    let a = pool.create_volume("a", MIB).unwrap();
    let b = pool.create_volume("b", MIB).unwrap();
    pool.write(a, 0, &value(1, 4096)).unwrap();
    pool.write(b, 0, &value(2, 4096)).unwrap();
    let ids = pool
        .snapshot_group(&["a@g1".to_owned(), "b@g1".to_owned()])
        .unwrap();
    let infos: Vec<_> = ids.iter().map(|&id| pool.info(id).unwrap()).collect();
    assert_eq!(infos[0].created_txn, infos[1].created_txn, "one commit");
    // A name taken, a snapshot as a source, a volume twice, an empty list:
    // nothing is created.
    pool.snapshot("b@g2").unwrap();
    let before = pool.list().unwrap().len();
    for names in [
        vec!["a@g2", "b@g2"],
        vec!["a@g3", "a@g1@x"],
        vec!["a@g3", "a@g4"],
        vec![],
        vec!["a@g3", "nope@g3"],
    ] {
        let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
        assert!(pool.snapshot_group(&names).is_err(), "{names:?}");
        assert_eq!(pool.list().unwrap().len(), before, "{names:?} left a trace");
    }
    pool.write(a, 0, &value(3, 4096)).unwrap();
    let mut buf = vec![0; 4096];
    pool.read(pool.lookup("a@g1").unwrap(), 0, &mut buf)
        .unwrap();
    assert_eq!(buf, value(1, 4096));
    drop(pool);
    let pool = reopen(&disk);
    assert!(pool.lookup("a@g1").is_ok() && pool.lookup("b@g1").is_ok());
    assert!(pool.lookup("a@g2").is_err());
    assert_clean(&pool);
}

/// Power cut during a group snapshot: after recovery all its snapshots
/// exist or none does, whether the group is made durable by one record of
/// the intent log (the pool's transaction holds only writes) or by a
/// commit (after a deferred snapshot, which no record describes).
#[test]
fn a_power_cut_never_leaves_half_a_group() {
    for commits in [false, true] {
        let mut saw = [false; 2];
        for cut in 0..20u64 {
            let (disk, pool) = sim_pool(16 * MIB, 4096);
            for name in ["a", "b", "c"] {
                let v = pool.create_volume(name, MIB).unwrap();
                pool.write(v, 0, &value(name.as_bytes()[0], 8192)).unwrap();
            }
            pool.flush().unwrap();
            if commits {
                pool.snapshot_with("c@d", Durability::Deferred).unwrap();
            }
            let logged = pool.pool_stats().unwrap().logged_snapshots;
            let handle = disk.handle();
            handle.cut_power_after(cut);
            let names: Vec<String> = ["a@g", "b@g", "c@g"].map(str::to_owned).to_vec();
            let done = pool.snapshot_group(&names).is_ok();
            if done {
                let now = pool.pool_stats().unwrap().logged_snapshots;
                assert_eq!(now > logged, !commits, "cut {cut}: logged or committed?");
            }
            drop(pool);
            let mut rng = StdRng::seed_from_u64(cut);
            let pool = reopen(&SimDisk::from_image(handle.crash_image(&mut rng)));
            let present: Vec<bool> = names.iter().map(|n| pool.lookup(n).is_ok()).collect();
            assert!(
                present.iter().all(|&p| p) || present.iter().all(|&p| !p),
                "cut {cut}: {present:?}"
            );
            if done {
                assert!(present[0], "cut {cut}: an acknowledged group was lost");
            }
            saw[usize::from(present[0])] = true;
            assert_clean(&pool);
        }
        assert!(saw[0] && saw[1], "commits {commits}: {saw:?}");
    }
}
