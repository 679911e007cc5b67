//! The crash rule of data checksums (`crate::intents`) against a commit in
//! flight: phases B and C of a commit run without the I/O gate, so writes
//! run while the commit's records go to the device. A process killed then
//! keeps every write it made (the page cache outlives it), so the state it
//! recovers to may be that commit's, with whatever those writes put on the
//! device after it was frozen.

use super::*;
use arbor_io::SimDisk;

const CS: u64 = 16 << 10;

fn pool(disk: &SimDisk) -> Pool {
    let opts = CreateOptions {
        chunk_size: CS as u32,
        metadata_bytes: Some(4 << 20),
        ..Default::default()
    };
    Pool::create(Arc::new(disk.clone()), &opts, &OpenOptions::default()).unwrap()
}

/// Phase A of a commit: the returned job is the commit in flight until
/// [`Pool::complete_commit`]. The caller holds the commit lock.
fn begin_commit(pool: &Pool) -> CommitJob {
    let _gate = pool.gates.commit();
    let mut meta = pool.write_meta().unwrap();
    pool.freeze(&mut meta).unwrap().expect("changes to commit")
}

/// A chunk allocated in the transaction being committed is mapped, with
/// its sums of then, by the state that commit makes durable. A write into
/// it while the commit is in flight must not land in place unless its
/// region is durable in the intent set: after a kill that commit's state
/// is what the pool opens, and the block must read as one of the two
/// contents, never as damaged.
#[test]
fn a_chunk_of_the_commit_in_flight_is_not_overwritten_in_place_outside_the_intent_set() {
    let disk = SimDisk::new(64 << 20);
    let handle = disk.handle();
    let pool = pool(&disk);
    let v = pool.create_volume("v", 1 << 20).unwrap();
    pool.flush().unwrap();
    // A new chunk, allocated and mapped in the open transaction.
    pool.write(v, 0, &[1; 4096]).unwrap();

    let commit = pool.committer.lock();
    let job = begin_commit(&pool);
    // A writer during phase B (without waiting for intents: this thread
    // holds the commit lock a wait would take).
    let waits = pool
        .attempt(&write::Unit::data(v, 0, &[2; 4096]), false)
        .unwrap();
    assert_eq!(waits, None, "the write did not run");
    pool.complete_commit(job).unwrap();
    drop(commit);
    let mut buf = vec![0u8; 4096];
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(buf, [2; 4096], "the write is read back before the kill");

    // kill -9 (every completed write is on the device), and a power cut
    // now (what the commit's flushes made durable: the write too).
    let images = [handle.visible_image(), handle.durable_image()];
    drop(pool);
    for (image, what) in images.into_iter().zip(["kill -9", "power cut"]) {
        let pool = Pool::open(
            Arc::new(SimDisk::from_image(image)),
            &OpenOptions::default(),
        )
        .unwrap();
        pool.read(v, 0, &mut buf).unwrap_or_else(|e| {
            panic!("after a {what}, the block written while its commit was in flight: {e}")
        });
        assert!(
            buf == [1; 4096] || buf == [2; 4096],
            "after a {what}: neither the old nor the new content"
        );
    }
}

/// The rule's other side: after its commit, a chunk outside the set is
/// not overwritten in place at once; the write waits for its region
/// (returned: the transaction to commit through), and nothing is written.
/// (Listing regions ahead of need, when a write maps a chunk it fills in
/// part, was tried and not kept: an unclean open re-sums every listed
/// region from the device, which hides damage there. PERFORMANCE.md §18.)
#[test]
fn an_in_place_write_outside_the_set_waits_for_its_region() {
    let disk = SimDisk::new(64 << 20);
    let pool = pool(&disk);
    let v = pool.create_volume("v", 1 << 20).unwrap();
    pool.write(v, 0, &[1; 4096]).unwrap();
    pool.flush().unwrap();
    let waits = pool
        .attempt(&write::Unit::data(v, 4096, &[2; 4096]), true)
        .unwrap();
    assert!(
        waits.is_some(),
        "an in-place write outside the set did not wait"
    );
    let mut buf = vec![0u8; 8192];
    pool.read(v, 0, &mut buf).unwrap();
    assert!(
        buf[..4096] == [1; 4096] && buf[4096..] == [0; 4096],
        "something was written"
    );
}
