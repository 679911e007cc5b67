//! Feeds arbitrary bytes to every on-disk decoder; also re-seals them so the
//! field validation behind the checksum is reached.
#![no_main]

use arbor_format::{
    seal, BlockRef, BlockType, CommitRecord, Node, SmKind, SmPage, Superblock, BLOCK_SIZE,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::decode(data, u64::MAX);
    let _ = CommitRecord::decode(data);
    let _ = SmPage::decode_any(data);
    let _ = Node::decode(data, BlockRef { block: 1, txn: 1 });
    let mut block = [0u8; BLOCK_SIZE];
    let n = data.len().min(BLOCK_SIZE);
    block[..n].copy_from_slice(&data[..n]);
    for block_type in [
        BlockType::Superblock,
        BlockType::Commit,
        BlockType::SpaceMap,
        BlockType::Node,
    ] {
        seal(&mut block, block_type);
        let _ = Superblock::decode(&block, u64::MAX);
        let _ = CommitRecord::decode(&block);
        let _ = SmPage::decode(&block, (SmKind::Meta, 0));
        let _ = Node::decode(&block, BlockRef { block: 1, txn: 1 });
    }
});
