//! A repository opened with its key: its config, the index of every blob
//! it holds, and its backups. Making backups is `backup.rs`, restoring
//! them `restore.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::crypto::{BlobId, Keys};
use crate::format::config::{KeySource, RepoConfig};
use crate::format::index::{self, PackEntries};
use crate::format::manifest::{self, Manifest};
use crate::format::pack::{self, Entry, TAIL_LEN};
use crate::format::{FormatError, ObjectId};
use crate::lock::{LockKind, LockPolicy, RepoLock};
use crate::store::{id_of, names, Location, Store, StoreError, StoreErrorKind};

/// Why a repository operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("the backup store: {0}")]
    Store(#[from] StoreError),
    /// An object the store returned is damaged, replaced or not ours.
    #[error("{object}: {error}")]
    Damaged { object: String, error: FormatError },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Engine(#[from] arbor_engine::Error),
    /// Not there: a backup, a blob a backup needs, a repository.
    #[error("{0}")]
    NotFound(String),
    /// Another holder's lock is in the way, or ours was lost.
    #[error("{0}")]
    Locked(String),
    /// Refused for what it asks (the message says why).
    #[error("{0}")]
    Refused(String),
    #[error("internal: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, BackupError>;

pub(crate) fn damaged(object: impl Into<String>, error: FormatError) -> BackupError {
    BackupError::Damaged {
        object: object.into(),
        error,
    }
}

/// Where the repository holds a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobAt {
    pub pack: ObjectId,
    pub entry: Entry,
}

/// Every blob the repository holds, by id.
#[derive(Default)]
pub(crate) struct Index {
    pub(crate) blobs: HashMap<BlobId, BlobAt>,
    /// Packs some index object lists.
    pub(crate) indexed: HashSet<ObjectId>,
    /// Packs no index lists whose headers are damaged, with why: their
    /// blobs are unknown.
    pub(crate) damaged: Vec<String>,
    /// Names of the unfinished backups' checkpoints in the store.
    pub(crate) checkpoints: HashSet<String>,
}

impl Index {
    pub(crate) fn add(&mut self, pack: ObjectId, entries: &[Entry]) {
        for e in entries {
            self.blobs.entry(e.id).or_insert(BlobAt { pack, entry: *e });
        }
    }
}

/// One pack as the store and the index objects show it.
#[derive(Debug)]
pub(crate) struct PackFound {
    /// Its size in the store; None where an index lists a pack the store
    /// does not hold.
    pub(crate) size: Option<u64>,
    /// Whether an index object lists it.
    pub(crate) indexed: bool,
    /// Its entries, or why its header could not be read.
    pub(crate) entries: std::result::Result<Vec<Entry>, String>,
}

/// What the store holds: every pack, and every index object by name.
#[derive(Debug, Default)]
pub(crate) struct Census {
    pub(crate) packs: BTreeMap<ObjectId, PackFound>,
    pub(crate) indexes: Vec<String>,
    /// Every checkpoint object, by name.
    pub(crate) checkpoints: Vec<String>,
}

/// Counts of what an operation has done, read while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes of the volume to read (backup) or write (restore).
    pub total_bytes: AtomicU64,
    /// Of them, done.
    pub done_bytes: AtomicU64,
    /// Bytes sent to the store (backup) or read from it (restore).
    pub store_bytes: AtomicU64,
    /// Objects written to the store.
    pub objects: AtomicU64,
}

impl Progress {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Index objects read at once when a repository's index is loaded (each
/// is read whole, up to its limit).
const INDEX_READS_IN_FLIGHT: usize = 4;

/// A backup as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub id: ObjectId,
    pub manifest: Manifest,
}

/// A repository opened with its key.
#[derive(Clone)]
pub struct Repository {
    pub(crate) store: Store,
    pub(crate) config: RepoConfig,
    pub(crate) keys: Arc<Keys>,
    /// Shared by the clones of one opened repository (an instant
    /// restore's, which outlives the request that opened it).
    pub(crate) index: Arc<Mutex<Index>>,
    /// The upload bandwidth limit, if any.
    pub(crate) pace: Option<Arc<crate::pace::Pace>>,
    pub(crate) lock_policy: LockPolicy,
    /// How often a backup writes its checkpoint (docs/BACKUP.md,
    /// "Checkpoints").
    pub(crate) checkpoint_every: std::time::Duration,
}

/// How often a backup writes its checkpoint: what a backup cut off reads
/// again at most, against the upload pipeline drained each time.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl std::fmt::Debug for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Repository({}, id {})",
            self.store.location(),
            self.config.id
        )
    }
}

impl Repository {
    /// Makes a new, empty repository at `location` (refused where one
    /// exists) with a new master key sealed under the user's key.
    pub async fn init(
        location: &Location,
        block_size: u32,
        key: &KeySource<'_>,
    ) -> Result<Repository> {
        let store = Store::open(location, true)?;
        let (config, master) = RepoConfig::new(block_size, key)?;
        if !store
            .put_new(names::CONFIG, Bytes::from(config.encode()))
            .await?
        {
            return Err(BackupError::Refused(format!(
                "{location} already holds a repository (its config object exists)"
            )));
        }
        let keys = Keys::derive(&master, config.id.as_bytes());
        Ok(Repository {
            store,
            config,
            keys: Arc::new(keys),
            index: Arc::new(Mutex::new(Index::default())),
            pace: None,
            lock_policy: LockPolicy::default(),
            checkpoint_every: CHECKPOINT_EVERY,
        })
    }

    /// Opens the repository at `location` with the user's key. Its index
    /// is read when an operation takes its lock (`lock`).
    pub async fn open(location: &Location, key: &KeySource<'_>) -> Result<Repository> {
        let store = Store::open(location, false)?;
        let bytes = store.get(names::CONFIG).await?.ok_or_else(|| {
            BackupError::NotFound(format!("{location} holds no repository (no config object)"))
        })?;
        let config = RepoConfig::decode(&bytes).map_err(|e| damaged("the config object", e))?;
        // A wrong key is the user's mistake, not damage.
        let master = config
            .unlock(key)
            .map_err(|e| BackupError::Refused(format!("{location}: {e}")))?;
        let keys = Keys::derive(&master, config.id.as_bytes());
        let repo = Repository {
            store,
            config,
            keys: Arc::new(keys),
            index: Arc::new(Mutex::new(Index::default())),
            pace: None,
            lock_policy: LockPolicy::default(),
            checkpoint_every: CHECKPOINT_EVERY,
        };
        Ok(repo)
    }

    /// This repository with uploads limited to `rate` bytes per second
    /// (none: unlimited).
    pub fn with_upload_rate(mut self, rate: Option<u64>) -> Self {
        self.pace = rate.map(|r| Arc::new(crate::pace::Pace::new(r)));
        self
    }

    /// Fault injection (tests): the store accepts `n` more writes and
    /// deletes, then fails them (as a store that went away).
    pub fn with_writes_failing_after(mut self, n: u64) -> Self {
        self.store.fail_writes_after(n);
        self
    }

    /// This repository's backups checkpointed every `every` (tests: zero,
    /// after every map piece).
    pub fn with_checkpoint_every(mut self, every: std::time::Duration) -> Self {
        self.checkpoint_every = every;
        self
    }

    /// This repository with locks aging by `policy`.
    pub fn with_lock_policy(mut self, policy: LockPolicy) -> Self {
        self.lock_policy = policy;
        self
    }

    /// Takes a lock for `operation` and reads the index under it: every
    /// index object, and the header of every pack no index lists (written
    /// by a backup that was cut off). Read under the lock, the index lists
    /// nothing a prune has deleted.
    pub async fn lock(&self, kind: LockKind, operation: &str) -> Result<RepoLock> {
        self.lock_with_census(kind, operation)
            .await
            .map(|(lock, _)| lock)
    }

    /// [`Repository::lock`], with what the index was read from.
    pub(crate) async fn lock_with_census(
        &self,
        kind: LockKind,
        operation: &str,
    ) -> Result<(RepoLock, Census)> {
        let lock =
            RepoLock::take(&self.store, &self.keys, self.lock_policy, kind, operation).await?;
        match self.load_index().await {
            Ok(census) => Ok((lock, census)),
            Err(e) => {
                lock.release().await;
                Err(e)
            }
        }
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    pub fn block_size(&self) -> u32 {
        self.config.block_size
    }

    pub fn location(&self) -> &Location {
        self.store.location()
    }

    pub(crate) fn index(&self) -> MutexGuard<'_, Index> {
        // Every change under the lock is whole (an insert).
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads an object and checks that its bytes are what its name says.
    pub(crate) async fn get_checked(&self, name: &str, id: &ObjectId) -> Result<Bytes> {
        let bytes =
            self.store.get(name).await?.ok_or_else(|| {
                BackupError::NotFound(format!("{name} is missing from the store"))
            })?;
        if ObjectId::of(&bytes) != *id {
            return Err(damaged(
                name.to_owned(),
                crate::format::invalid("an object", "its bytes are not what its name says"),
            ));
        }
        Ok(bytes)
    }

    /// Every index object, by name, with what it lists.
    pub(crate) async fn index_objects(&self) -> Result<Vec<(String, Vec<PackEntries>)>> {
        let listed: Vec<_> = self
            .store
            .list(names::INDEX)
            .await?
            .into_iter()
            .filter_map(|l| Some((id_of(&l.name)?, l.name)))
            .collect();
        // In listing order, a few at once (each is read whole).
        futures::stream::iter(listed)
            .map(|(id, name)| async move {
                let bytes = self.get_checked(&name, &id).await?;
                let packs =
                    index::decode(&self.keys, &bytes).map_err(|e| damaged(name.clone(), e))?;
                Ok((name, packs))
            })
            .buffered(INDEX_READS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// Every pack and index object in the store: each pack with its
    /// entries, from the index objects or, for a pack none lists (written
    /// by a backup that was cut off), from its header.
    pub(crate) async fn census(&self) -> Result<Census> {
        let mut census = Census::default();
        // Three listings at once: each is a round trip (or more) to the
        // store, and every operation begins with them.
        let (index_objects, pack_listing, checkpoints) = futures::try_join!(
            self.index_objects(),
            async { Ok(self.store.list(names::PACKS).await?) },
            async { Ok(self.store.list(names::CHECKPOINTS).await?) },
        )?;
        census.checkpoints = checkpoints.into_iter().map(|l| l.name).collect();
        for (name, packs) in index_objects {
            for p in packs {
                census.packs.entry(p.pack).or_insert(PackFound {
                    size: None,
                    indexed: true,
                    entries: Ok(p.entries),
                });
            }
            census.indexes.push(name);
        }
        for listed in pack_listing {
            let Some(id) = id_of(&listed.name) else {
                continue;
            };
            if let Some(found) = census.packs.get_mut(&id) {
                found.size = Some(listed.size);
                continue;
            }
            let entries = match self.pack_header(&id, listed.size).await {
                Ok(entries) => Ok(entries),
                // A pack cut short by a failed upload (a store that shows
                // partial objects) holds nothing a backup refers to.
                Err(BackupError::Damaged { object, error }) => {
                    tracing::warn!(pack = %object, error = %error, "a pack no index lists is damaged: its blobs are not used");
                    Err(format!("{object}: {error}"))
                }
                Err(e) => return Err(e),
            };
            census.packs.insert(
                id,
                PackFound {
                    size: Some(listed.size),
                    indexed: false,
                    entries,
                },
            );
        }
        Ok(census)
    }

    /// Reads the index afresh from the store; returns what it was made of.
    async fn load_index(&self) -> Result<Census> {
        let census = self.census().await?;
        let mut index = Index::default();
        for (id, found) in &census.packs {
            if found.indexed {
                index.indexed.insert(*id);
            }
            match &found.entries {
                Ok(entries) => index.add(*id, entries),
                Err(why) => index.damaged.push(why.clone()),
            }
        }
        index.checkpoints = census.checkpoints.iter().cloned().collect();
        *self.index() = index;
        Ok(census)
    }

    /// A pack's entries, read from its header with two ranged reads.
    pub(crate) async fn pack_header(&self, id: &ObjectId, size: u64) -> Result<Vec<Entry>> {
        let name = names::pack(id);
        if size < (pack::PACK_MAGIC.len() + TAIL_LEN) as u64 {
            return Err(damaged(name, crate::format::invalid("a pack", "too short")));
        }
        let tail = self
            .store
            .get_range(&name, size - TAIL_LEN as u64..size)
            .await?;
        let header_len = pack::decode_tail(&tail, size).map_err(|e| damaged(name.clone(), e))?;
        let start = size - TAIL_LEN as u64 - u64::from(header_len);
        let sealed = self
            .store
            .get_range(&name, start..size - TAIL_LEN as u64)
            .await?;
        pack::decode_header(&self.keys, &sealed, size).map_err(|e| damaged(name, e))
    }

    /// Writes an index object listing `packs`.
    pub(crate) async fn write_index(&self, packs: &[PackEntries]) -> Result<()> {
        if packs.is_empty() {
            return Ok(());
        }
        let bytes = index::encode(&self.keys, packs);
        let id = ObjectId::of(&bytes);
        self.store
            .put(&names::index(&id), Bytes::from(bytes))
            .await?;
        let mut index = self.index();
        for p in packs {
            index.indexed.insert(p.pack);
        }
        Ok(())
    }

    /// Every backup, oldest first.
    pub async fn list(&self) -> Result<Vec<Listing>> {
        let ids: Vec<ObjectId> = self
            .store
            .list(names::SNAPSHOTS)
            .await?
            .into_iter()
            .filter_map(|l| id_of(&l.name))
            .collect();
        let mut out: Vec<Listing> = futures::stream::iter(ids)
            .map(|id| async move {
                Ok::<_, BackupError>(Listing {
                    id,
                    manifest: self.manifest(&id).await?,
                })
            })
            .buffered(crate::restore::READS_IN_FLIGHT)
            .try_collect()
            .await?;
        out.sort_by(|a, b| {
            (a.manifest.completed_unix_ms, &a.manifest.volume, a.id).cmp(&(
                b.manifest.completed_unix_ms,
                &b.manifest.volume,
                b.id,
            ))
        });
        Ok(out)
    }

    /// One backup's manifest.
    pub async fn manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let name = names::snapshot(id);
        let bytes = match self.get_checked(&name, id).await {
            Err(BackupError::Store(e)) if e.kind == StoreErrorKind::NotFound => {
                return Err(BackupError::NotFound(format!("no backup {id}")));
            }
            other => other?,
        };
        manifest::decode(&self.keys, &bytes).map_err(|e| damaged(name, e))
    }

    /// The backup a user names: its full id, or a prefix of at least 8 hex
    /// digits that one backup has.
    pub async fn find(&self, name: &str) -> Result<Listing> {
        if name.len() < 8 || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BackupError::Refused(format!(
                "{name:?}: a backup is named by its id (at least 8 of its hex digits)"
            )));
        }
        let name = name.to_ascii_lowercase();
        let mut found = self
            .store
            .list(names::SNAPSHOTS)
            .await?
            .into_iter()
            .filter_map(|l| id_of(&l.name))
            .filter(|id| id.to_string().starts_with(&name));
        let id = found.next().ok_or_else(|| {
            BackupError::NotFound(format!("no backup {name} in {}", self.location()))
        })?;
        if found.next().is_some() {
            return Err(BackupError::Refused(format!(
                "{name} names more than one backup: give more of its digits"
            )));
        }
        Ok(Listing {
            id,
            manifest: self.manifest(&id).await?,
        })
    }

    /// Where a blob is. A blob a backup needs that no pack holds is
    /// damage of the repository, named, with the damaged packs found.
    pub(crate) fn locate(&self, id: &BlobId, needed_by: &str) -> Result<BlobAt> {
        let index = self.index();
        index.blobs.get(id).copied().ok_or_else(|| {
            let found = match index.damaged.as_slice() {
                [] => String::new(),
                damaged => format!("; damaged packs: {}", damaged.join("; ")),
            };
            damaged(
                needed_by.to_owned(),
                crate::format::invalid(
                    "a backup",
                    format!(
                        "needs blob {id}, which no pack in the repository holds (deleted, or its \
                         pack lost or damaged){found}"
                    ),
                ),
            )
        })
    }
}
