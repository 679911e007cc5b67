//! Full verification of a pool: every reachable node read from the device
//! and checked (checksum, place, transaction, tree kind, level, key order and
//! ranges), every extent checked, and every reference count recomputed by a
//! full walk and compared with the space maps (so leaks and double
//! references both show up).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_format::{
    split_store_key, BlockRef, CowState, DataLayout, Home, Node, NodeBody, SmKind, Superblock,
    TreeKind, VolumeRecord, SM_ENTRIES_PER_PAGE, SUPERBLOCK_SLOTS,
};

use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::store::{PreservedPages, Store};
use crate::table::VolumeTable;
use crate::walk::{walk, Damage, Descend, Place, Visitor};

/// One committed state of the pool, captured in a moment so that it can be
/// walked while I/O and later commits go on: nodes are read from the device
/// (the metadata space map is pinned meanwhile, so no block that state
/// references is reused), space-map pages from the captured images of the
/// last commit, from the old home images later commits saved in
/// `PreservedPages` before overwriting them, or from home.
pub(crate) struct Committed {
    store: Arc<Store>,
    txn: u64,
    volumes_root: BlockRef,
    queue_root: BlockRef,
    /// The data checksum tree (version 10; none before).
    sums_root: BlockRef,
    /// The in-place intent set (version 10; none before).
    intents_root: BlockRef,
    next_volume_id: u64,
    meta_used: u64,
    data_used: u64,
    /// Entries of each space map at that commit (a growth may add more
    /// while the state is walked).
    meta_entries: u64,
    data_entries: u64,
    pages: Arc<PreservedPages>,
    /// The open transaction's volume records when it had no changes (then
    /// they must equal the table's).
    memory: Option<HashMap<u64, VolumeRecord>>,
}

impl Committed {
    /// The last commit of `meta`, which must have no commit in flight.
    /// `memory`: the volume table in memory, if it has not changed since
    /// that commit (the walk compares the two).
    pub fn capture(meta: &Meta, memory: Option<&VolumeTable>) -> Result<Self> {
        if meta.commit_in_flight() {
            return Err(Error::inconsistent("check during a commit"));
        }
        let rec = meta.last_record();
        let pages = PreservedPages::default();
        {
            let mut map = pages.lock();
            for (index, page) in meta.committed_pages(SmKind::Meta) {
                map.insert((SmKind::Meta, index), page);
            }
            for (index, page) in meta.committed_pages(SmKind::Data) {
                map.insert((SmKind::Data, index), page);
            }
        }
        let (sums_root, intents_root) = meta.own_roots_of(rec);
        Ok(Self {
            store: Arc::clone(meta.store()),
            txn: rec.txn.get(),
            volumes_root: rec.volumes_root.into(),
            queue_root: rec.queue_root.into(),
            sums_root,
            intents_root,
            next_volume_id: rec.next_volume_id.get(),
            meta_used: rec.meta_used.get(),
            data_used: rec.data_used.get(),
            meta_entries: meta.entries(SmKind::Meta),
            data_entries: meta.entries(SmKind::Data),
            pages: Arc::new(pages),
            memory: memory.map(|table| table.iter().map(|(id, r)| (id, r.clone())).collect()),
        })
    }

    /// Where commits made while this state is walked keep its pages.
    pub fn preserved(&self) -> Arc<PreservedPages> {
        Arc::clone(&self.pages)
    }

    /// The transaction captured.
    pub fn txn(&self) -> u64 {
        self.txn
    }

    fn count(&self, kind: SmKind, entry: u64) -> Result<u32> {
        let page = u32::try_from(entry / SM_PER_PAGE)
            .map_err(|_| Error::inconsistent("space-map entry out of range"))?;
        let slot = (entry % SM_PER_PAGE) as usize;
        Ok(self.pages.get(&self.store, kind, page)?.counts[slot])
    }
}

/// Problems reported beyond this many are only counted.
const MAX_REPORTED: usize = 200;
const SM_PER_PAGE: u64 = SM_ENTRIES_PER_PAGE as u64;

#[derive(Debug, Default, Clone)]
pub struct CheckReport {
    /// Damage or inconsistency: the pool is not clean.
    pub problems: Vec<String>,
    /// Conditions that a power cut also leaves behind and that cost nothing
    /// now (e.g. no intact fallback commit in the other journal area).
    pub warnings: Vec<String>,
    /// Problems found but not listed (beyond the first 200).
    pub unlisted: usize,
    pub volumes: usize,
    pub nodes: u64,
    pub data_chunks_referenced: u64,
    /// Partial extents in the pool's mapping leaves (each leaf counted
    /// once, however many trees share it), and those of them with middle
    /// layers (FORMAT.md §6.3).
    pub partial_extents: u64,
    pub layered_partials: u64,
    /// Data the pool's structure is sound without but that is known lost:
    /// what snapshots and clones read through an origin's device that
    /// shrank (they fail reads of it). Listed until they are destroyed.
    pub lost: Vec<LostData>,
    /// Data blocks recorded damaged (they do not match their checksums)
    /// and still read by a volume or snapshot (`Pool::damage`).
    pub damaged: DamageReport,
}

/// Most volumes and snapshots listed as reading one damaged block (the
/// count says how many there are).
pub const MAX_READERS_LISTED: usize = 32;

/// A damaged block as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedData {
    /// The physical data chunk, and the block (4 KiB) within it.
    pub pchunk: u64,
    pub block: u32,
    /// The block's byte offset on the pool's device.
    pub device_offset: u64,
    /// The sum the block has, and the crc32c of what was read.
    pub stored: u32,
    pub computed: u32,
    /// When it was first found, and last recorded found (seconds since 1970).
    pub found_unix: u64,
    pub last_unix: u64,
    /// Volumes and snapshots that read it, and where (byte offset in
    /// each); at most [`MAX_READERS_LISTED`].
    pub readers: Vec<(String, u64)>,
    /// How many volumes and snapshots read it.
    pub reader_count: usize,
}

/// The pool's recorded damage that is still there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DamageReport {
    pub blocks: Vec<DamagedData>,
    /// Damaged blocks found while the record was full (not listed).
    pub unlisted: u64,
}

impl DamageReport {
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.unlisted == 0
    }
}

/// What a volume reading through an origin lost with the origin's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostData {
    /// The snapshot or clone that lost data (`origin@snapshot`, a clone's
    /// name).
    pub volume: String,
    /// The origin it reads through.
    pub origin: String,
    /// Bytes of it that read as errors: the lost range, less what it has a
    /// copy of in the pool or data of its own for.
    pub bytes: u64,
    /// The first lost byte of the origin.
    pub from: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, what: String) {
        if self.problems.len() < MAX_REPORTED {
            self.problems.push(what);
        } else {
            self.unlisted += 1;
        }
    }
}

struct Walker<'a> {
    meta: &'a Committed,
    report: CheckReport,
    /// References counted by the walk, indexed like the space maps (4 bytes
    /// per entry: a 1 TiB pool of 16 KiB chunks needs 256 MiB to check).
    meta_refs: Vec<u32>,
    data_refs: Vec<u32>,
    /// Mapped chunks and the end of the last extent per verified mapping
    /// subtree (shared subtrees are walked once).
    mapped: HashMap<u64, (u64, u64)>,
    queued: Vec<BlockRef>,
    records: Vec<(u64, VolumeRecord)>,
    visited: HashSet<u64>,
    /// Mapped chunks and end of the subtrees being walked, innermost last.
    sums: Vec<(u64, u64)>,
    /// A node or entry is damaged (as opposed to counts or records that
    /// disagree): the references below it are unknown.
    damaged: bool,
}

impl Walker<'_> {
    /// Reports damage to a node or entry.
    fn damage(&mut self, what: String) {
        self.damaged = true;
        self.report.problem(what);
    }

    /// Counts one reference to `r` and, the first time, verifies its subtree
    /// (through the one tree walker, `walk::walk`). Returns the chunks
    /// mapped below it and the end of its last extent (mapping trees).
    fn walk(&mut self, r: BlockRef, tree: TreeKind) -> (u64, u64) {
        let committed = self.meta;
        let read = |r: BlockRef| committed.store.read_node_uncached(r).map(Box::new);
        self.sums.push((0, 0));
        // The visitor records every problem and never fails the walk.
        if let Err(e) = walk(&read, r, tree, self) {
            self.damage(format!("{tree:?} tree at block {}: {e}", r.block));
        }
        self.sums.pop().unwrap_or((0, 0))
    }

    /// Adds a subtree's mapped chunks and end to its parent's.
    fn add(&mut self, (mapped, end): (u64, u64)) {
        if let Some(sum) = self.sums.last_mut() {
            sum.0 = sum.0.saturating_add(mapped);
            sum.1 = sum.1.max(end);
        }
    }

    fn check_leaf(&mut self, r: BlockRef, node: &arbor_format::Node, hi: u64) -> (u64, u64) {
        let mut mapped = 0;
        let mut previous_end = 0;
        for i in 0..node.len() {
            let key = node.keys[i];
            match node.tree {
                TreeKind::Mapping => match crate::meta::decode_map_value(node, i) {
                    Ok(v) => {
                        let len = u64::from(v.len);
                        if key < previous_end {
                            self.damage(format!(
                                "leaf {}: extent at {key} overlaps the previous one",
                                r.block
                            ));
                        }
                        if key.saturating_add(len) > hi {
                            self.damage(format!(
                                "leaf {}: extent at {key} crosses its leaf's range end {hi}",
                                r.block
                            ));
                        }
                        if v.pchunk.saturating_add(len) > self.meta.data_entries {
                            self.damage(format!(
                                "leaf {}: extent at {key} points past the data region",
                                r.block
                            ));
                            continue;
                        }
                        if let Some(p) = v.partial {
                            let geo = &self.meta.store.geo;
                            if let Some(what) = crate::mapping::partial_rule(geo, v.pchunk, &p) {
                                self.damage(format!("leaf {}: extent at {key}: {what}", r.block));
                                continue;
                            }
                            self.report.partial_extents += 1;
                            if p.mid_count() > 0 {
                                self.report.layered_partials += 1;
                            }
                        }
                        previous_end = key.saturating_add(len);
                        mapped += len;
                        for (start, run) in v.chunk_runs() {
                            // In range: the run checked against data_chunks
                            // just above, a partial's base by its rule.
                            for c in start..start + run {
                                self.data_refs[c as usize] =
                                    self.data_refs[c as usize].saturating_add(1);
                            }
                        }
                    }
                    Err(e) => self.damage(format!("leaf {}: {e}", r.block)),
                },
                TreeKind::Volumes | TreeKind::VolumeTable => {
                    match crate::volumes::decode_record(node.tree, node.value(i)) {
                        Ok(rec) => self.records.push((key, rec)),
                        Err(e) => self.damage(format!("volume record {key}: {e}")),
                    }
                }
                TreeKind::Queue => self.queued.push(BlockRef::decode(node.value(i))),
                TreeKind::Sums => {
                    let geo = self.meta.store.geo.sums;
                    if let Err(e) = arbor_format::SumsLeaf::decode(geo, node.value(i)) {
                        self.damage(format!("checksum leaf {key} in block {}: {e}", r.block));
                    }
                    if geo
                        .first_chunk(key)
                        .is_none_or(|c| c >= self.meta.data_entries)
                    {
                        self.damage(format!(
                            "checksum leaf {key} in block {}: past the data region",
                            r.block
                        ));
                    }
                }
                TreeKind::Intents => {}
            }
        }
        (mapped, previous_end)
    }

    fn compare_counts(&mut self) -> Result<()> {
        let geo = &self.meta.store.geo;
        let meta_refs = std::mem::take(&mut self.meta_refs);
        let data_refs = std::mem::take(&mut self.data_refs);
        self.compare_map(
            SmKind::Meta,
            self.meta.meta_used,
            meta_refs.len() as u64,
            |e| meta_refs.get(e as usize),
            "metadata block",
            |e| geo.meta_block(e).unwrap_or(u64::MAX),
        )?;
        self.report.data_chunks_referenced = self.compare_map(
            SmKind::Data,
            self.meta.data_used,
            data_refs.len() as u64,
            |e| data_refs.get(e as usize),
            "data chunk",
            |e| e,
        )?;
        Ok(())
    }

    /// Compares every count of one space map with the references counted by
    /// the walk, and its used counter with the non-zero counts. `label` and
    /// `name` name entry `e` as `label name(e)` in reports.
    fn compare_map<'r>(
        &mut self,
        kind: SmKind,
        recorded_used: u64,
        entries: u64,
        expected: impl Fn(u64) -> Option<&'r u32>,
        label: &str,
        name: impl Fn(u64) -> u64,
    ) -> Result<u64> {
        let mut used = 0;
        let mut entry = 0;
        while entry < entries {
            let want = expected(entry).copied().unwrap_or(0);
            let have = match self.meta.count(kind, entry) {
                Ok(have) => have,
                Err(e) => {
                    // A damaged page: report it once and skip its entries.
                    self.report.problem(format!("{label} space map: {e}"));
                    entry = (entry / SM_PER_PAGE + 1) * SM_PER_PAGE;
                    continue;
                }
            };
            if want != have {
                self.report.problem(format!(
                    "{label} {}: space map counts {have} references, the trees hold {want}",
                    name(entry)
                ));
            }
            used += u64::from(have != 0);
            entry += 1;
        }
        if used != recorded_used {
            self.report.problem(format!(
                "{label}s: used counter {recorded_used} != {used} counted"
            ));
        }
        Ok(used)
    }
}

/// Verifies a committed state. The caller holds off commits until this
/// returns (nodes of the state must not be reused), nothing else.
/// Verifies `state`. The journal is not looked at here: later commits may
/// be writing it (see [`journal_and_superblocks`]).
pub(crate) fn check(state: &Committed) -> Result<CheckReport> {
    let mut w = walk_trees(state, true)?;
    w.compare_counts()?;
    Ok(w.report)
}

/// The checks of the superblock copies and of the journal's fallback
/// commit, for a report on commit `txn`: run while no commit is writing.
pub(crate) fn journal_and_superblocks(store: &Store, txn: u64) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    check_superblocks(store, &mut report)?;
    report
        .warnings
        .extend(crate::meta::journal_warnings(store, txn)?);
    Ok(report)
}

/// References held by the trees (for repair). With
/// `queue` false, the reclaim queue and the trees it holds are left out, as
/// if the queue were empty.
pub(crate) fn count_references(meta: &Meta, queue: bool) -> Result<References> {
    let state = Committed::capture(meta, None)?;
    let mut w = walk_trees(&state, queue)?;
    Ok(References {
        damaged: w.damaged.then(|| std::mem::take(&mut w.report.problems)),
        meta: std::mem::take(&mut w.meta_refs),
        data: std::mem::take(&mut w.data_refs),
    })
}

/// What [`count_references`] found.
pub(crate) struct References {
    /// Problems, when a node or entry is damaged (the counts are then incomplete).
    pub damaged: Option<Vec<String>>,
    /// References per metadata block (entry `i` = block `meta_start + i`).
    pub meta: Vec<u32>,
    /// References per data chunk.
    pub data: Vec<u32>,
}

/// Both superblock copies must verify and be identical.
fn check_superblocks(store: &Store, report: &mut CheckReport) -> Result<()> {
    let mut copies = Vec::new();
    for slot in 0..SUPERBLOCK_SLOTS {
        let raw = store.read_block(slot)?;
        match Superblock::decode(&raw[..], store.dev.size()) {
            Ok(sb) => copies.push(sb),
            Err(e) => report.problem(format!("superblock copy {slot} (block {slot}): {e}")),
        }
    }
    if copies.windows(2).any(|pair| pair[0] != pair[1]) {
        report.problem("the two superblock copies differ".into());
    }
    Ok(())
}

impl Visitor for Walker<'_> {
    fn enter(&mut self, r: BlockRef, at: &Place) -> Result<bool> {
        let entry = self.meta.store.geo.meta_entry(r.block);
        match entry.and_then(|e| self.meta_refs.get_mut(e as usize)) {
            Some(count) => *count = count.saturating_add(1),
            None => {
                self.damage(format!(
                    "{:?} pointer to block {} outside the metadata region",
                    at.tree, r.block
                ));
                return Ok(false);
            }
        }
        if !self.visited.insert(r.block) {
            let seen = self.mapped.get(&r.block).copied().unwrap_or((0, 0));
            self.add(seen);
            return Ok(false);
        }
        self.report.nodes += 1;
        Ok(true)
    }

    fn visit(&mut self, r: BlockRef, node: &Node, at: &Place) -> Result<Descend> {
        match node.body {
            NodeBody::Internal(_) => self.sums.push((0, 0)),
            NodeBody::Leaf(_) => {
                let mapped = self.check_leaf(r, node, at.hi);
                self.mapped.insert(r.block, mapped);
                self.add(mapped);
            }
        }
        Ok(Descend::Children)
    }

    fn leave(&mut self, r: BlockRef, _node: &Node, _at: &Place) -> Result<()> {
        let mapped = self.sums.pop().unwrap_or((0, 0));
        self.mapped.insert(r.block, mapped);
        self.add(mapped);
        Ok(())
    }

    fn unreadable(&mut self, r: BlockRef, at: &Place, error: Error) -> Result<()> {
        self.damage(format!("{:?} node {}: {error}", at.tree, r.block));
        Ok(())
    }

    fn damaged(&mut self, _r: BlockRef, _at: &Place, damage: Damage) -> Result<()> {
        self.damage(damage.what);
        Ok(())
    }
}

/// Walks every tree (the reclaim queue too if `queue`), verifying every
/// node once and counting every reference.
fn walk_trees(meta: &Committed, queue: bool) -> Result<Walker<'_>> {
    let mut w = Walker {
        meta,
        report: CheckReport::default(),
        meta_refs: vec![0; meta.meta_entries as usize],
        data_refs: vec![0; meta.data_entries as usize],
        mapped: HashMap::new(),
        queued: Vec::new(),
        records: Vec::new(),
        visited: HashSet::new(),
        sums: Vec::new(),
        damaged: false,
    };
    if !meta.volumes_root.is_none() {
        // Either layout (see `Volumes::convert_table`); the walk verifies
        // every node against the kind its root gives.
        let kind = match meta.store.read_node_uncached(meta.volumes_root) {
            Ok(node)
                if node.tree == TreeKind::VolumeTable
                    && meta.store.geo.version().has_identities() =>
            {
                TreeKind::VolumeTable
            }
            _ => TreeKind::Volumes,
        };
        w.walk(meta.volumes_root, kind);
    }
    if !meta.sums_root.is_none() {
        w.walk(meta.sums_root, TreeKind::Sums);
    }
    if !meta.intents_root.is_none() {
        w.walk(meta.intents_root, TreeKind::Intents);
    }
    if queue && !meta.queue_root.is_none() {
        w.walk(meta.queue_root, TreeKind::Queue);
    }
    let records = std::mem::take(&mut w.records);
    w.report.volumes = records.len();
    let mut names = HashSet::new();
    for (id, rec) in &records {
        if !names.insert(rec.name.clone()) {
            w.report
                .problem(format!("two volumes named {:?}", rec.name));
        }
        if meta.memory.as_ref().is_some_and(|m| m.get(id) != Some(rec)) {
            w.report.problem(format!(
                "volume {id} ({}) differs between the table and memory",
                rec.name
            ));
        }
        if *id >= meta.next_volume_id {
            w.report.problem(format!(
                "volume id {id} is not below the next id {}",
                meta.next_volume_id
            ));
        }
        let (mapped, end) = if rec.root.is_none() {
            (0, 0)
        } else {
            w.walk(rec.root, TreeKind::Mapping)
        };
        if mapped != rec.mapped_chunks {
            w.report.problem(format!(
                "volume {}: {mapped} chunks mapped, record says {}",
                rec.name, rec.mapped_chunks
            ));
        }
        // A copy-on-write volume's tree is its snapshot store, keyed by
        // (chunk, first epoch): its chunks are the keys' upper halves.
        let end = match rec.layout {
            DataLayout::Cow(_) if end > 0 => split_store_key(end - 1).0 + 1,
            _ => end,
        };
        if end > rec.size_bytes.div_ceil(meta.store.geo.chunk_size) {
            w.report.problem(format!(
                "volume {}: chunks mapped beyond its size",
                rec.name
            ));
        }
        let cow_volume = rec.layout != DataLayout::Row || rec.backing.is_some();
        if cow_volume && !meta.store.geo.version().has_cow_volumes() {
            w.report.problem(format!(
                "volume {}: copy-on-write in a version {} pool",
                rec.name,
                meta.store.geo.version()
            ));
        }
        // A home in the pool: one reference to each of its chunks, which
        // lie in one region.
        if let DataLayout::Cow(CowState {
            home: Home::Pool { first },
            ..
        }) = rec.layout
        {
            let geo = &meta.store.geo;
            let chunks = rec.size_bytes.div_ceil(geo.chunk_size);
            match first.checked_add(chunks) {
                Some(end) if end <= meta.data_entries && geo.chunk_run(first).1 >= chunks => {
                    for c in first..end {
                        // In range: checked just above.
                        w.data_refs[c as usize] = w.data_refs[c as usize].saturating_add(1);
                    }
                }
                _ => w.report.problem(format!(
                    "volume {}: its home of {chunks} chunks from chunk {first} is not one run of the data region",
                    rec.name
                )),
            }
        }
        if let Some(backing) = rec.backing {
            let origin = records.iter().find(|(id, _)| *id == backing.origin);
            match origin.map(|(_, r)| r.layout) {
                Some(DataLayout::Cow(cow)) if backing.epoch <= cow.epoch => {}
                _ => w.report.problem(format!(
                    "volume {} reads through epoch {} of volume {}, which has no such epoch",
                    rec.name, backing.epoch, backing.origin
                )),
            }
        }
    }
    if let Some(memory) = meta.memory.as_ref().filter(|m| m.len() != records.len()) {
        w.report.problem(format!(
            "{} volumes in memory, {} in the table",
            memory.len(),
            records.len()
        ));
    }
    for r in std::mem::take(&mut w.queued) {
        w.walk(r, TreeKind::Mapping);
    }
    Ok(w)
}
