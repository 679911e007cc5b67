//! A pool opened from hostile bytes, then listed, read, checked, written,
//! reclaimed: none of it may panic, hang, or use memory out of proportion
//! to the device.
//!
//! Input: byte 0 = flags (bit 0: re-seal every block that carries the arbor
//! magic, so that mutations behind the checksum reach the field checks and
//! the engine's logic); bytes 1..5 = device size in 4 KiB blocks (u32 LE,
//! clamped to 1 ..= 65536, i.e. at most 256 MiB); then records of a block
//! index (u32 LE, taken modulo the size) and up to 4096 bytes of that block.
//! Blocks not given read as zeros. Seeds: `cargo run -p arbor-campaigns
//! --bin fuzz-seeds` (real pools in this encoding).
#![no_main]

use std::sync::Arc;

use arbor_engine::{OpenOptions, Pool};
use arbor_format::{seal, BlockType, BLOCK_SIZE};
use arbor_io::{BlockDevice, OverlayDevice};
use libfuzzer_sys::fuzz_target;

const MAX_BLOCKS: u32 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((size, mut rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let blocks = u32::from_le_bytes(*size).clamp(1, MAX_BLOCKS);
    let dev = OverlayDevice::zeroed(u64::from(blocks) * BLOCK_SIZE as u64);
    while let Some((index, tail)) = rest.split_first_chunk::<4>() {
        let len = tail.len().min(BLOCK_SIZE);
        let mut block = [0u8; BLOCK_SIZE];
        block[..len].copy_from_slice(&tail[..len]);
        rest = &tail[len..];
        if flags & 1 != 0 && block[..4] == *b"ARBR" {
            let kind = match u16::from_le_bytes([block[6], block[7]]) {
                1 => Some(BlockType::Superblock),
                2 => Some(BlockType::Commit),
                3 => Some(BlockType::SpaceMap),
                4 => Some(BlockType::Node),
                _ => None,
            };
            if let Some(kind) = kind {
                seal(&mut block, kind);
            }
        }
        let index = u64::from(u32::from_le_bytes(*index) % blocks);
        let _ = dev.write_at(&block, index * BLOCK_SIZE as u64);
    }
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let opts = OpenOptions {
        cache_bytes: 1 << 20,
        dirty_node_limit: 256,
    };
    let Ok(pool) = Pool::open(dev, &opts) else {
        return;
    };
    let Ok(list) = pool.list() else {
        return;
    };
    for info in list.iter().take(16) {
        let len = info.size.min(64 << 10);
        let mut buf = vec![0u8; len as usize];
        let _ = pool.read(info.id, 0, &mut buf);
        let _ = pool.read(info.id, (info.size - len) / 512 * 512, &mut buf);
        let _ = pool.allocation_map(info.id, 0, info.size.min(1 << 30));
        let _ = pool.volume_stats(info.id);
        let _ = pool.changed_since(info.id, 0);
    }
    if let [a, b, ..] = list.as_slice() {
        let _ = pool.diff(a.id, b.id);
    }
    let _ = pool.pool_stats();
    let _ = pool.check();
    if let Some(v) = list.iter().find(|v| !v.snapshot && v.size >= 8192) {
        let _ = pool.write(v.id, 0, &[0xA5; 8192]);
        let _ = pool.discard(v.id, 4096, 4096);
        let _ = pool.flush();
    }
    let _ = pool.reclaim(64);
    let _ = pool.check();
});
