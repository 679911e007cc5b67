//! The name rule (`crate::names`): new volume names leave room for every
//! snapshot name arbor generates; names an older version allowed stay
//! usable; hold tags fit their hidden records.

use super::*;
use arbor_format::MAX_NAME_LEN;

use crate::names::{MAX_GENERATED_SNAPSHOT_LEN, MAX_HOLD_TAG_LEN, MAX_VOLUME_NAME_LEN};

const MIB: u64 = 1 << 20;

/// A fresh pool on a simulated disk, and the disk (to open it again).
fn new_pool() -> (arbor_io::SimDisk, Pool) {
    let disk = arbor_io::SimDisk::new(64 * MIB);
    let opts = CreateOptions {
        chunk_size: 4096,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    };
    let pool = Pool::create(Arc::new(disk.clone()), &opts, &OpenOptions::default()).unwrap();
    (disk, pool)
}

fn reopen(disk: &arbor_io::SimDisk) -> Pool {
    Pool::open(Arc::new(disk.clone()), &OpenOptions::default()).unwrap()
}

/// The error of a name refused for its length: it says the limit and why.
fn assert_too_long(r: Result<impl std::fmt::Debug>) {
    match r {
        Err(e @ Error::Refused(Refusal::InvalidName { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("at most {MAX_VOLUME_NAME_LEN}"))
                    && msg.contains("snapshot names arbor generates"),
                "{msg}"
            );
        }
        other => panic!("expected a name too long, got {other:?}"),
    }
}

/// The longest snapshot part arbor may generate, as a valid name word.
fn longest_generated() -> String {
    format!("auto-{}", "x".repeat(MAX_GENERATED_SNAPSHOT_LEN - 5))
}

#[test]
fn new_volume_names_leave_room_for_generated_snapshots() {
    let (disk, pool) = new_pool();
    // 184 bytes, the old limit, and one past the new one: refused by every
    // way a volume gets a new name.
    for len in [MAX_NAME_LEN, 159, MAX_VOLUME_NAME_LEN + 1] {
        let long = "v".repeat(len);
        assert_too_long(pool.create_volume(&long, MIB));
        assert_too_long(pool.create_cow_volume(&long, MIB));
        pool.create_volume("base", MIB).unwrap();
        pool.snapshot("base@s").unwrap();
        assert_too_long(pool.clone_snapshot("base@s", &long));
        assert_too_long(pool.rename("base", &long));
        assert_too_long(pool.begin_receive(&ReceiveTarget {
            volume: long.clone(),
            target: [7; 16],
            base: None,
            size: MIB,
            key: None,
        }));
        pool.delete("base@s").unwrap();
        pool.delete("base").unwrap();
    }
    // The longest new name takes the longest generated snapshot name,
    // replication's included, and is renamed with its snapshots.
    let max = "m".repeat(MAX_VOLUME_NAME_LEN);
    pool.create_volume(&max, MIB).unwrap();
    pool.snapshot(&format!("{max}@{}", longest_generated()))
        .unwrap();
    pool.snapshot(&format!("{max}@repl-2026-11-28T18:02:26Z.4294967295"))
        .unwrap();
    let other = "n".repeat(MAX_VOLUME_NAME_LEN);
    pool.rename(&max, &other).unwrap();
    pool.lookup(&format!("{other}@{}", longest_generated()))
        .unwrap();
    // A receive's hidden record name fits too.
    pool.begin_receive(&ReceiveTarget {
        volume: max.clone(),
        target: [7; 16],
        base: None,
        size: MIB,
        key: None,
    })
    .unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert!(pool.check().unwrap().is_clean());
    pool.lookup(&format!("{other}@{}", longest_generated()))
        .unwrap();
}

#[test]
fn names_an_older_version_allowed_stay_usable() {
    let (disk, pool) = new_pool();
    // As an older version created it: 184 bytes.
    let old = "o".repeat(MAX_NAME_LEN);
    let id = pool
        .manage(Privilege::Normal, |m| {
            Ok(VolumeId(m.add_volume(
                old.clone(),
                VolumeKind::Volume,
                MIB,
                BlockRef::NONE,
                0,
                0,
            )))
        })
        .unwrap();
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(pool.lookup(&old).unwrap(), id);
    pool.write(id, 0, &[5; 4096]).unwrap();
    let mut buf = [0; 4096];
    pool.read(id, 0, &mut buf).unwrap();
    assert_eq!(buf, [5; 4096]);
    // A snapshot's full name would pass 184 bytes: a clear error.
    assert!(matches!(
        pool.snapshot(&format!("{old}@s")),
        Err(Error::Refused(Refusal::InvalidName { .. }))
    ));
    pool.rename(&old, "short").unwrap();
    pool.rename("short", &old[..MAX_VOLUME_NAME_LEN]).unwrap();
    pool.delete(&old[..MAX_VOLUME_NAME_LEN]).unwrap();
    assert!(pool.list().unwrap().is_empty());
}

#[test]
fn hold_tags_fit_their_records() {
    let (disk, pool) = new_pool();
    pool.create_volume("v", MIB).unwrap();
    pool.snapshot("v@s").unwrap();
    // The tag would make a hold record name past 184 bytes.
    let too_long = "t".repeat(MAX_HOLD_TAG_LEN + 1);
    match pool.hold("v@s", &too_long) {
        Err(Error::Refused(Refusal::Invalid(why))) => {
            let msg = why.to_string();
            assert!(
                msg.contains(&format!("at most {MAX_HOLD_TAG_LEN}")),
                "{msg}"
            )
        }
        other => panic!("{other:?}"),
    }
    let longest = "t".repeat(MAX_HOLD_TAG_LEN);
    assert!(pool.hold("v@s", &longest).unwrap());
    drop(pool);
    let pool = reopen(&disk);
    let s = pool.lookup("v@s").unwrap();
    assert_eq!(pool.holds(s).unwrap(), vec![longest.clone()]);
    assert!(pool.release("v@s", &longest).unwrap());
    assert!(pool.holds(s).unwrap().is_empty());
}
