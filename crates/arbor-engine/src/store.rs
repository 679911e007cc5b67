//! The lowest engine layer: the device, the pool geometry and the bounded
//! caches of clean (committed) metadata. Everything here is immutable or
//! internally locked, so readers on many threads share it.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use arbor_format::{BlockRef, Node, SmKind, SmPage, Superblock, BLOCK_SIZE, BLOCK_SIZE_U64};
use arbor_io::BlockDevice;
use lru::LruCache;

use crate::error::{Error, Result};

/// Geometry as plain integers, derived once from the validated superblock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub chunk_size: u64,
    pub journal_pages: u64,
    pub journal_start: [u64; 2],
    pub meta_sm_start: u64,
    pub data_sm_start: u64,
    pub meta_start: u64,
    pub meta_blocks: u64,
    pub data_start_bytes: u64,
    pub data_chunks: u64,
    pub pool_bytes: u64,
    pub uuid: [u8; 16],
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock) -> Self {
        Self {
            chunk_size: u64::from(sb.chunk_size.get()),
            journal_pages: u64::from(sb.journal_pages.get()),
            journal_start: [sb.journal_start[0].get(), sb.journal_start[1].get()],
            meta_sm_start: sb.meta_sm_start.get(),
            data_sm_start: sb.data_sm_start.get(),
            meta_start: sb.meta_start.get(),
            meta_blocks: sb.meta_blocks.get(),
            data_start_bytes: sb.data_start_bytes.get(),
            data_chunks: sb.data_chunks.get(),
            pool_bytes: sb.pool_bytes.get(),
            uuid: sb.uuid,
        }
    }

    /// Home block of a space-map page.
    pub fn sm_home(&self, kind: SmKind, index: u32) -> u64 {
        let start = match kind {
            SmKind::Meta => self.meta_sm_start,
            SmKind::Data => self.data_sm_start,
        };
        start + u64::from(index)
    }

    /// Entries a space map of `kind` has.
    pub fn sm_entries(&self, kind: SmKind) -> u64 {
        match kind {
            SmKind::Meta => self.meta_blocks,
            SmKind::Data => self.data_chunks,
        }
    }

    pub fn is_meta_block(&self, block: u64) -> bool {
        block >= self.meta_start && block - self.meta_start < self.meta_blocks
    }

    /// Byte offset of a data chunk. The caller passes a chunk below
    /// `data_chunks` (mapping values are validated on read), so this cannot
    /// overflow: the superblock validated that the data region fits the pool.
    pub fn chunk_offset(&self, pchunk: u64) -> u64 {
        self.data_start_bytes + pchunk * self.chunk_size
    }
}

/// Device + geometry + clean-metadata caches.
pub(crate) struct Store {
    pub dev: Arc<dyn BlockDevice>,
    pub geo: Geometry,
    nodes: Mutex<LruCache<u64, Arc<CachedNode>>>,
    pages: Mutex<LruCache<(SmKind, u32), Arc<SmPage>>>,
}

pub(crate) struct CachedNode {
    pub txn: u64,
    pub node: Node,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The caches hold only immutable decoded copies of on-disk blocks; a panic
    // elsewhere cannot leave them half-updated, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store {
    pub fn new(dev: Arc<dyn BlockDevice>, geo: Geometry, cache_blocks: usize) -> Self {
        let nodes = NonZeroUsize::new(cache_blocks.max(16)).unwrap_or(NonZeroUsize::MIN);
        let pages = NonZeroUsize::new((cache_blocks / 8).max(16)).unwrap_or(NonZeroUsize::MIN);
        Self {
            dev,
            geo,
            nodes: Mutex::new(LruCache::new(nodes)),
            pages: Mutex::new(LruCache::new(pages)),
        }
    }

    pub fn read_block(&self, block: u64) -> Result<Box<[u8; BLOCK_SIZE]>> {
        let mut buf = Box::new([0u8; BLOCK_SIZE]);
        let offset = block
            .checked_mul(BLOCK_SIZE_U64)
            .ok_or_else(|| Error::inconsistent(format!("block number {block} overflows")))?;
        self.dev.read_at(&mut buf[..], offset)?;
        Ok(buf)
    }

    pub fn write_block(&self, block: u64, data: &[u8; BLOCK_SIZE]) -> Result<()> {
        self.dev.write_at(data, block * BLOCK_SIZE_U64)?;
        Ok(())
    }

    /// A committed node, from the cache or the device. The pointer's txn must
    /// match the node's, so a stale cached copy of a reused block is never served.
    pub fn read_node(&self, r: BlockRef) -> Result<Arc<CachedNode>> {
        if let Some(hit) = lock(&self.nodes).get(&r.block) {
            if hit.txn == r.txn {
                return Ok(Arc::clone(hit));
            }
        }
        let node = self.read_node_uncached(r)?;
        let cached = Arc::new(CachedNode { txn: r.txn, node });
        lock(&self.nodes).put(r.block, Arc::clone(&cached));
        Ok(cached)
    }

    /// Reads and verifies a node from the device, bypassing the cache.
    pub fn read_node_uncached(&self, r: BlockRef) -> Result<Node> {
        if !self.geo.is_meta_block(r.block) {
            return Err(Error::inconsistent(format!(
                "node pointer to block {} outside the metadata region",
                r.block
            )));
        }
        let raw = self.read_block(r.block)?;
        Node::decode(&raw[..], r)
            .map_err(|e| Error::corrupt(format!("metadata block {}", r.block), e))
    }

    /// Publishes a node written by a commit.
    pub fn cache_node(&self, block: u64, node: Arc<CachedNode>) {
        lock(&self.nodes).put(block, node);
    }

    pub fn forget_node(&self, block: u64) {
        lock(&self.nodes).pop(&block);
    }

    /// A committed space-map page, from the cache or its home block.
    pub fn read_sm_page(&self, kind: SmKind, index: u32) -> Result<Arc<SmPage>> {
        if let Some(hit) = lock(&self.pages).get(&(kind, index)) {
            return Ok(Arc::clone(hit));
        }
        let home = self.geo.sm_home(kind, index);
        let raw = self.read_block(home)?;
        let page = SmPage::decode(&raw[..], (kind, index)).map_err(|e| {
            Error::corrupt(format!("space-map page {kind:?}/{index} (block {home})"), e)
        })?;
        let page = Arc::new(page);
        lock(&self.pages).put((kind, index), Arc::clone(&page));
        Ok(page)
    }

    pub fn cache_sm_page(&self, page: Arc<SmPage>) {
        lock(&self.pages).put((page.kind, page.index), page);
    }
}

/// The space-map pages of a captured commit that are not (or soon not) at
/// home: its own journalled images, and the home images later commits
/// overwrite while a check walks it (a commit saves the old image here
/// before it writes the new one, see `CommitJob::write`). Used by `check`.
#[derive(Default)]
pub(crate) struct PreservedPages {
    pages: Mutex<PageImages>,
}

/// Space-map page images by kind and index.
pub(crate) type PageImages = HashMap<(SmKind, u32), Arc<SmPage>>;

impl PreservedPages {
    pub fn lock(&self) -> MutexGuard<'_, PageImages> {
        // A map of immutable images: a panic cannot leave it half-updated.
        self.pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The captured commit's page `index`. Under the lock, so never a home
    /// copy a commit is overwriting.
    pub fn get(&self, store: &Store, kind: SmKind, index: u32) -> Result<Arc<SmPage>> {
        let pages = self.lock();
        match pages.get(&(kind, index)) {
            Some(page) => Ok(Arc::clone(page)),
            None => store.read_sm_page(kind, index),
        }
    }

    /// Before a commit writes page `index` home: keeps the image the
    /// captured commit sees. The returned guard must be held until the home
    /// copy is written.
    pub fn keep_home(
        &self,
        store: &Store,
        kind: SmKind,
        index: u32,
    ) -> Result<MutexGuard<'_, PageImages>> {
        let mut pages = self.lock();
        if let std::collections::hash_map::Entry::Vacant(slot) = pages.entry((kind, index)) {
            slot.insert(store.read_sm_page(kind, index)?);
        }
        Ok(pages)
    }
}
