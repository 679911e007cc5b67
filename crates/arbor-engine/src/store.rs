//! The lowest engine layer: the device, the pool geometry and the bounded
//! caches of clean (committed) metadata. Everything here is immutable or
//! internally locked, so readers on many threads share it.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arbor_format::{
    chunk_run_in, meta_block_in, meta_entry_in, sm_home_in, AtomicFormatVersion, BlockRef,
    FormatVersion, Layout, Node, Region, SmKind, SmPage, Superblock, BLOCK_SIZE, BLOCK_SIZE_U64,
    MAX_GROWTHS,
};
use arbor_io::BlockDevice;
use lru::LruCache;

use crate::error::{Error, Result};

/// The pool's geometry: fixed parts from the superblock, and the regions
/// of the layout (see [`arbor_format::Layout`]), which only ever grow. The
/// regions are published lock-free, so lookups on the I/O paths take no
/// lock; only [`Geometry::grow_to`] (at open, or under the pool's commit
/// lock) adds any.
pub(crate) struct Geometry {
    pub chunk_size: u64,
    pub journal_pages: u64,
    pub journal_start: [u64; 2],
    /// The intent log area (first block, blocks): pools created at
    /// version 13 (`crate::intents`).
    pub intent_log: Option<(u64, u64)>,
    pub uuid: [u8; 16],
    /// How the chunks divide into leaves of the checksum tree.
    pub sums: arbor_format::SumsGeometry,
    /// The superblock as read or written at creation (its geometry never changes).
    superblock: Superblock,
    /// The pool's format version (1 until upgraded).
    version: AtomicFormatVersion,
    /// Region `i` once `i < published`.
    regions: Vec<OnceLock<Region>>,
    published: AtomicUsize,
    /// The same regions, for commit records and growth planning.
    layout: Mutex<Layout>,
}

impl Geometry {
    /// The geometry of region 0 (grow it with [`Self::grow_to`]).
    pub fn new(sb: &Superblock, version: FormatVersion) -> Self {
        let geo = Self {
            chunk_size: u64::from(sb.chunk_size.get()),
            journal_pages: u64::from(sb.journal_pages.get()),
            journal_start: [sb.journal_start[0].get(), sb.journal_start[1].get()],
            intent_log: sb.log_area(),
            uuid: sb.uuid,
            sums: arbor_format::SumsGeometry::new(sb.chunk_size.get()).unwrap_or_else(|e| {
                unreachable!("a superblock's chunk size is validated when it is read: {e}")
            }),
            superblock: *sb,
            version: AtomicFormatVersion::new(version),
            regions: (0..=MAX_GROWTHS).map(|_| OnceLock::new()).collect(),
            published: AtomicUsize::new(0),
            layout: Mutex::new(Layout::from_superblock(sb)),
        };
        geo.publish(Layout::from_superblock(sb));
        geo
    }

    /// Makes every region of `layout` (a superset of the current one) visible.
    fn publish(&self, layout: Layout) {
        let regions = layout.regions();
        for (i, region) in regions.iter().enumerate() {
            // Set once: a region, once published, never changes.
            let _ = self.regions[i].set(*region);
        }
        self.published.store(regions.len(), Ordering::Release);
        *lock(&self.layout) = layout;
    }

    /// Adds the regions of `layout` beyond the current ones: at open, a
    /// commit's layout; online, the region a growth planned (the caller
    /// holds the commit lock and the metadata lock, so no commit and no
    /// allocation sees half of it).
    pub fn grow_to(&self, layout: Layout) {
        debug_assert!(layout.regions().starts_with(lock(&self.layout).regions()));
        self.publish(layout);
    }

    pub fn layout(&self) -> Layout {
        lock(&self.layout).clone()
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    pub fn version(&self) -> FormatVersion {
        self.version.get()
    }

    /// Page images one commit may journal now ([`arbor_format::journal_capacity`]).
    pub fn journal_capacity(&self) -> u64 {
        arbor_format::journal_capacity(self.version(), self.journal_pages)
    }

    pub fn set_version(&self, version: FormatVersion) {
        self.version.set(version);
    }

    fn regions(&self) -> impl DoubleEndedIterator<Item = &Region> {
        let n = self.published.load(Ordering::Acquire);
        self.regions[..n].iter().filter_map(OnceLock::get)
    }

    fn first(&self) -> &Region {
        // Region 0 is published by `new`.
        self.regions()
            .next()
            .unwrap_or_else(|| unreachable!("region 0 is published at creation"))
    }

    fn last(&self) -> &Region {
        // Region 0 is published by `new`.
        self.regions()
            .next_back()
            .unwrap_or_else(|| unreachable!("region 0 is published at creation"))
    }

    /// Metadata blocks of every region (entries are numbered across them).
    pub fn meta_blocks(&self) -> u64 {
        let last = self.last();
        last.meta_base + last.meta_blocks
    }

    /// Data chunks of every region.
    pub fn data_chunks(&self) -> u64 {
        let last = self.last();
        last.data_base + last.data_chunks
    }

    /// The byte just past the pool's last region (at least the size the
    /// pool was created with).
    pub fn pool_bytes(&self) -> u64 {
        self.last()
            .end_bytes(self.chunk_size)
            .max(self.superblock.pool_bytes.get())
    }

    /// Byte offset of the first region's data.
    pub fn first_data_bytes(&self) -> u64 {
        self.first().data_start_bytes
    }

    /// Home block of a space-map page.
    pub fn sm_home(&self, kind: SmKind, index: u32) -> Result<u64> {
        sm_home_in(self.regions(), kind, u64::from(index)).ok_or_else(|| {
            Error::inconsistent(format!("{kind:?} space-map page {index} beyond the map"))
        })
    }

    /// The metadata space-map entry of a block, if it is a metadata block.
    pub fn meta_entry(&self, block: u64) -> Option<u64> {
        meta_entry_in(self.regions(), block)
    }

    /// The block of a metadata space-map entry.
    pub fn meta_block(&self, entry: u64) -> Option<u64> {
        meta_block_in(self.regions(), entry)
    }

    pub fn is_meta_block(&self, block: u64) -> bool {
        self.meta_entry(block).is_some()
    }

    /// Byte offset of data chunk `pchunk` and how many chunks from it on
    /// are contiguous on the device (to the end of its region). Consecutive
    /// chunk numbers in two regions are not: a read of an extent that
    /// crosses a region's end is split there. The caller passes a chunk
    /// below `data_chunks()` (mapping values are validated on read).
    pub fn chunk_run(&self, pchunk: u64) -> (u64, u64) {
        // Not reachable for a validated chunk; past the device, so the I/O
        // fails rather than touching another chunk.
        chunk_run_in(self.regions(), self.chunk_size, pchunk)
            .unwrap_or((u64::MAX - self.chunk_size, 1))
    }

    /// The data chunk holding device byte `offset`, and the offset within
    /// it; None outside every region's data.
    pub fn chunk_at(&self, offset: u64) -> Option<(u64, u64)> {
        self.regions().find_map(|r| {
            let within = offset.checked_sub(r.data_start_bytes)?;
            let index = within / self.chunk_size;
            (index < r.data_chunks).then(|| (r.data_base + index, within % self.chunk_size))
        })
    }

    /// Byte offset of a data chunk (see [`Self::chunk_run`]).
    pub fn chunk_offset(&self, pchunk: u64) -> u64 {
        self.chunk_run(pchunk).0
    }
}

/// Device + geometry + clean-metadata caches.
pub(crate) struct Store {
    pub dev: Arc<dyn BlockDevice>,
    pub geo: Geometry,
    nodes: Mutex<NodeCache>,
    pages: Mutex<LruCache<(SmKind, u32), Arc<SmPage>>>,
}

/// A map keyed by block number, with a fast hasher (seeded per map): the
/// node cache's and the open transaction's maps, looked up on every step
/// of every tree walk.
pub(crate) type BlockMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;

pub(crate) struct CachedNode {
    pub txn: u64,
    pub node: Node,
}

/// Clean decoded nodes, least recently used evicted first, bounded by the
/// memory they take decoded (a packed leaf decodes to up to 448 entries of
/// 56 bytes and a key, more than its 4 KiB block), so the cache holds to the budget
/// the user gave in bytes.
struct NodeCache {
    lru: LruCache<u64, Arc<CachedNode>, foldhash::fast::RandomState>,
    bytes: usize,
    budget: usize,
}

impl NodeCache {
    fn new(budget: usize) -> Self {
        Self {
            lru: LruCache::unbounded_with_hasher(foldhash::fast::RandomState::default()),
            bytes: 0,
            budget,
        }
    }

    /// Memory a decoded node takes, roughly: its entries and a header.
    fn weight(node: &CachedNode) -> usize {
        let body = match &node.node.body {
            arbor_format::NodeBody::Leaf(values) => values.len(),
            arbor_format::NodeBody::Internal(children) => children.len() * BlockRef::ENCODED_LEN,
        };
        128 + node.node.keys.len() * 8 + body
    }

    fn get(&mut self, block: &u64) -> Option<&Arc<CachedNode>> {
        self.lru.get(block)
    }

    fn put(&mut self, block: u64, node: Arc<CachedNode>) {
        self.bytes += Self::weight(&node);
        if let Some(old) = self.lru.put(block, node) {
            self.bytes -= Self::weight(&old);
        }
        while self.bytes > self.budget && self.lru.len() > 1 {
            match self.lru.pop_lru() {
                Some((_, old)) => self.bytes -= Self::weight(&old),
                None => break,
            }
        }
    }

    fn pop(&mut self, block: &u64) {
        if let Some(old) = self.lru.pop(block) {
            self.bytes -= Self::weight(&old);
        }
    }
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
            nodes: Mutex::new(NodeCache::new(nodes.get() * BLOCK_SIZE)),
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
        let node = Node::decode(&raw[..], r)
            .map_err(|e| Error::corrupt(format!("metadata block {}", r.block), e))?;
        if node.packed && !self.geo.version().has_packed_leaves() {
            return Err(Error::corrupt(
                format!("metadata block {}", r.block),
                arbor_format::FormatError::Invalid(format!(
                    "a packed leaf in a version {} pool",
                    self.geo.version()
                )),
            ));
        }
        Ok(node)
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
        let home = self.geo.sm_home(kind, index)?;
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
