//! Restores that serve their volume while they fill it (docs/BACKUP.md,
//! "Instant restore"), and the plain restore, which is the same fill with
//! nobody reading.
//!
//! A restore makes its volume, then fills it block by block (the
//! repository's blocks). Each block is in one of four states:
//! * *absent*: not in the volume yet;
//! * *busy*: one writer is putting it there (the fill, a read that fetched
//!   it on demand, or a client's write that covers it whole);
//! * *present*: in the volume, or never needing to be (unmapped in the
//!   backup, trimmed by the client, overwritten whole by the client);
//! * *failed*: its blob is damaged or missing; reads of it fail.
//!
//! A block becomes present only through the one writer that holds it busy,
//! so the fill never writes over a client's write, and a read never sees a
//! block before its data is in the volume. Nobody waits for a block while
//! holding another busy, so no two wait for each other.
//!
//! After a restart, the blocks the volume maps are present (written by the
//! fill or by the client: either way the volume's, and each block is
//! written by one atomic engine write), the rest absent. So a client's
//! zeroing write, while the restore runs, keeps its blocks allocated: an
//! unmapped block would be filled again from the backup. A trimmed block
//! may be (a trim leaves contents unspecified).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use arbor_engine::{Pool, VolumeId};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

use crate::crypto::BlobId;
use crate::format::manifest::{Manifest, Piece, PIECE_BLOCKS};
use crate::format::pack;
use crate::format::{BlobKind, ObjectId};
use crate::lock::{LockKind, RepoLock};
use crate::repo::{damaged, BackupError, BlobAt, Progress, Repository, Result};
use crate::restore::{read_range, runs, MAX_WRITE, READS_IN_FLIGHT};
use crate::store::names;

/// Map pieces kept decoded (each up to 1,024 entries of 36 bytes).
const PIECES_CACHED: usize = 64;
/// Blocks one round of the last sweep fetches.
const SWEEP_BLOCKS: usize = 256;
/// The longest wait between retries of a store that fails.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Whether blocks a restore writes are kept in the host's page cache: those
/// a client's read fetched are read at once; the fill's, a whole volume
/// that nothing may read for a long time, bypass it (`Pool::write_uncached`).
#[derive(Debug, Clone, Copy)]
enum Cache {
    Keep,
    Bypass,
}

/// What a block is (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Absent,
    Busy,
    Present,
    Failed,
}

/// Every block's state. Sans-I/O: the rules of who may write a block.
#[derive(Debug)]
struct Blocks {
    /// A bit per block: present.
    present: Vec<u64>,
    busy: HashSet<u64>,
    /// Failed blocks, with why.
    failed: BTreeMap<u64, String>,
    /// Blocks not present.
    missing: u64,
}

impl Blocks {
    fn new(count: u64) -> Self {
        Blocks {
            present: vec![0; count.div_ceil(64) as usize],
            busy: HashSet::new(),
            failed: BTreeMap::new(),
            missing: count,
        }
    }

    fn is_present(&self, b: u64) -> bool {
        self.present[(b / 64) as usize] & (1 << (b % 64)) != 0
    }

    fn state(&self, b: u64) -> State {
        if self.is_present(b) {
            State::Present
        } else if self.busy.contains(&b) {
            State::Busy
        } else if self.failed.contains_key(&b) {
            State::Failed
        } else {
            State::Absent
        }
    }

    /// Absent or failed becomes busy: the caller writes it next.
    fn claim(&mut self, b: u64) -> bool {
        match self.state(b) {
            State::Absent | State::Failed => {
                self.failed.remove(&b);
                self.busy.insert(b)
            }
            State::Busy | State::Present => false,
        }
    }

    /// Busy ends: the caller marks it present if it wrote it; otherwise
    /// it is absent again.
    fn settle(&mut self, b: u64) {
        let was_busy = self.busy.remove(&b);
        debug_assert!(was_busy, "block {b} settled unclaimed");
    }

    /// Busy ends failed: its blob cannot be had.
    fn fail(&mut self, b: u64, why: String) {
        self.busy.remove(&b);
        if !self.is_present(b) {
            self.failed.insert(b, why);
        }
    }

    /// Present without a write (unmapped in the backup, trimmed, mapped
    /// in the volume when a restore resumes). False if it already was.
    fn mark_present(&mut self, b: u64) -> bool {
        if self.is_present(b) {
            return false;
        }
        self.present[(b / 64) as usize] |= 1 << (b % 64);
        self.failed.remove(&b);
        self.missing -= 1;
        true
    }
}

/// How a restore stands (`LiveRestore::status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveStatus {
    pub blocks: u64,
    /// Blocks not in the volume yet (failed ones included).
    pub missing: u64,
    /// Blocks whose blobs are damaged or missing, and the first's reason.
    pub failed: u64,
    pub first_failure: Option<String>,
    /// The store's last error while it is being retried.
    pub waiting_for: Option<String>,
    pub complete: bool,
}

/// A restore in progress: its volume, the backup it comes from, and which
/// blocks are there (see the module documentation).
pub struct LiveRestore {
    repo: Repository,
    backup: ObjectId,
    manifest: Manifest,
    piece_ids: Vec<Option<BlobId>>,
    pool: Arc<Pool>,
    volume: VolumeId,
    name: String,
    block_size: u64,
    count: u64,
    blocks: Mutex<Blocks>,
    changed: Condvar,
    complete: AtomicBool,
    /// Decoded map pieces, the newest last.
    pieces: Mutex<VecDeque<(u64, Arc<Piece>)>>,
    /// Client reads and writes (on blocking threads) fetch through it.
    runtime: Handle,
    progress: Arc<Progress>,
    /// Clients read the volume: a damaged blob fails its block and the
    /// fill goes on, and a failing store is retried. Otherwise the first
    /// error ends the fill, and the caller deletes the volume.
    serving: bool,
    waiting_for: Mutex<Option<String>>,
    /// The shared repository lock, held until the volume is whole: a prune
    /// must not delete a pack the volume still needs.
    lock: tokio::sync::Mutex<Option<RepoLock>>,
}

impl std::fmt::Debug for LiveRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveRestore({} from {})", self.name, self.backup)
    }
}

fn task_error(e: impl std::fmt::Display) -> BackupError {
    BackupError::Internal(format!("a restore task: {e}"))
}

/// A store failure worth retrying, as opposed to damage, which no retry
/// mends, or the pool's own refusal.
fn transient(e: &BackupError) -> bool {
    matches!(e, BackupError::Store(_) | BackupError::Internal(_))
}

/// Gives a claimed block back when its writer ends without settling it
/// (a panic, a task cancelled): never left busy for ever.
struct Claims<'a> {
    live: &'a LiveRestore,
    blocks: Vec<u64>,
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            let mut blocks = self.live.states();
            for b in self.blocks.drain(..) {
                blocks.settle(b);
            }
            drop(blocks);
            self.live.changed.notify_all();
        }
    }
}

impl LiveRestore {
    /// Makes volume `name` in `pool` for backup `backup` and returns the
    /// restore, nothing filled yet: the caller runs [`LiveRestore::fill`].
    pub async fn create(
        repo: &Repository,
        backup: &ObjectId,
        pool: Arc<Pool>,
        name: &str,
        serving: bool,
        progress: Arc<Progress>,
    ) -> Result<Arc<Self>> {
        let lock = repo
            .lock(LockKind::Shared, &format!("restore {backup} into {name}"))
            .await?;
        let made = async {
            let manifest = Self::checked_manifest(repo, backup).await?;
            let volume = {
                let (pool, name, size) = (Arc::clone(&pool), name.to_owned(), manifest.size);
                tokio::task::spawn_blocking(move || pool.create_volume(&name, size))
                    .await
                    .map_err(task_error)??
            };
            Ok(Self::new(
                repo, backup, manifest, pool, volume, name, serving, progress,
            ))
        }
        .await;
        Self::with_lock(made, lock).await
    }

    /// Takes up the restore of a volume an earlier one made and did not
    /// finish (the daemon stopped): the blocks the volume maps are there.
    pub async fn resume(
        repo: &Repository,
        backup: &ObjectId,
        pool: Arc<Pool>,
        name: &str,
        progress: Arc<Progress>,
    ) -> Result<Arc<Self>> {
        let lock = repo
            .lock(
                LockKind::Shared,
                &format!("restore {backup} into {name} (resumed)"),
            )
            .await?;
        let made = async {
            let manifest = Self::checked_manifest(repo, backup).await?;
            let volume = pool.lookup(name)?;
            let info = pool.info(volume)?;
            if info.snapshot || info.size != manifest.size {
                return Err(BackupError::Refused(format!(
                    "{name} is not the volume a restore of backup {backup} made ({} bytes, where the backup has {})",
                    info.size, manifest.size
                )));
            }
            let live = Self::new(repo, backup, manifest, Arc::clone(&pool), volume, name, true, progress);
            let marked = {
                let live = Arc::clone(&live);
                tokio::task::spawn_blocking(move || live.mark_mapped())
                    .await
                    .map_err(task_error)?
            };
            marked.map(|()| live)
        }
        .await;
        Self::with_lock(made, lock).await
    }

    async fn with_lock(made: Result<Arc<Self>>, lock: RepoLock) -> Result<Arc<Self>> {
        match made {
            Ok(live) => {
                *live.lock.lock().await = Some(lock);
                Ok(live)
            }
            Err(e) => {
                lock.release().await;
                Err(e)
            }
        }
    }

    async fn checked_manifest(repo: &Repository, backup: &ObjectId) -> Result<Manifest> {
        let manifest = repo.manifest(backup).await?;
        if manifest.block_size != repo.block_size() {
            return Err(damaged(
                names::snapshot(backup),
                crate::format::invalid("a backup", "its block size is not the repository's"),
            ));
        }
        Ok(manifest)
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        repo: &Repository,
        backup: &ObjectId,
        manifest: Manifest,
        pool: Arc<Pool>,
        volume: VolumeId,
        name: &str,
        serving: bool,
        progress: Arc<Progress>,
    ) -> Arc<Self> {
        let block_size = u64::from(manifest.block_size);
        let count = manifest.size.div_ceil(block_size);
        Progress::add(&progress.total_bytes, manifest.size);
        pool.set_incomplete(volume, Some(format!("being restored from backup {backup}")));
        Arc::new(LiveRestore {
            repo: repo.clone(),
            backup: *backup,
            piece_ids: manifest.piece_ids(),
            manifest,
            pool,
            volume,
            name: name.to_owned(),
            block_size,
            count,
            blocks: Mutex::new(Blocks::new(count)),
            changed: Condvar::new(),
            complete: AtomicBool::new(count == 0),
            pieces: Mutex::new(VecDeque::new()),
            runtime: Handle::current(),
            progress,
            serving,
            waiting_for: Mutex::new(None),
            lock: tokio::sync::Mutex::new(None),
        })
    }

    /// Gives up the repository lock (the volume is deleted, or the daemon
    /// lets the restore go).
    pub async fn release(&self) {
        if let Some(lock) = self.lock.lock().await.take() {
            lock.release().await;
        }
    }

    /// The volume was deleted: the pool forgets that it was incomplete.
    pub(crate) fn pool_forgets(&self) {
        self.pool.set_incomplete(self.volume, None);
    }

    pub fn volume(&self) -> VolumeId {
        self.volume
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn backup(&self) -> &ObjectId {
        &self.backup
    }

    pub fn size(&self) -> u64 {
        self.manifest.size
    }

    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Every block is in the volume: reads and writes go straight to it.
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    pub fn status(&self) -> LiveStatus {
        let blocks = self.states();
        LiveStatus {
            blocks: self.count,
            missing: blocks.missing,
            failed: blocks.failed.len() as u64,
            first_failure: blocks
                .failed
                .iter()
                .next()
                .map(|(b, why)| format!("block {b}: {why}")),
            waiting_for: self
                .waiting_for
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            complete: self.is_complete(),
        }
    }

    fn states(&self) -> MutexGuard<'_, Blocks> {
        // Every change under the lock is whole (a set insert or removal
        // and its count).
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn block_len(&self, b: u64) -> u64 {
        self.block_size
            .min(self.manifest.size - b * self.block_size)
    }

    /// Marks present, counting its bytes done.
    fn present(&self, blocks: &mut Blocks, b: u64) {
        if blocks.mark_present(b) {
            Progress::add(&self.progress.done_bytes, self.block_len(b));
        }
    }

    /// Claimed blocks `written` are in the volume: present, and no longer
    /// the claims' to give back; their waiters wake.
    fn settle_written(&self, claims: &mut Claims<'_>, written: Range<u64>) {
        {
            let mut blocks = self.states();
            for b in written.clone() {
                blocks.settle(b);
                self.present(&mut blocks, b);
            }
        }
        claims.blocks.retain(|c| !written.contains(c));
        self.changed.notify_all();
    }

    /// The blocks that `[offset, offset + len)` touches.
    fn touched(&self, offset: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        let end = offset.saturating_add(len).min(self.manifest.size);
        (offset / self.block_size).min(self.count)..end.div_ceil(self.block_size).min(self.count)
    }

    /// The blocks that `[offset, offset + len)` covers whole, and the
    /// touched ones at its edges that it does not.
    fn split(&self, offset: u64, len: u64) -> (Range<u64>, Vec<u64>) {
        let end = offset.saturating_add(len);
        let covers = |b: u64| {
            offset <= b * self.block_size && b * self.block_size + self.block_len(b) <= end
        };
        // Blocks between the first and the last are covered.
        let mut whole = self.touched(offset, len);
        let mut edges = Vec::new();
        if !whole.is_empty() && !covers(whole.start) {
            edges.push(whole.start);
            whole.start += 1;
        }
        if !whole.is_empty() && !covers(whole.end - 1) {
            edges.push(whole.end - 1);
            whole.end -= 1;
        }
        (whole, edges)
    }

    // ---- clients (blocking threads) -----------------------------------

    /// Reads, fetching on demand what is not there yet.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if !self.is_complete() {
            let touched = self.touched(offset, buf.len() as u64);
            self.ensure(touched.collect())?;
        }
        Ok(self.pool.read(self.volume, offset, buf)?)
    }

    /// Writes: blocks it covers whole need nothing from the backup; those
    /// at its edges are fetched first.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.change(offset, data.len() as u64, || {
            self.pool.write(self.volume, offset, data)
        })
    }

    /// Writes zeros, keeping them allocated while the restore runs (see
    /// the module documentation); unmaps them once it is complete, if
    /// `may_unmap`.
    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        if self.is_complete() {
            return Ok(self
                .pool
                .write_zeroes(self.volume, offset, len, !may_unmap)?);
        }
        self.change(offset, len, || {
            self.pool.write_zeroes(self.volume, offset, len, true)
        })
    }

    /// Trims: blocks not there yet and covered whole are left out of the
    /// restore (their contents are the client's to not care about); those
    /// there are discarded. A partly covered block not there is left.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        if self.is_complete() {
            return Ok(self.pool.discard(self.volume, offset, len)?);
        }
        let (whole, _) = self.split(offset, len);
        let there: Vec<u64> = {
            let mut blocks = self.states();
            let mut there = Vec::new();
            for b in whole {
                match blocks.state(b) {
                    State::Absent | State::Failed => self.present(&mut blocks, b),
                    State::Present => there.push(b),
                    State::Busy => {}
                }
            }
            there
        };
        self.changed.notify_all();
        // Runs of present blocks are discarded; nobody else changes a
        // present block's state.
        let mut i = 0;
        while i < there.len() {
            let mut j = i + 1;
            while j < there.len() && there[j] == there[j - 1] + 1 {
                j += 1;
            }
            let from = there[i] * self.block_size;
            let to = there[j - 1] * self.block_size + self.block_len(there[j - 1]);
            self.pool.discard(self.volume, from, to - from)?;
            i = j;
        }
        self.complete_if_whole();
        Ok(())
    }

    fn change(
        &self,
        offset: u64,
        len: u64,
        op: impl FnOnce() -> arbor_engine::Result<()>,
    ) -> Result<()> {
        if self.is_complete() {
            return Ok(op()?);
        }
        let (whole, edges) = self.split(offset, len);
        self.ensure(edges)?;
        let mut claims = self.claim_whole(whole);
        let done = op();
        let claimed = std::mem::take(&mut claims.blocks);
        {
            let mut blocks = self.states();
            for b in claimed {
                blocks.settle(b);
                if done.is_ok() {
                    self.present(&mut blocks, b);
                }
            }
        }
        self.changed.notify_all();
        self.complete_if_whole();
        Ok(done?)
    }

    /// Claims every block of `whole` not present, waiting for busy ones
    /// (holding none meanwhile).
    fn claim_whole(&self, whole: Range<u64>) -> Claims<'_> {
        let mut blocks = self.states();
        loop {
            if whole.clone().any(|b| blocks.state(b) == State::Busy) {
                blocks = self.changed.wait(blocks).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let claimed = whole.clone().filter(|&b| blocks.claim(b)).collect();
            return Claims {
                live: self,
                blocks: claimed,
            };
        }
    }

    /// Makes `wanted` present: fetches those absent, waits for busy ones.
    fn ensure(&self, wanted: Vec<u64>) -> Result<()> {
        loop {
            let mut claims = Claims {
                live: self,
                blocks: Vec::new(),
            };
            {
                let mut blocks = self.states();
                if let Some((b, why)) = wanted
                    .iter()
                    .find_map(|b| blocks.failed.get(b).map(|why| (*b, why.clone())))
                {
                    return Err(BackupError::NotFound(format!(
                        "block {b} of {} cannot be restored: {why}",
                        self.name
                    )));
                }
                let mut waiting = false;
                for &b in &wanted {
                    match blocks.state(b) {
                        State::Absent => {
                            blocks.claim(b);
                            claims.blocks.push(b);
                        }
                        State::Busy => waiting = true,
                        State::Present | State::Failed => {}
                    }
                }
                if claims.blocks.is_empty() {
                    if !waiting {
                        return Ok(());
                    }
                    drop(self.changed.wait(blocks).unwrap_or_else(|p| p.into_inner()));
                    continue;
                }
            }
            let fetched = self.runtime.block_on(self.fetch(&claims.blocks));
            self.put_fetched(&mut claims, fetched)?;
            self.complete_if_whole();
        }
    }

    // ---- fetching and writing -------------------------------------------

    /// Map piece `p`, decoded, from the cache or the store.
    async fn piece(&self, p: u64) -> Result<Option<Arc<Piece>>> {
        let Some(Some(id)) = self.piece_ids.get(p as usize) else {
            return Ok(None);
        };
        {
            let pieces = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, piece)) = pieces.iter().find(|(at, _)| *at == p) {
                return Ok(Some(Arc::clone(piece)));
            }
        }
        let piece = Arc::new(
            self.repo
                .read_piece(id, &format!("backup {}", self.backup))
                .await?,
        );
        if let Some((i, _)) = piece
            .0
            .iter()
            .find(|(i, _)| p * PIECE_BLOCKS + u64::from(*i) >= self.count)
        {
            return Err(damaged(
                format!("map piece {id}"),
                crate::format::invalid(
                    "a map piece",
                    format!("maps block {i}, past the volume's end"),
                ),
            ));
        }
        let mut pieces = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        if pieces.len() >= PIECES_CACHED {
            pieces.pop_front();
        }
        pieces.push_back((p, Arc::clone(&piece)));
        Ok(Some(piece))
    }

    /// Where block `b`'s blob is; `None` if the backup does not map it.
    async fn blob_of(&self, b: u64) -> Result<Option<BlobAt>> {
        let p = b / PIECE_BLOCKS;
        let Some(piece) = self.piece(p).await? else {
            return Ok(None);
        };
        let i = (b % PIECE_BLOCKS) as u32;
        let Ok(at) = piece.0.binary_search_by_key(&i, |(i, _)| *i) else {
            return Ok(None);
        };
        self.locate(b, &piece.0[at].1).map(Some)
    }

    /// Blocks' contents, each on its own (a read asks for few): `None` for
    /// one the backup does not map.
    async fn fetch(&self, wanted: &[u64]) -> Vec<(u64, Result<Option<Vec<u8>>>)> {
        let one = |b: u64| async move {
            let got = async {
                let Some(at) = self.blob_of(b).await? else {
                    return Ok(None);
                };
                let name = names::pack(&at.pack);
                let sealed = read_range(
                    &self.repo.store,
                    &name,
                    u64::from(at.entry.offset)..at.entry.end(),
                )
                .await?;
                Progress::add(&self.progress.store_bytes, sealed.len() as u64);
                self.open(b, &name, &at, &sealed).map(Some)
            }
            .await;
            (b, got)
        };
        futures::future::join_all(wanted.iter().map(|&b| one(b))).await
    }

    /// A blob's plaintext for block `b`, checked.
    fn open(&self, b: u64, pack_name: &str, at: &BlobAt, sealed: &[u8]) -> Result<Vec<u8>> {
        let plain = pack::open_blob(&self.repo.keys, &at.entry, sealed)
            .map_err(|e| damaged(pack_name.to_owned(), e))?;
        let expected = self.block_len(b);
        if plain.len() as u64 != expected {
            return Err(damaged(
                pack_name.to_owned(),
                crate::format::invalid(
                    "a blob",
                    format!("{} bytes for a block of {expected}", plain.len()),
                ),
            ));
        }
        Ok(plain)
    }

    /// Writes what a fetch of claimed blocks got: the blocks it got become
    /// present, the damaged ones failed (when serving), the rest absent
    /// again. The first error is returned.
    fn put_fetched(
        &self,
        claims: &mut Claims<'_>,
        fetched: Vec<(u64, Result<Option<Vec<u8>>>)>,
    ) -> Result<()> {
        let mut first_error = None;
        let mut got = Vec::new();
        for (b, r) in fetched {
            match r {
                Ok(data) => got.push((b, data)),
                Err(e) => {
                    if !transient(&e) && self.serving {
                        self.states().fail(b, e.to_string());
                        claims.blocks.retain(|&c| c != b);
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        let written = self.put(claims, got, Cache::Keep);
        // The rest (a store error) go back to absent when `claims` drops.
        self.changed.notify_all();
        match (written, first_error) {
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
            (Ok(_), None) => Ok(()),
        }
    }

    /// Writes claimed blocks (neighbours together); `None` ones need no
    /// write. Returns how many were written.
    fn put(
        &self,
        claims: &mut Claims<'_>,
        mut got: Vec<(u64, Option<Vec<u8>>)>,
        cache: Cache,
    ) -> Result<u64> {
        got.sort_by_key(|(b, _)| *b);
        let mut written = 0;
        let mut run: Vec<u64> = Vec::new();
        let mut buf: Vec<u8> = Vec::new();
        let flush =
            |run: &mut Vec<u64>, buf: &mut Vec<u8>, claims: &mut Claims<'_>| -> Result<u64> {
                if run.is_empty() {
                    return Ok(0);
                }
                let at = run[0] * self.block_size;
                match cache {
                    Cache::Keep => self.pool.write(self.volume, at, buf)?,
                    Cache::Bypass => self.pool.write_uncached(self.volume, at, buf)?,
                }
                let n = run.len() as u64;
                self.settle_written(claims, run[0]..run[0] + n);
                run.clear();
                buf.clear();
                Ok(n)
            };
        for (b, data) in got {
            match data {
                None => self.settle_written(claims, b..b + 1),
                Some(data) => {
                    let joins = run.last().is_some_and(|&l| l + 1 == b) && buf.len() < MAX_WRITE;
                    if !joins {
                        written += flush(&mut run, &mut buf, claims)?;
                    }
                    run.push(b);
                    buf.extend_from_slice(&data);
                }
            }
        }
        written += flush(&mut run, &mut buf, claims)?;
        Ok(written)
    }

    /// Claims those of `got` still absent (or failed) and writes them (the
    /// fill's, past the page cache); the others someone else has written
    /// or is writing.
    fn offer(&self, got: Vec<(u64, Option<Vec<u8>>)>) -> Result<u64> {
        let mut claims = Claims {
            live: self,
            blocks: Vec::new(),
        };
        let got: Vec<_> = {
            let mut blocks = self.states();
            got.into_iter()
                .filter(|(b, _)| {
                    let claimed = blocks.claim(*b);
                    if claimed {
                        claims.blocks.push(*b);
                    }
                    claimed
                })
                .collect()
        };
        let written = self.put(&mut claims, got, Cache::Bypass);
        drop(claims);
        self.changed.notify_all();
        written
    }

    /// Marks the blocks the volume maps present (a resumed restore).
    fn mark_mapped(&self) -> Result<()> {
        const WINDOW: u64 = 1 << 30;
        let mut at = 0;
        while at < self.manifest.size {
            let len = WINDOW.min(self.manifest.size - at);
            let runs = self.pool.allocation_map(self.volume, at, len)?;
            let mut blocks = self.states();
            for run in runs.iter().filter(|r| r.mapped && r.len > 0) {
                for b in self.touched(run.offset, run.len) {
                    self.present(&mut blocks, b);
                }
            }
            at += len;
        }
        self.complete_if_whole();
        Ok(())
    }

    fn complete_if_whole(&self) {
        if self.is_complete() {
            return;
        }
        let whole = self.states().missing == 0;
        if whole {
            self.complete.store(true, Ordering::Release);
            self.pool.set_incomplete(self.volume, None);
        }
    }

    // ---- the fill -----------------------------------------------------------

    /// Fills the volume from the backup, then makes it durable. Returns the
    /// blocks this fill wrote. Serving, it ends with an error naming the
    /// blocks it could not restore, which stay failed; otherwise at the
    /// first error.
    pub async fn fill(self: &Arc<Self>) -> Result<u64> {
        let mut reads: JoinSet<Result<u64>> = JoinSet::new();
        let filled = self.fill_pieces(&mut reads).await;
        if filled.is_err() {
            // The writes in flight end before the caller may delete the
            // volume (a blocking write cannot be cancelled).
            while reads.join_next().await.is_some() {}
        }
        let mut written = filled?;
        written += self.sweep().await?;
        let pool = Arc::clone(&self.pool);
        tokio::task::spawn_blocking(move || pool.flush())
            .await
            .map_err(task_error)??;
        self.complete_if_whole();
        let status = self.status();
        if status.failed > 0 {
            return Err(BackupError::NotFound(format!(
                "{} of {}'s blocks could not be restored (reads of them fail); the first, {}",
                status.failed,
                self.name,
                status.first_failure.unwrap_or_default()
            )));
        }
        self.release().await;
        Ok(written)
    }

    async fn fill_pieces(self: &Arc<Self>, reads: &mut JoinSet<Result<u64>>) -> Result<u64> {
        let mut written = 0;
        for p in 0..self.piece_ids.len() as u64 {
            let range = p * PIECE_BLOCKS..((p + 1) * PIECE_BLOCKS).min(self.count);
            let all_there = {
                let blocks = self.states();
                range.clone().all(|b| blocks.is_present(b))
            };
            if all_there {
                continue;
            }
            let piece = match self.retrying(|| self.piece(p)).await {
                Ok(piece) => piece,
                Err(e) if self.serving && !matches!(e, BackupError::Engine(_)) => {
                    self.fail_all(range, &e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut by_pack: BTreeMap<ObjectId, Vec<(u64, BlobAt)>> = BTreeMap::new();
            {
                let mapped: HashMap<u64, &BlobId> = piece
                    .iter()
                    .flat_map(|piece| piece.0.iter())
                    .map(|(i, id)| (p * PIECE_BLOCKS + u64::from(*i), id))
                    .collect();
                let mut blocks = self.states();
                for b in range {
                    if !mapped.contains_key(&b) && blocks.state(b) != State::Busy {
                        self.present(&mut blocks, b);
                    }
                }
                drop(blocks);
                for (&b, id) in &mapped {
                    if self.states().state(b) != State::Absent {
                        continue;
                    }
                    match self.locate(b, id) {
                        Ok(at) => by_pack.entry(at.pack).or_default().push((b, at)),
                        Err(e) => self.failed_before_fetch(b, e)?,
                    }
                }
            }
            self.changed.notify_all();
            self.complete_if_whole();
            for (pack_id, mut list) in by_pack {
                list.sort_by_key(|(_, at)| at.entry.offset);
                for run in runs(&list) {
                    while reads.len() >= READS_IN_FLIGHT {
                        if let Some(done) = reads.join_next().await {
                            written += done.map_err(task_error)??;
                        }
                    }
                    let (live, run) = (Arc::clone(self), run.to_vec());
                    reads.spawn(async move { live.fill_run(pack_id, run).await });
                }
            }
        }
        while let Some(done) = reads.join_next().await {
            written += done.map_err(task_error)??;
        }
        Ok(written)
    }

    fn locate(&self, b: u64, id: &BlobId) -> Result<BlobAt> {
        let needed_by = format!("backup {}", self.backup);
        let at = self.repo.locate(id, &needed_by)?;
        if at.entry.kind != BlobKind::Data {
            return Err(damaged(
                needed_by,
                crate::format::invalid(
                    "a backup",
                    format!("maps block {b} to blob {id}, which is not a data blob"),
                ),
            ));
        }
        Ok(at)
    }

    /// A block whose blob cannot be had: failed when serving, the end of
    /// the fill otherwise.
    fn failed_before_fetch(&self, b: u64, e: BackupError) -> Result<()> {
        if !self.serving {
            return Err(e);
        }
        let mut blocks = self.states();
        if blocks.claim(b) {
            blocks.fail(b, e.to_string());
        }
        Ok(())
    }

    /// Fails every absent one of `blocks` for `e` (serving).
    fn fail_all(&self, blocks: impl Iterator<Item = u64>, e: &BackupError) {
        let why = e.to_string();
        let mut states = self.states();
        for b in blocks {
            if states.claim(b) {
                states.fail(b, why.clone());
            }
        }
        drop(states);
        self.changed.notify_all();
    }

    /// One ranged read of neighbouring blobs of a pack, written.
    async fn fill_run(self: Arc<Self>, pack_id: ObjectId, run: Vec<(u64, BlobAt)>) -> Result<u64> {
        let name = names::pack(&pack_id);
        let from = u64::from(run[0].1.entry.offset);
        let to = run.last().map_or(from, |(_, at)| at.entry.end());
        let bytes = match self
            .retrying(|| read_range(&self.repo.store, &name, from..to))
            .await
        {
            Ok(bytes) => bytes,
            Err(e) if self.serving => {
                self.fail_all(run.iter().map(|(b, _)| *b), &e);
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        Progress::add(&self.progress.store_bytes, bytes.len() as u64);
        let live = Arc::clone(&self);
        tokio::task::spawn_blocking(move || -> Result<u64> {
            let mut got = Vec::with_capacity(run.len());
            for (b, at) in &run {
                let start = (u64::from(at.entry.offset) - from) as usize;
                let end = (at.entry.end() - from) as usize;
                let opened = bytes
                    .get(start..end)
                    .ok_or_else(|| {
                        damaged(
                            name.clone(),
                            crate::format::invalid("a pack", "shorter than its index says"),
                        )
                    })
                    .and_then(|sealed| live.open(*b, &name, at, sealed));
                match opened {
                    Ok(plain) => got.push((*b, Some(plain))),
                    Err(e) => live.failed_before_fetch(*b, e)?,
                }
            }
            let written = live.offer(got);
            live.complete_if_whole();
            written
        })
        .await
        .map_err(task_error)?
    }

    /// Runs `op` until it succeeds or fails for good: serving, a failing
    /// store is retried with backoff (the volume is in use; the status
    /// says what it waits for); otherwise its first failure is returned.
    async fn retrying<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut wait = Duration::from_secs(1);
        loop {
            match op().await {
                // The volume deleted meanwhile: nothing to wait for.
                Err(e) if self.serving && transient(&e) && self.pool.info(self.volume).is_ok() => {
                    tracing::warn!(volume = %self.name, error = %crate::error_chain(&e), "restore: the store fails; retrying in {wait:?}");
                    *self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(crate::error_chain(&e));
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_BACKOFF);
                }
                other => {
                    *self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    return other;
                }
            }
        }
    }

    /// The blocks left absent after the pass over the pieces (a read that
    /// claimed them failed against the store), fetched a few at a time.
    async fn sweep(self: &Arc<Self>) -> Result<u64> {
        let mut written = 0;
        let mut wait = Duration::from_secs(1);
        loop {
            let (left, busy) = {
                let blocks = self.states();
                let mut left = Vec::new();
                for b in 0..self.count {
                    if blocks.state(b) == State::Absent {
                        left.push(b);
                        if left.len() == SWEEP_BLOCKS {
                            break;
                        }
                    }
                }
                (left, !blocks.busy.is_empty())
            };
            if left.is_empty() {
                if !busy {
                    return Ok(written);
                }
                // A client's write or read is putting its blocks there.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let mut got = Vec::new();
            let mut store_failed = None;
            for (b, r) in self.fetch(&left).await {
                match r {
                    Ok(data) => got.push((b, data)),
                    Err(e) if transient(&e) => {
                        if !self.serving {
                            return Err(e);
                        }
                        store_failed.get_or_insert(e);
                    }
                    Err(e) => self.failed_before_fetch(b, e)?,
                }
            }
            let live = Arc::clone(self);
            written += tokio::task::spawn_blocking(move || live.offer(got))
                .await
                .map_err(task_error)??;
            self.complete_if_whole();
            if let Some(e) = store_failed {
                if self.pool.info(self.volume).is_err() {
                    return Err(e);
                }
                tracing::warn!(volume = %self.name, error = %crate::error_chain(&e), "restore: the store fails; retrying in {wait:?}");
                *self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(crate::error_chain(&e));
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_written_by_its_one_claimer() {
        let mut b = Blocks::new(130);
        assert_eq!(b.missing, 130);
        assert!(b.claim(129));
        assert!(!b.claim(129), "busy: claimed once");
        assert_eq!(b.state(129), State::Busy);
        b.settle(129);
        assert!(b.mark_present(129));
        assert_eq!(b.state(129), State::Present);
        assert!(!b.claim(129), "present: never written again");
        assert_eq!(b.missing, 129);
        // A writer that fails gives it back.
        assert!(b.claim(3));
        b.settle(3);
        assert_eq!(b.state(3), State::Absent);
        // Failed blocks may be claimed again (a client's whole write, the
        // sweep) and count as missing until present.
        assert!(b.claim(4));
        b.fail(4, "damaged".into());
        assert_eq!(b.state(4), State::Failed);
        assert_eq!(b.missing, 129);
        assert!(b.claim(4));
        b.settle(4);
        assert!(b.mark_present(4));
        assert!(b.failed.is_empty());
        assert!(b.mark_present(0));
        assert!(!b.mark_present(0));
        assert_eq!(b.missing, 127);
    }
}
