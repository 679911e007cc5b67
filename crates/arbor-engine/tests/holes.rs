//! First writes into chunks that are holes on the device (of a sparse
//! pool file, `BlockDevice::hole`): a write that does not
//! cover a new chunk writes only its own blocks there, the chunk's other
//! blocks reading as the zeros they are summed as; a chunk that does not
//! read as zeros (one freed and handed out again) is written whole, so no
//! volume ever reads another's old bytes.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::Pool;
use arbor_io::{BlockDevice, SimDisk};
use arbor_io::{IoEvent, Recording, RecordingDevice};
use common::*;

const CS: u64 = 16384;
const BLOCK: u64 = 4096;

fn recorded_pool(size: u64) -> (SimDisk, Pool, Recording) {
    let disk = SimDisk::new(size);
    let (dev, recording) = RecordingDevice::new(Arc::new(disk.clone()));
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let pool = Pool::create(dev, &small_opts(CS as u32), &open_opts()).unwrap();
    (disk, pool, recording)
}

/// Bytes of every write since the last call (a write call alone writes
/// only data: metadata waits for the commit).
fn written(recording: &Recording) -> Vec<usize> {
    recording
        .take()
        .into_iter()
        .filter_map(|e| match e {
            IoEvent::Write { data, .. } => Some(data.len()),
            IoEvent::DurableWrite { .. } | IoEvent::Flush => None,
        })
        .collect()
}

fn pattern_block(seed: u8) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed | 1)
        .collect()
}

#[test]
fn a_first_write_into_a_hole_writes_its_blocks_only_and_reads_back() {
    let (disk, pool, recording) = recorded_pool(64 * MIB);
    let v = pool.create_volume("v", MIB).unwrap();
    pool.flush().unwrap();
    recording.take();

    // One block in the middle of chunk 0, an unaligned piece inside one
    // block of chunk 1, and a write of zeros into chunk 2.
    let data = pattern_block(3);
    pool.write(v, BLOCK, &data).unwrap();
    assert_eq!(
        written(&recording),
        vec![BLOCK as usize],
        "one block, not the chunk"
    );
    pool.write(v, CS + 2 * BLOCK + 100, &data[..200]).unwrap();
    assert_eq!(
        written(&recording),
        vec![BLOCK as usize],
        "the block around it"
    );
    pool.write(v, 2 * CS, &[0u8; BLOCK as usize]).unwrap();
    assert_eq!(
        written(&recording),
        Vec::<usize>::new(),
        "zeros over a hole"
    );

    let mut expect = vec![0u8; MIB as usize];
    expect[BLOCK as usize..2 * BLOCK as usize].copy_from_slice(&data);
    let at = (CS + 2 * BLOCK + 100) as usize;
    expect[at..at + 200].copy_from_slice(&data[..200]);
    let mut got = vec![1u8; MIB as usize];
    pool.read(v, 0, &mut got).unwrap();
    assert!(got == expect, "reads back as written, zeros around");

    // Durable, summed as written: the check, and every block read again
    // (verified against its sum) after a reopen.
    pool.flush().unwrap();
    assert_clean(&pool);
    drop(pool);
    let pool = reopen(&disk);
    let v = pool.lookup("v").unwrap();
    let mut got = vec![1u8; MIB as usize];
    pool.read(v, 0, &mut got).unwrap();
    assert!(got == expect);
    assert_clean(&pool);
}

/// The guard of "a freed block never shows its old contents": chunks a
/// deleted volume filled, reclaimed and handed out again, take a first
/// 4 KiB write each in a new volume, which reads that block and zeros.
#[test]
fn a_reused_chunk_is_written_whole_and_shows_nothing_of_its_old_owner() {
    let size = 2 * MIB;
    let (_disk, pool, recording) = recorded_pool(16 * MIB);
    let old = pool.create_volume("old", size).unwrap();
    let junk: Vec<u8> = (0..size).map(|i| (i % 251) as u8 | 0x80).collect();
    pool.write(old, 0, &junk).unwrap();
    pool.flush().unwrap();
    pool.delete("old").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.flush().unwrap();
    pool.flush().unwrap();

    // Fill the pool's data space with first writes until the new volume
    // has been handed every chunk the old one had (and more).
    let chunks = 512 * MIB / CS;
    let new = pool.create_volume("new", chunks * CS).unwrap();
    let data = pattern_block(9);
    let mut whole = 0;
    let mut mapped = Vec::new();
    for c in 0..chunks {
        match pool.write(new, c * CS + BLOCK, &data) {
            Ok(()) => {}
            Err(arbor_engine::Error::Exhausted(_)) => break,
            Err(e) => panic!("chunk {c}: {e}"),
        }
        mapped.push(c);
        whole += written(&recording)
            .iter()
            .filter(|&&n| n == CS as usize)
            .count();
    }
    assert!(
        whole >= (size / CS) as usize,
        "{whole} of {} chunks written whole: the old volume's were not handed out again",
        mapped.len()
    );
    let mut expect = vec![0u8; CS as usize];
    expect[BLOCK as usize..2 * BLOCK as usize].copy_from_slice(&data);
    let mut got = vec![0u8; CS as usize];
    for c in mapped {
        pool.read(new, c * CS, &mut got).unwrap();
        assert!(got == expect, "chunk {c} shows bytes it was not written");
    }
    assert_clean(&pool);
}
