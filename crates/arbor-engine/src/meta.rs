//! The transaction manager: the in-memory state of the transaction being
//! built on top of the last commit, node allocation and shadowing
//! (copy-on-write), and the commit protocol.
//!
//! Commit protocol (see docs/FORMAT.md, "Commit protocol"):
//! 1. write the home pages journalled by the *previous* commit (deferred so
//!    that the previous commit stays replayable until this one is durable);
//! 2. write every node allocated in this transaction to its fresh block;
//! 3. flush (new nodes, data and deferred pages are durable);
//! 4. write the commit record + images of every space-map page this
//!    transaction changed into journal area `txn % 2`;
//! 5. flush. The commit record is the commit point: on open, the newest
//!    valid record of the two areas wins and its page images are replayed.
//!
//! From format version 9 the page images are written in step 2 (durable
//! by the flush of step 3) and the record in step 4 twice, in the area's
//! first and last blocks: a record that verifies then always has intact
//! images, so damaged images are damage, not a torn commit ([`recover`]).
//!
//! Commits are pipelined so that I/O does not wait for the device: phase A
//! ([`Meta::begin_commit`], brief, exclusive) freezes the transaction into a
//! [`CommitJob`] and opens the next one; phase B ([`CommitJob::write`])
//! does the writes and flushes above with no lock held; phase C
//! ([`Meta::finish_commit`], brief) publishes the result. Between A and C
//! readers find the frozen nodes and pages in the in-flight overlays, and
//! entries freed by the frozen transaction stay unallocatable.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;

use arbor_format::{
    BlockRef, CommitRecord, Layout, MapValue, Node, NodeBody, SmKind, SmPage, TreeKind,
};
use tracing::warn;
use zerocopy::little_endian::U64;

use crate::error::{Error, Resource, Result};
use crate::spacemap::{SmSavepoint, SpaceMap};
use crate::store::{BlockMap, CachedNode, Geometry, PreservedPages, Store};
use crate::undo::{Mark, UndoLog};

pub(crate) mod btree;

use btree::{Tree, TreeMut};

/// A node as seen by a reader: borrowed from the transaction's dirty set or
/// shared from the clean cache.
pub(crate) enum NodeView<'a> {
    Dirty(&'a Node),
    Clean(Arc<crate::store::CachedNode>),
}

impl Deref for NodeView<'_> {
    type Target = Node;
    fn deref(&self) -> &Node {
        match self {
            NodeView::Dirty(n) => n,
            NodeView::Clean(c) => &c.node,
        }
    }
}

/// Who is allocating metadata: ordinary writes must leave the reserve alone,
/// so that a pool whose metadata is nearly full can still delete, reclaim and
/// commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privilege {
    Normal,
    Reserve,
}

pub(crate) struct Meta {
    store: Arc<Store>,
    /// The transaction being built: last committed txn + 1.
    txn: u64,
    /// Nodes allocated in this transaction, by block number.
    dirty: BlockMap<Node>,
    /// Encoded bytes of dirty packed leaves, kept by inserts and single
    /// removals so that they need not measure a whole leaf each time
    /// (`meta::btree`); any other change to a node forgets its entry.
    leaf_bytes: BlockMap<usize>,
    /// Nodes of the transaction being committed (phase B), not yet on disk.
    inflight_nodes: BlockMap<Arc<CachedNode>>,
    meta_sm: SpaceMap,
    data_sm: SpaceMap,
    queue_root: BlockRef,
    next_queue_seq: u64,
    /// The data checksum tree (`crate::sums`; version 10, else empty).
    sums_root: BlockRef,
    /// The set of regions written in place (`crate::intents`; version 10).
    intents_root: BlockRef,
    /// When each intent region was last written in place (in memory: what
    /// `crate::intents` evicts by).
    pub(crate) intent_writes: HashMap<u64, std::time::Instant>,
    /// Regions a write found missing from the set, to add in a step of
    /// their own (kept when the write's step fails: see `crate::intents`).
    pub(crate) intents_wanted: Vec<u64>,
    /// The transaction whose durability would have let the running step
    /// overwrite in place what it redirected for the crash rule (0: none;
    /// taken by the write path: `crate::intents::take_await`).
    pub(crate) intents_await: u64,
    /// What the intent log holds since the last commit (`crate::intents`).
    pub(crate) intent_log: crate::intents::LogState,
    /// Who the running step allocates for (set by [`Meta::begin_step`] only).
    privilege: Privilege,
    /// Metadata blocks kept back from ordinary writes.
    meta_reserve: u64,
    dirty_node_limit: usize,
    /// The last committed transaction when the pool was opened.
    opened_txn: u64,
    /// Between phase A and phase C of a commit.
    commit_in_flight: bool,
    /// The pool grew since the last commit (which must name the new region).
    grown: bool,
    /// The record of the newest commit (durable once no commit is in flight).
    last_record: CommitRecord,
    /// The reclaim-queue entry that holds a volume's earlier tree for a
    /// unit running in pieces (`volumes::hold_tree`): reclaim stops there.
    held_queue_seq: Option<u64>,
    /// How to undo node changes since the oldest open savepoint.
    node_log: UndoLog<NodeUndo>,
    /// Blocks whose state before the oldest open savepoint is in `node_log`
    /// (or that the savepoint's operations created): later changes to them
    /// need no further logging.
    node_logged: HashSet<u64>,
}

/// How to undo one change to the dirty-node set.
enum NodeUndo {
    /// The block was not dirty: remove it.
    Added(u64),
    /// The block held this node: put it back.
    Held(u64, Node),
    /// Bytes `at..at + len` of the block's leaf values held `old[..len]`
    /// (`Meta::patch_dirty`): put them back.
    Patch {
        block: u64,
        at: usize,
        len: u8,
        old: [u8; PATCH_PIECE],
    },
}

/// The most bytes one [`NodeUndo::Patch`] holds (a longer span is logged in
/// pieces).
const PATCH_PIECE: usize = 16;

/// Everything a rollback needs to restore the transaction (see [`Meta::begin_step`]).
pub(crate) struct Savepoint {
    queue_root: BlockRef,
    sums_root: BlockRef,
    intents_root: BlockRef,
    next_queue_seq: u64,
    privilege: Privilege,
    meta_sm: SmSavepoint,
    data_sm: SmSavepoint,
    nodes: Mark,
}

/// What a commit record says of the volume layer: its table's tree and the
/// next volume id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VolumeRoots {
    pub root: BlockRef,
    pub next_id: u64,
}

impl VolumeRoots {
    pub fn of(record: &CommitRecord) -> Self {
        Self {
            root: record.volumes_root.into(),
            next_id: record.next_volume_id.get(),
        }
    }
}

/// An open atomic step ([`Meta::begin_step`]); ended only by
/// [`Meta::end_step`].
#[must_use = "a step must be ended with Meta::end_step"]
pub(crate) struct Step(Savepoint);

/// A frozen transaction: everything the writes of phase B need.
pub(crate) struct CommitJob {
    txn: u64,
    /// The previous commit's pages whose home copies are due.
    home_pages: Vec<Arc<SmPage>>,
    nodes: Vec<(u64, Arc<CachedNode>)>,
    /// Commit record followed by the page images.
    journal: Vec<u8>,
    area: u64,
    /// Blocks of the area holding a copy of the record (counted from its
    /// first: [`arbor_format::record_copies`]).
    record_copies: Vec<u64>,
    /// Version 9: the images are written with the nodes, before the
    /// record.
    images_first: bool,
}

impl CommitJob {
    /// Phase B: steps 1 to 5 of the commit protocol. Holds no lock; the
    /// caller runs one job at a time.
    /// With `preserve` (a check is walking an earlier commit), each home
    /// page's old image is kept there before it is overwritten.
    pub fn write(&self, store: &Store, preserve: Option<&PreservedPages>) -> Result<()> {
        // Step 1: the home pages and the nodes, in batches of contiguous
        // runs the device may write at once (they are independent: the
        // flush below orders them before the record). A check walking an
        // earlier commit keeps each page's old image before it is
        // overwritten, and reads it from there from then on.
        let mut blocks = Vec::with_capacity(self.home_pages.len() + self.nodes.len());
        for page in &self.home_pages {
            if let Some(preserve) = preserve {
                drop(preserve.keep_home(store, page.kind, page.index)?);
            }
            blocks.push((store.geo.sm_home(page.kind, page.index)?, Block::Page(page)));
        }
        blocks.extend(
            self.nodes
                .iter()
                .map(|(block, node)| (*block, Block::Node(node))),
        );
        blocks.sort_unstable_by_key(|(block, _)| *block);
        let (record, images) = self.journal.split_at(arbor_format::BLOCK_SIZE);
        if self.images_first && !images.is_empty() {
            // Version 9: the images are durable before either record copy.
            store
                .dev
                .write_at(images, (self.area + 1) * arbor_format::BLOCK_SIZE_U64)?;
        }
        for batch in blocks.chunks(COMMIT_BATCH_BLOCKS) {
            let runs = contiguous_runs(batch, |block, item| match item {
                Block::Page(page) => page.encode(),
                Block::Node(node) => node.node.encode(block, self.txn),
            });
            let writes: Vec<(u64, &[u8])> = runs
                .iter()
                .map(|(first, data)| (first * arbor_format::BLOCK_SIZE_U64, &data[..]))
                .collect();
            store.dev.write_batch(&writes)?;
        }
        for page in &self.home_pages {
            store.cache_sm_page(Arc::clone(page));
        }
        store.dev.flush()?;
        if self.images_first {
            write_record_copies(store, self.area, &self.record_copies, record)?;
        } else {
            store
                .dev
                .write_at(&self.journal, self.area * arbor_format::BLOCK_SIZE_U64)?;
        }
        store.dev.flush()?;
        Ok(())
    }
}

/// Writes `record` (one block) into each of `copies` (blocks counted from
/// journal area `area`'s first); the caller flushes.
pub(crate) fn write_record_copies(
    store: &Store,
    area: u64,
    copies: &[u64],
    record: &[u8],
) -> Result<()> {
    for copy in copies {
        store
            .dev
            .write_at(record, (area + copy) * arbor_format::BLOCK_SIZE_U64)?;
    }
    Ok(())
}

/// Blocks of a commit encoded and written at once (4 MiB).
const COMMIT_BATCH_BLOCKS: usize = 1024;

/// Most entries this pool's packed leaves get: the format's limit when one
/// leaf's extents (two data space-map pages each, when a shared leaf is
/// shadowed or a dropped one freed) fit its journal with room for the rest
/// of the step, and never fewer than a fixed leaf holds (pools made with a
/// small journal keep version 5's leaf size).
pub(crate) fn packed_leaf_entries(journal_pages: u64) -> usize {
    let fits = usize::try_from(journal_pages.saturating_sub(64) / 2).unwrap_or(usize::MAX);
    fits.clamp(
        arbor_format::leaf_capacity(TreeKind::Mapping),
        arbor_format::PACKED_LEAF_MAX,
    )
}

/// A block a commit writes.
enum Block<'a> {
    Page(&'a Arc<SmPage>),
    Node(&'a Arc<CachedNode>),
}

/// `blocks` (sorted by block number, each once) encoded into runs of
/// consecutive blocks: (first block, the run's bytes).
fn contiguous_runs<T>(
    blocks: &[(u64, T)],
    encode: impl Fn(u64, &T) -> [u8; arbor_format::BLOCK_SIZE],
) -> Vec<(u64, Vec<u8>)> {
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    for (block, item) in blocks {
        let image = encode(*block, item);
        match runs.last_mut() {
            Some((first, data))
                if *first + (data.len() / arbor_format::BLOCK_SIZE) as u64 == *block =>
            {
                data.extend_from_slice(&image[..]);
            }
            _ => runs.push((*block, image.to_vec())),
        }
    }
    runs
}

/// What a pool needs from its last commit to resume.
pub(crate) struct Resume {
    pub record: CommitRecord,
}

/// Metadata blocks kept back from ordinary writes in a pool of `blocks`:
/// 1% (64 ..= 4096), at most a quarter.
fn meta_reserve(blocks: u64) -> u64 {
    (blocks / 100).clamp(64, 4096).min(blocks / 4)
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Meta {
    pub fn resume(store: Arc<Store>, resume: Resume, dirty_node_limit: usize) -> Result<Self> {
        let rec = resume.record;
        let geo = &store.geo;
        // No real pool gets near 2^63 commits; a record claiming so is damaged
        // (and later txn arithmetic would overflow).
        if rec.txn.get() >= 1 << 63 {
            return Err(Error::inconsistent(format!(
                "commit record claims transaction {}",
                rec.txn.get()
            )));
        }
        let meta_sm = SpaceMap::new(
            SmKind::Meta,
            geo.meta_blocks(),
            rec.meta_used.get(),
            rec.meta_cursor.get(),
        )?;
        let data_sm = SpaceMap::new(
            SmKind::Data,
            geo.data_chunks(),
            rec.data_used.get(),
            rec.data_cursor.get(),
        )?;
        let meta_reserve = meta_reserve(geo.meta_blocks());
        let (sums_root, intents_root) = Self::own_roots_in(&store, &rec);
        Ok(Self {
            store,
            txn: rec.txn.get() + 1,
            dirty: BlockMap::default(),
            leaf_bytes: BlockMap::default(),
            inflight_nodes: BlockMap::default(),
            meta_sm,
            data_sm,
            queue_root: rec.queue_root.into(),
            sums_root,
            intents_root,
            intent_writes: HashMap::new(),
            intents_wanted: Vec::new(),
            intents_await: 0,
            intent_log: Default::default(),
            next_queue_seq: rec.next_queue_seq.get(),
            privilege: Privilege::Normal,
            meta_reserve,
            dirty_node_limit,
            opened_txn: rec.txn.get(),
            commit_in_flight: false,
            grown: false,
            last_record: rec,
            held_queue_seq: None,
            node_log: UndoLog::default(),
            node_logged: HashSet::new(),
        })
    }

    /// The privilege of the running step.
    #[cfg(test)]
    pub fn privilege(&self) -> Privilege {
        self.privilege
    }

    /// The record of the newest commit: durable when no commit is in flight.
    pub fn last_record(&self) -> &CommitRecord {
        &self.last_record
    }

    /// Whether a commit is between phases A and C.
    pub fn commit_in_flight(&self) -> bool {
        self.commit_in_flight
    }

    /// The transaction of the newest commit known durable: the last
    /// record's, or the one before it while that record's commit is in
    /// flight (transactions are numbered one after another).
    pub fn durable_txn(&self) -> u64 {
        let newest = self.last_record.txn.get();
        if self.commit_in_flight {
            newest.saturating_sub(1)
        } else {
            newest
        }
    }

    // ---- what the layers above may read and count --------------------------

    /// The device, geometry and caches.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn geo(&self) -> &Geometry {
        &self.store.geo
    }

    /// The open transaction (the last committed one + 1).
    pub fn txn(&self) -> u64 {
        self.txn
    }

    /// The last committed transaction when the pool was opened.
    pub fn opened_txn(&self) -> u64 {
        self.opened_txn
    }

    fn space_map(&self, kind: SmKind) -> &SpaceMap {
        match kind {
            SmKind::Meta => &self.meta_sm,
            SmKind::Data => &self.data_sm,
        }
    }

    /// Entries in use (referenced) in the open transaction.
    pub fn used(&self, kind: SmKind) -> u64 {
        self.space_map(kind).used()
    }

    /// Entries a step could allocate now (see [`SpaceMap::allocatable`]).
    #[cfg(test)]
    pub fn allocatable(&self, kind: SmKind) -> u64 {
        self.space_map(kind).allocatable()
    }

    /// Entries the space map counts (every region's).
    pub fn entries(&self, kind: SmKind) -> u64 {
        self.space_map(kind).entries()
    }

    /// The committed space-map pages held in memory, by page index.
    pub fn committed_pages(&self, kind: SmKind) -> HashMap<u32, Arc<SmPage>> {
        self.space_map(kind).committed_pages()
    }

    /// The next-fit allocation cursor.
    #[cfg(test)]
    pub fn cursor(&self, kind: SmKind) -> u64 {
        self.space_map(kind).cursor()
    }

    /// Keeps every metadata block the last commit references from being
    /// allocated again until [`Self::unpin_committed_meta`] (a live check
    /// walks that commit). Call with no commit in flight.
    pub fn pin_committed_meta(&mut self) {
        self.meta_sm.pin();
    }

    pub fn unpin_committed_meta(&mut self) {
        self.meta_sm.unpin();
    }

    /// References to data chunk `chunk`.
    pub fn data_count(&self, chunk: u64) -> Result<u32> {
        self.data_sm.get(&self.store, chunk)
    }

    /// Drops one reference to data chunk `chunk`; returns how many are left.
    pub fn dec_data(&mut self, chunk: u64) -> Result<u32> {
        self.data_sm.dec(&self.store, chunk)
    }

    /// Drops one reference to each of `len` chunks from `start`.
    pub fn dec_data_range(&mut self, start: u64, len: u64) -> Result<()> {
        self.data_sm.dec_range(&self.store, start, len)
    }

    /// Whether data chunk `chunk` was allocated since the last durable
    /// commit (no durable state references it; the commit in flight may).
    pub fn data_allocated_since_durable(&self, chunk: u64) -> bool {
        self.data_sm.allocated_since_durable(chunk)
    }

    /// Whether data chunk `chunk` was allocated in the open transaction (no
    /// state a crash recovers to references it, even once the commit in
    /// flight lands).
    pub fn data_allocated_in_open_txn(&self, chunk: u64) -> bool {
        self.data_sm.allocated_in_open_txn(chunk)
    }

    /// Metadata blocks kept back from ordinary steps (tests set it to let
    /// them allocate a chosen number of blocks).
    #[cfg(test)]
    pub fn set_meta_reserve(&mut self, blocks: u64) {
        self.meta_reserve = blocks;
    }

    // ---- volume ids and the reclaim queue ---------------------------------------

    /// The root of the reclaim queue: trees whose references await dropping.
    pub fn queue_root(&self) -> BlockRef {
        self.queue_root
    }

    /// Appends a tree to the reclaim queue, which now owns the reference the
    /// caller held. Returns its queue entry (a sequence number).
    pub fn queue_push(&mut self, root: BlockRef) -> Result<u64> {
        let mut value = [0u8; BlockRef::ENCODED_LEN];
        root.encode(&mut value);
        let seq = self.next_queue_seq;
        let root = self.queue_root;
        let mut queue = TreeMut::new(self, TreeKind::Queue, root);
        queue.insert(seq, &value)?;
        self.queue_root = queue.root();
        self.next_queue_seq += 1;
        Ok(seq)
    }

    /// Takes the oldest tree off the reclaim queue (its reference passes to
    /// the caller); `None` when the queue is empty or its oldest entry is held
    /// ([`Self::hold_queue_entry`]).
    pub fn queue_pop(&mut self) -> Result<Option<BlockRef>> {
        let Some((seq, value)) = Tree::new(self, TreeKind::Queue, self.queue_root).first()? else {
            return Ok(None);
        };
        if self.held_queue_seq == Some(seq) {
            return Ok(None);
        }
        let root = self.queue_root;
        let mut queue = TreeMut::new(self, TreeKind::Queue, root);
        queue.remove(seq)?;
        self.queue_root = queue.root();
        Ok(Some(BlockRef::decode(&value)))
    }

    // ---- data checksums (`crate::sums`) -------------------------------------------

    /// The roots of the checksum tree and the in-place intent set that
    /// `rec` names: none before version 10 (those bytes are reserved then,
    /// and ignored on read).
    fn own_roots_in(store: &Store, rec: &CommitRecord) -> (BlockRef, BlockRef) {
        if store.geo.version().has_data_checksums() {
            (rec.sums_root.into(), rec.intents_root.into())
        } else {
            (BlockRef::NONE, BlockRef::NONE)
        }
    }

    /// [`Self::own_roots_in`] of this pool: (sums, intents).
    pub fn own_roots_of(&self, rec: &CommitRecord) -> (BlockRef, BlockRef) {
        Self::own_roots_in(&self.store, rec)
    }

    /// The root of the data checksum tree.
    pub fn sums_root(&self) -> BlockRef {
        self.sums_root
    }

    /// The root of the in-place intent set.
    pub fn intents_root(&self) -> BlockRef {
        self.intents_root
    }

    /// Runs `f` on the open transaction's data checksum tree
    /// (`TreeKind::Sums`) or in-place intent set (`TreeKind::Intents`),
    /// whose roots `Meta` keeps, keeping the new root.
    pub fn with_own_tree<T>(
        &mut self,
        kind: TreeKind,
        f: impl FnOnce(&mut TreeMut<'_>) -> Result<T>,
    ) -> Result<T> {
        let root = match kind {
            TreeKind::Intents => self.intents_root,
            _ => self.sums_root,
        };
        let mut tree = TreeMut::new(self, kind, root);
        let result = f(&mut tree);
        let root = tree.root();
        match kind {
            TreeKind::Intents => self.intents_root = root,
            _ => self.sums_root = root,
        }
        result
    }

    /// Forgets the whole reclaim queue (offline repair of a damaged queue:
    /// the space maps are rebuilt from the volumes afterwards).
    pub fn forget_queue(&mut self) {
        self.queue_root = BlockRef::NONE;
    }

    /// The record a repair writes: this transaction's, with the volume
    /// table and the counts it found.
    pub fn repair_record(
        &self,
        volumes: VolumeRoots,
        meta_used: u64,
        data_used: u64,
    ) -> CommitRecord {
        let mut rec = self.commit_record(volumes);
        rec.meta_used = U64::new(meta_used);
        rec.data_used = U64::new(data_used);
        rec
    }

    /// Holds reclaim back at queue entry `seq` until
    /// [`Self::unhold_queue_entry`].
    pub fn hold_queue_entry(&mut self, seq: u64) {
        debug_assert!(self.held_queue_seq.is_none(), "two held trees");
        self.held_queue_seq = Some(seq);
    }

    /// Ends the hold of [`Self::hold_queue_entry`]: the entry is reclaimed
    /// like any other.
    pub fn unhold_queue_entry(&mut self) {
        self.held_queue_seq = None;
    }

    /// Whether entries freed since the last commit wait for a commit to be
    /// allocatable again.
    pub fn awaiting_commit(&self) -> bool {
        self.data_sm.awaiting_commit() || self.meta_sm.awaiting_commit()
    }

    // ---- savepoints -----------------------------------------------------------

    /// Opens an atomic step of the open transaction, which the caller (the
    /// volume layer: `Volumes::atomic`) ends with [`Self::end_step`],
    /// passing the step's result. If the step failed, every change it made
    /// (nodes, space maps, the reclaim queue) is undone, so the transaction
    /// is exactly as before the step. A step that leaves more changed
    /// space-map pages than one commit can journal is undone too, with
    /// [`Resource::Journal`]: the caller commits and runs it again in
    /// an empty transaction. The step allocates metadata with `privilege`;
    /// the previous privilege is back when it ends.
    pub fn begin_step(&mut self, privilege: Privilege) -> Step {
        let sp = self.savepoint();
        self.privilege = privilege;
        Step(sp)
    }

    /// Ends a step opened by [`Self::begin_step`]: keeps its changes if
    /// `result` is a success that fits the journal, undoes them all
    /// otherwise.
    pub fn end_step<T>(&mut self, step: Step, result: Result<T>) -> Result<T> {
        let Step(sp) = step;
        let result = match result {
            Ok(_) if self.journal_pages_needed() > self.store.geo.journal_capacity() => {
                Err(Error::Exhausted(Resource::Journal))
            }
            other => other,
        };
        match result {
            Ok(value) => {
                self.release(sp);
                Ok(value)
            }
            Err(e) => {
                self.rollback(sp);
                Err(e)
            }
        }
    }

    fn savepoint(&mut self) -> Savepoint {
        Savepoint {
            queue_root: self.queue_root,
            sums_root: self.sums_root,
            intents_root: self.intents_root,
            next_queue_seq: self.next_queue_seq,
            privilege: self.privilege,
            meta_sm: self.meta_sm.savepoint(),
            data_sm: self.data_sm.savepoint(),
            nodes: self.node_log.begin(),
        }
    }

    fn release(&mut self, sp: Savepoint) {
        self.privilege = sp.privilege;
        self.meta_sm.release(sp.meta_sm);
        self.data_sm.release(sp.data_sm);
        self.node_log.release(sp.nodes);
        if self.node_log.idle() {
            self.node_logged.clear();
        }
    }

    fn rollback(&mut self, sp: Savepoint) {
        self.leaf_bytes.clear();
        let mut log = std::mem::take(&mut self.node_log);
        log.rollback(sp.nodes, |undo| {
            let block = match undo {
                NodeUndo::Added(block) => {
                    self.dirty.remove(&block);
                    block
                }
                NodeUndo::Held(block, node) => {
                    self.dirty.insert(block, node);
                    block
                }
                NodeUndo::Patch {
                    block,
                    at,
                    len,
                    old,
                } => {
                    // The node is dirty in the state this entry was logged
                    // in, which the entries after it (undone first) restored.
                    if let Some(NodeBody::Leaf(values)) =
                        self.dirty.get_mut(&block).map(|n| &mut n.body)
                    {
                        let len = usize::from(len);
                        if let Some(bytes) = values.get_mut(at..at + len) {
                            bytes.copy_from_slice(&old[..len]);
                        }
                    }
                    block
                }
            };
            self.node_logged.remove(&block);
        });
        self.node_log = log;
        self.meta_sm.rollback(sp.meta_sm);
        self.data_sm.rollback(sp.data_sm);
        self.queue_root = sp.queue_root;
        self.sums_root = sp.sums_root;
        self.intents_root = sp.intents_root;
        self.next_queue_seq = sp.next_queue_seq;
        self.privilege = sp.privilege;
        if self.node_log.idle() {
            self.node_logged.clear();
        }
    }

    /// Logs the state of block `block` before its first change in the open
    /// savepoints (`prior` builds the entry only when it is needed).
    fn log_node(&mut self, block: u64, prior: impl FnOnce() -> NodeUndo) {
        if self.node_log.recording() && self.node_logged.insert(block) {
            self.node_log.push(prior());
        }
    }

    /// Space-map page images the open transaction would journal.
    fn journal_pages_needed(&self) -> u64 {
        (self.meta_sm.dirty_pages() + self.data_sm.dirty_pages()) as u64
    }

    // ---- node access -------------------------------------------------------

    fn is_dirty(&self, r: BlockRef) -> bool {
        r.txn == self.txn && self.dirty.contains_key(&r.block)
    }

    pub fn node(&self, r: BlockRef) -> Result<NodeView<'_>> {
        if r.txn == self.txn {
            if let Some(n) = self.dirty.get(&r.block) {
                return Ok(NodeView::Dirty(n));
            }
        }
        if let Some(n) = self.inflight_nodes.get(&r.block) {
            if n.txn == r.txn {
                return Ok(NodeView::Clean(Arc::clone(n)));
            }
        }
        Ok(NodeView::Clean(self.store.read_node(r)?))
    }

    /// Removes a dirty node from the dirty set so the caller can mutate it
    /// while also using `self`; it must be returned with [`Self::put_dirty`].
    fn take_dirty(&mut self, r: BlockRef) -> Result<Node> {
        self.leaf_bytes.remove(&r.block);
        let node = self
            .dirty
            .remove(&r.block)
            .ok_or_else(|| Error::inconsistent(format!("block {} is not dirty", r.block)))?;
        self.log_node(r.block, || NodeUndo::Held(r.block, node.clone()));
        Ok(node)
    }

    fn put_dirty(&mut self, r: BlockRef, node: Node) {
        self.dirty.insert(r.block, node);
    }

    /// Changes value bytes `value` (a range of dirty leaf `r`'s values) in
    /// place with `f`, which may change only the bytes `spans` (offsets into
    /// the value): unless the open step logged the whole node already, it
    /// logs just those bytes for a rollback, not a copy of the node
    /// ([`TreeMut::update_spans`]). Debug builds check that `f` kept to
    /// `spans`.
    fn patch_dirty<T>(
        &mut self,
        r: BlockRef,
        value: std::ops::Range<usize>,
        spans: &[std::ops::Range<usize>],
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        self.leaf_bytes.remove(&r.block);
        let log = self.node_log.recording() && !self.node_logged.contains(&r.block);
        let values = match self.dirty.get_mut(&r.block).map(|n| &mut n.body) {
            Some(NodeBody::Leaf(values)) => values,
            _ => {
                return Err(Error::inconsistent(format!(
                    "block {} is not a dirty leaf",
                    r.block
                )))
            }
        };
        let fits = value.end <= values.len() && spans.iter().all(|s| s.end <= value.len());
        if !fits {
            return Err(Error::inconsistent(format!(
                "a change of bytes {spans:?} of value {value:?} in a leaf of {} bytes",
                values.len()
            )));
        }
        let mut undo = Vec::new();
        if log {
            for span in spans {
                let mut at = value.start + span.start;
                let end = value.start + span.end;
                while at < end {
                    let len = (end - at).min(PATCH_PIECE);
                    let mut old = [0u8; PATCH_PIECE];
                    old[..len].copy_from_slice(&values[at..at + len]);
                    // len <= PATCH_PIECE = 16 fits a u8.
                    undo.push(NodeUndo::Patch {
                        block: r.block,
                        at,
                        len: len as u8,
                        old,
                    });
                    at += len;
                }
            }
        }
        #[cfg(debug_assertions)]
        let before = values[value.clone()].to_vec();
        let out = f(&mut values[value.clone()]);
        #[cfg(debug_assertions)]
        {
            let after = &values[value.clone()];
            for (i, (a, b)) in before.iter().zip(after).enumerate() {
                debug_assert!(
                    a == b || spans.iter().any(|s| s.contains(&i)),
                    "byte {i} of a value changed outside the spans {spans:?}"
                );
            }
        }
        for entry in undo {
            self.node_log.push(entry);
        }
        Ok(out)
    }

    /// True when the transaction should be committed before more work is
    /// added: its journal and dirty-node set must stay bounded. One further
    /// operation touches at most ~260 pages (two per extent of one leaf).
    /// The most a node may hold here: its block's limit, and for a packed
    /// leaf this pool's entry limit ([`packed_leaf_entries`]).
    pub(crate) fn node_limit(&self, node: &Node) -> arbor_format::Usage {
        let mut limit = node.limit();
        if node.packed {
            limit.entries = limit
                .entries
                .min(packed_leaf_entries(self.store.geo.journal_pages));
        }
        limit
    }

    /// Whether `node` may be written as it is (else it must split).
    pub(crate) fn node_fits(&self, node: &Node) -> bool {
        node.usage().within(self.node_limit(node), 1, 1)
    }

    pub fn needs_commit(&self) -> bool {
        let pages = self.meta_sm.dirty_pages() + self.data_sm.dirty_pages();
        pages as u64 > self.store.geo.journal_capacity() / 2
            || self.dirty.len() > self.dirty_node_limit
    }

    /// Whether the transaction changed nodes, space maps or the layout
    /// since the last commit (the volume layer adds its table's changes:
    /// `Volumes::has_changes`).
    pub fn has_txn_changes(&self) -> bool {
        self.grown
            || !self.dirty.is_empty()
            || self.meta_sm.dirty_pages() > 0
            || self.data_sm.dirty_pages() > 0
    }

    // ---- allocation and reference counting ---------------------------------

    fn meta_entry(&self, block: u64) -> Result<u64> {
        self.store
            .geo
            .meta_entry(block)
            .ok_or_else(|| Error::inconsistent(format!("block {block} is not a metadata block")))
    }

    pub fn meta_count(&self, block: u64) -> Result<u32> {
        let entry = self.meta_entry(block)?;
        self.meta_count_entry(entry)
    }

    /// References to metadata space-map entry `entry`.
    pub fn meta_count_entry(&self, entry: u64) -> Result<u32> {
        self.meta_sm.get(&self.store, entry)
    }

    fn alloc_node(&mut self, node: Node) -> Result<BlockRef> {
        // Version 6 pools write mapping leaves packed: new ones, and older
        // ones as they are shadowed (those whose entries would not fit
        // packed stay as they are).
        let node =
            if !node.packed && node.packable() && self.store.geo.version().has_packed_leaves() {
                node.into_packed().unwrap_or_else(|fixed| fixed)
            } else {
                node
            };
        let reserve = match self.privilege {
            Privilege::Normal => self.meta_reserve,
            Privilege::Reserve => 0,
        };
        let entry = self
            .meta_sm
            .alloc(&self.store, reserve)?
            .ok_or(Error::Exhausted(Resource::Metadata))?;
        let block =
            self.store.geo.meta_block(entry).ok_or_else(|| {
                Error::inconsistent(format!("metadata entry {entry} has no block"))
            })?;
        self.store.forget_node(block);
        self.leaf_bytes.remove(&block);
        self.log_node(block, || NodeUndo::Added(block));
        self.dirty.insert(block, node);
        Ok(BlockRef {
            block,
            txn: self.txn,
        })
    }

    fn inc_node(&mut self, r: BlockRef) -> Result<()> {
        let entry = self.meta_entry(r.block)?;
        self.meta_sm.inc(&self.store, entry)
    }

    /// Drops one reference to a node without touching its children (the caller
    /// either transfers the children's references or queues them). Returns the
    /// new count; a node at zero leaves the dirty set.
    fn dec_node_shallow(&mut self, r: BlockRef) -> Result<u32> {
        let entry = self.meta_entry(r.block)?;
        let left = self.meta_sm.dec(&self.store, entry)?;
        if left == 0 {
            if let Some(node) = self.dirty.remove(&r.block) {
                self.log_node(r.block, || NodeUndo::Held(r.block, node));
            }
        }
        Ok(left)
    }

    /// The data chunks the open transaction freed, sorted.
    pub fn data_freed_in_txn(&self) -> Vec<u64> {
        self.data_sm.freed_in_txn()
    }

    /// Allocates a data chunk, its old sums cleared (FORMAT.md §6.4).
    pub fn alloc_data(&mut self) -> Result<u64> {
        let chunk = self
            .data_sm
            .alloc(&self.store, 0)?
            .ok_or(Error::Exhausted(Resource::DataSpace))?;
        crate::sums::forget_range(self, chunk..chunk + 1)?;
        Ok(chunk)
    }

    /// Finds `len` free data chunks contiguous on the device (in one region)
    /// and sets them aside until [`Self::alloc_data_run`] or
    /// [`Self::unreserve_data`]: their old content can be replaced first.
    pub fn reserve_data_run(&mut self, len: u64) -> Result<std::ops::Range<u64>> {
        let store = Arc::clone(&self.store);
        let entries = self.data_sm.entries();
        let limit = |start: u64| {
            if start >= entries {
                return start;
            }
            start + store.geo.chunk_run(start).1
        };
        let start = self
            .data_sm
            .find_free_run(&store, len, &limit)?
            .ok_or(Error::Exhausted(Resource::DataSpace))?;
        self.data_sm.reserve(start..start + len);
        Ok(start..start + len)
    }

    pub fn unreserve_data(&mut self, run: &std::ops::Range<u64>) {
        self.data_sm.unreserve(run)
    }

    /// Sets aside the data chunks of `run` (free, and found by the caller
    /// inside a run it set aside and just released).
    pub fn reserve_data(&mut self, run: std::ops::Range<u64>) {
        self.data_sm.reserve(run)
    }

    /// Sets aside the data chunks of `run` if they are all free, in one
    /// region of the device with the chunk before them (`NoSpace`
    /// otherwise).
    pub fn reserve_data_after(&mut self, run: std::ops::Range<u64>) -> Result<()> {
        let Some(before) = run.start.checked_sub(1) else {
            return Err(Error::Exhausted(Resource::DataSpace));
        };
        let in_region = self.store.geo.chunk_run(before).1 > run.end - before - 1;
        if !in_region || !self.data_sm.run_is_free(&self.store, run.clone())? {
            return Err(Error::Exhausted(Resource::DataSpace));
        }
        self.data_sm.reserve(run);
        Ok(())
    }

    /// Allocates the data chunks of `run`, set aside by
    /// [`Self::reserve_data_run`].
    pub fn alloc_data_run(&mut self, run: std::ops::Range<u64>) -> Result<()> {
        self.data_sm.alloc_run(&self.store, run.clone())?;
        crate::sums::forget_range(self, run)
    }

    /// Adds a reference to everything a node points at (used when a shared
    /// node is copied: both copies now reference the children).
    fn inc_children(&mut self, node: &Node) -> Result<()> {
        match &node.body {
            NodeBody::Internal(children) => {
                for child in children {
                    self.inc_node(*child)?;
                }
            }
            NodeBody::Leaf(_) if node.tree == TreeKind::Mapping => {
                let mut ranges = Vec::with_capacity(node.len());
                for i in 0..node.len() {
                    ranges.extend(decode_map_value(node, i)?.chunk_runs());
                }
                self.data_sm.inc_ranges(&self.store, &mut ranges)?;
            }
            NodeBody::Leaf(_) => {}
        }
        Ok(())
    }

    /// Makes `r` writable in this transaction: returns a dirty node with a
    /// single reference holding the same entries (Rodeh's "shadowing").
    fn shadow(&mut self, r: BlockRef) -> Result<BlockRef> {
        let count = self.meta_count(r.block)?;
        if self.is_dirty(r) && count == 1 {
            return Ok(r);
        }
        let copy = self.node(r)?.clone();
        if count > 1 {
            // Still shared by others: both copies now reference the children.
            self.inc_children(&copy)?;
        }
        // count == 1: the old block's references pass to the copy.
        self.dec_node_shallow(r)?;
        self.alloc_node(copy)
    }

    // ---- commit ---------------------------------------------------------------

    /// Commits in one go (phases A, B and C), for single-threaded callers.
    /// On error the caller must stop using the pool.
    /// The volume table is the last commit's (tests of the layers below).
    #[cfg(test)]
    pub fn commit(&mut self) -> Result<()> {
        let job = self.begin_commit(VolumeRoots::of(&self.last_record))?;
        job.write(&self.store, None)?;
        self.finish_commit(job);
        Ok(())
    }

    /// Phase A: freezes the transaction into a job, with `volumes` (the
    /// volume layer stored its records first: `Volumes::begin_commit`), and
    /// opens the next transaction. Must run with writers quiesced.
    pub fn begin_commit(&mut self, volumes: VolumeRoots) -> Result<CommitJob> {
        debug_assert!(self.node_log.idle(), "a commit inside an operation");
        // Every node must fit its block before any is written (the B-tree
        // splits first; a packed leaf's size is known from its changes).
        for (block, node) in &self.dirty {
            let fits = match self.leaf_bytes.get(block) {
                Some(&bytes) => {
                    debug_assert_eq!(bytes, node.usage().bytes, "block {block}");
                    let usage = arbor_format::Usage {
                        bytes,
                        entries: node.len(),
                    };
                    usage.within(node.limit(), 1, 1)
                }
                None => node.fits(),
            };
            if !fits {
                return Err(Error::inconsistent(format!(
                    "node {block} does not fit its block: {:?}",
                    node.usage()
                )));
            }
        }
        self.leaf_bytes.clear();
        let geo = &self.store.geo;
        let mut home_pages = self.meta_sm.home_pages_due();
        home_pages.extend(self.data_sm.home_pages_due());
        let mut nodes: Vec<(u64, Arc<CachedNode>)> = self
            .dirty
            .drain()
            .map(|(block, node)| {
                (
                    block,
                    Arc::new(CachedNode {
                        txn: self.txn,
                        node,
                    }),
                )
            })
            .collect();
        nodes.sort_by_key(|(block, _)| *block);
        self.inflight_nodes = nodes.iter().map(|(b, n)| (*b, Arc::clone(n))).collect();
        let mut pages = self.meta_sm.freeze(self.txn);
        pages.extend(self.data_sm.freeze(self.txn));
        let version = geo.version();
        if pages.len() as u64 > geo.journal_capacity() {
            return Err(Error::inconsistent(format!(
                "transaction changed {} space-map pages, journal holds {}",
                pages.len(),
                geo.journal_capacity()
            )));
        }
        let mut record = self.commit_record(volumes);
        let journal = arbor_format::encode_journal(&mut record, version, &pages)
            .map_err(|e| Error::inconsistent(format!("commit record: {e}")))?;
        self.last_record = record;
        let job = CommitJob {
            txn: self.txn,
            home_pages,
            nodes,
            journal,
            area: geo.journal_start[(self.txn % 2) as usize],
            record_copies: arbor_format::record_copies(version, geo.journal_pages),
            images_first: version.has_mirrored_commit_records(),
        };
        self.txn += 1;
        self.commit_in_flight = true;
        self.grown = false;
        Ok(job)
    }

    /// Phase C: the job is durable. Its nodes move to the cache, its pages
    /// become the committed copies, its freed entries become allocatable.
    pub fn finish_commit(&mut self, job: CommitJob) {
        for (block, node) in job.nodes {
            self.store.cache_node(block, node);
        }
        self.inflight_nodes.clear();
        self.meta_sm.thaw();
        self.data_sm.thaw();
        self.commit_in_flight = false;
        // The set as this commit wrote it lists every region the log did.
        self.intent_log = Default::default();
    }

    /// The record of this transaction (its journal's page count and
    /// checksum are set by `encode_journal`).
    fn commit_record(&self, volumes: VolumeRoots) -> CommitRecord {
        let mut rec = CommitRecord::new_zeroed_record();
        rec.uuid = self.store.geo.uuid;
        rec.txn = U64::new(self.txn);
        rec.volumes_root = volumes.root.into();
        rec.queue_root = self.queue_root.into();
        rec.sums_root = self.sums_root.into();
        rec.intents_root = self.intents_root.into();
        rec.next_volume_id = U64::new(volumes.next_id);
        rec.next_queue_seq = U64::new(self.next_queue_seq);
        rec.meta_used = U64::new(self.meta_sm.used());
        rec.data_used = U64::new(self.data_sm.used());
        rec.meta_cursor = U64::new(self.meta_sm.cursor());
        rec.data_cursor = U64::new(self.data_sm.cursor());
        rec.commit_unix_secs = U64::new(unix_now());
        self.store.geo.layout().store(&mut rec);
        rec
    }

    /// Takes on the grown region of `layout` (formatted and flushed by the
    /// caller, who commits next): the geometry maps its blocks and chunks,
    /// the space maps count them. Run with writers held off.
    pub fn grow(&mut self, layout: Layout) -> Result<()> {
        debug_assert!(self.node_log.idle(), "a growth inside an operation");
        let meta_entries = layout.entries(SmKind::Meta);
        let data_entries = layout.entries(SmKind::Data);
        self.store.geo.grow_to(layout);
        self.meta_sm.grow(meta_entries)?;
        self.data_sm.grow(data_entries)?;
        self.meta_reserve = meta_reserve(meta_entries);
        self.grown = true;
        Ok(())
    }
}

/// What [`recover`] found.
pub(crate) enum Recovered {
    /// The newest commit, its page images replayed to their homes;
    /// `repaired` names each damaged record copy rewritten from the intact
    /// one.
    Intact {
        resume: Resume,
        repaired: Vec<String>,
    },
    /// The newest commit's record verifies but its page images do not
    /// (`why`): in format version 9 they were durable before the record,
    /// so this is damage, not a torn commit, and the pool must not open at
    /// the previous commit. Nothing was written; its space maps are to be
    /// rebuilt from its trees (`repair`). The geometry has its layout.
    ImagesDamaged { resume: Resume, why: String },
}

/// Finds the newest commit record (the highest `txn` among the copies that
/// verify in both areas: [`arbor_format::choose_area_record`]) and
/// replays its page images to their home blocks. If they are damaged, a
/// record of version 8 or older may be a torn commit and the previous one
/// is used; one of version 9 is damage ([`Recovered::ImagesDamaged`]).
/// Damaged copies of the chosen record are rewritten from the intact one.
/// Only the newest record's pages are read unless they prove damaged, so
/// opening costs at most one journal area whatever the size of the pool
/// or of its mappings.
pub(crate) fn recover(store: &Store) -> Result<Recovered> {
    let geo = &store.geo;
    let mut candidates = Vec::new();
    for area in geo.journal_start {
        let head = store.read_block(area)?;
        let tail = store.read_block(area + geo.journal_pages)?;
        let accept = |record: &CommitRecord, version| plausible(store, record, version);
        if let Some(found) =
            arbor_format::choose_area_record(&head[..], &tail[..], geo.journal_pages, accept)
        {
            candidates.push((area, found));
        }
    }
    candidates.sort_by_key(|(_, found)| std::cmp::Reverse(found.record.txn.get()));
    for (area, found) in candidates {
        let record = found.record;
        let txn = record.txn.get();
        let mirrored = found.version.has_mirrored_commit_records();
        let layout = match Layout::from_record(geo.superblock(), &record, store.dev.size()) {
            Ok(layout) => layout,
            Err(e) if mirrored => {
                return Err(Error::inconsistent(format!(
                    "commit {txn} (journal area at block {area}) verifies but its layout is unusable: {e}; the pool is not opened at an older commit"
                )))
            }
            Err(e) => {
                warn!(area, txn, error = %e, "commit record's layout is unusable; using the previous commit");
                continue;
            }
        };
        match read_journal_pages(store, area, &record, &layout)? {
            Some(pages) => {
                // Every region this commit names is formatted and durable
                // (growth flushes them before the commit that names them).
                geo.grow_to(layout);
                for page in &pages {
                    store.write_block(geo.sm_home(page.kind, page.index)?, &page.encode())?;
                }
                let mut repaired = Vec::new();
                if !found.damaged_copies.is_empty() {
                    write_record_copies(store, area, &found.damaged_copies, &found.block)?;
                    for copy in &found.damaged_copies {
                        let note = format!(
                            "commit {txn}: the record copy at block {} was damaged or stale; rewritten from the intact copy",
                            area + copy
                        );
                        warn!("{note}");
                        repaired.push(note);
                    }
                }
                store.dev.flush()?;
                return Ok(Recovered::Intact {
                    resume: Resume { record },
                    repaired,
                });
            }
            None if mirrored => {
                let why = format!(
                    "commit {txn}'s space-map page images (journal area at block {area}) are damaged; they were durable before its record, so this is damage, not a torn commit"
                );
                warn!("{why}");
                geo.grow_to(layout);
                return Ok(Recovered::ImagesDamaged {
                    resume: Resume { record },
                    why,
                });
            }
            None => warn!(
                area,
                txn, "newest commit's journal is damaged; using the previous commit"
            ),
        }
    }
    Err(Error::inconsistent(
        "no valid commit record in either journal area",
    ))
}

/// Whether a commit record that verifies is one of this pool's: its uuid,
/// a version no newer than the pool's, no more page images than its
/// version's journal holds.
fn plausible(store: &Store, record: &CommitRecord, version: arbor_format::FormatVersion) -> bool {
    record.uuid == store.geo.uuid
        && store.geo.version().accepts_commit_record(version)
        && u64::from(record.page_count.get())
            <= arbor_format::journal_capacity(version, store.geo.journal_pages)
}

/// What `check` says of the journal areas when the pool is at commit
/// `current`: the other area should hold the previous commit, the fallback
/// if the current record is ever damaged. A power cut during a commit also
/// leaves it without one (until the next commit), so these are warnings.
pub(crate) fn journal_warnings(store: &Store, current: u64) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    let mut fallback = false;
    for area in store.geo.journal_start {
        let raw = store.read_block(area)?;
        match CommitRecord::decode(&raw[..]) {
            Ok(record) if record.uuid != store.geo.uuid => warnings.push(format!(
                "journal area at block {area}: commit record of another pool"
            )),
            Ok(record) if u64::from(record.page_count.get()) > store.geo.journal_pages => warnings
                .push(format!(
                    "journal area at block {area}: commit record claims {} page images, the area holds {}",
                    record.page_count.get(),
                    store.geo.journal_pages
                )),
            Ok(record) if record.txn.get() > current => warnings.push(format!(
                "journal area at block {area}: commit {} is newer than the pool's commit {current} but its page images are damaged or torn; the pool is at the previous commit",
                record.txn.get()
            )),
            Ok(record) => {
                let layout = Layout::from_record(store.geo.superblock(), &record, store.dev.size());
                if let (true, Ok(layout)) = (record.txn.get() + 1 == current, layout) {
                    if read_journal_pages(store, area, &record, &layout)?.is_some() {
                        fallback = true;
                    }
                }
            }
            Err(e) if raw.iter().any(|&b| b != 0) => warnings.push(format!(
                "journal area at block {area}: damaged or torn commit record: {e}"
            )),
            Err(_) => {}
        }
    }
    if !fallback && current > 1 {
        warnings.push(format!(
            "no intact previous commit ({}) to fall back on if the current one is damaged",
            current - 1
        ));
    }
    Ok(warnings)
}

/// The page images following `record`, or `None` if any is damaged.
fn read_journal_pages(
    store: &Store,
    area: u64,
    record: &CommitRecord,
    layout: &Layout,
) -> Result<Option<Vec<SmPage>>> {
    let geo = &store.geo;
    if u64::from(record.page_count.get()) > geo.journal_pages {
        return Ok(None);
    }
    let mut images = vec![0u8; arbor_format::journal_images_len(record)];
    store
        .dev
        .read_at(&mut images, (area + 1) * arbor_format::BLOCK_SIZE_U64)?;
    Ok(arbor_format::decode_journal_pages(record, &images, layout).ok())
}

pub(crate) fn decode_map_value(node: &Node, i: usize) -> Result<MapValue> {
    MapValue::decode(node.value(i))
        .map_err(|e| Error::corrupt(format!("mapping entry {}", node.keys[i]), e))
}
