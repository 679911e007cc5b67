//! Repository locks (docs/BACKUP.md, "Locks"). Backups only add objects,
//! so any number may run at once, with restores and verifies, from any
//! number of hosts: each holds a shared lock. A prune deletes objects, so
//! it holds the only lock: it starts only when no one else holds one, and
//! no one starts while it runs.
//!
//! A lock is an object under `locks/`. Taking one writes it, then lists
//! the others: of two that race, each sees the other's (the store reads
//! its own writes), so at worst both give way, never both go on. A holder
//! rewrites its object under a new name every `refresh_every`; one not
//! rewritten for `stale_after` by the store's clock (compared with the
//! time the store gave the lock just written, so hosts' clocks do not
//! matter), or one of this host and boot whose process is gone (a daemon
//! killed), is stale: no one waits for it, and a prune (not its dry run)
//! deletes it.
//!
//! A holder that could not rewrite its lock for half of `stale_after`
//! stops before it changes anything more (`check`): others may take it
//! for stale.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::crypto::Keys;
use crate::format::lock::{self, LockRecord};
use crate::format::{ObjectId, REPO_VERSION};
use crate::repo::{BackupError, Result};
use crate::store::{id_of, names, Store, StoreErrorKind};

/// How locks age (a policy, apart from the mechanism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockPolicy {
    /// A lock not rewritten for this long is stale.
    pub stale_after: Duration,
    /// How often a holder rewrites its lock.
    pub refresh_every: Duration,
}

impl Default for LockPolicy {
    /// restic's figures: stale after 30 minutes, rewritten every 5.
    fn default() -> Self {
        LockPolicy {
            stale_after: Duration::from_secs(30 * 60),
            refresh_every: Duration::from_secs(5 * 60),
        }
    }
}

/// A shared or the exclusive lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// Backups, restores, verifies: they add objects or only read.
    Shared,
    /// A prune: it deletes objects.
    Exclusive,
}

/// Another holder's lock, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherLock {
    pub name: String,
    /// None where its object does not open (damaged, or another key's).
    pub record: Option<LockRecord>,
    /// How long before our own lock the store last wrote it.
    pub age: Duration,
    /// Why it is stale, if it is.
    pub stale: Option<String>,
}

impl std::fmt::Display for OtherLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.record {
            Some(r) => write!(
                f,
                "{} by {} (pid {}), rewritten {} s ago",
                r.operation,
                r.host,
                r.pid,
                self.age.as_secs()
            ),
            None => write!(f, "{} (does not open)", self.name),
        }
    }
}

/// This process's host name, boot and id, as locks name their holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub host: String,
    pub boot_id: String,
    pub pid: u32,
}

impl Holder {
    pub fn this_process() -> Holder {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        Holder {
            host: read("/proc/sys/kernel/hostname"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            pid: std::process::id(),
        }
    }

    /// Why `record`'s holder is gone, if this host can tell: same host and
    /// boot, and no process of its id.
    fn gone(&self, record: &LockRecord) -> Option<String> {
        if self.boot_id.is_empty()
            || record.host != self.host
            || record.boot_id != self.boot_id
            || record.pid == self.pid
        {
            return None;
        }
        let alive = std::path::Path::new(&format!("/proc/{}", record.pid)).exists();
        (!alive).then(|| format!("its process {} on this host is gone", record.pid))
    }
}

struct Held {
    store: Store,
    keys: Arc<Keys>,
    record: LockRecord,
    /// The lock object's current name.
    name: Mutex<String>,
    /// When the lock object was last written.
    written: Mutex<Instant>,
    policy: LockPolicy,
}

impl Held {
    fn name(&self) -> String {
        // Replaced whole.
        self.name.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn write(&self) -> Result<String> {
        let bytes = lock::encode(&self.keys, &self.record);
        let name = names::lock(&ObjectId::of(&bytes));
        let before = Instant::now();
        self.store.put(&name, Bytes::from(bytes)).await?;
        *self.written.lock().unwrap_or_else(|p| p.into_inner()) = before;
        Ok(name)
    }

    /// Writes the lock under a new name, then deletes the old one.
    async fn refresh(&self) -> Result<()> {
        let old = self.name();
        let new = self.write().await?;
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = new;
        self.store.delete(&old).await?;
        Ok(())
    }
}

/// A lock held: rewritten in the background until released.
pub struct RepoLock {
    held: Arc<Held>,
    refresher: JoinHandle<()>,
    released: bool,
    /// Stale locks found when this one was taken.
    pub stale: Vec<OtherLock>,
}

impl std::fmt::Debug for RepoLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RepoLock({})", self.held.name())
    }
}

impl RepoLock {
    /// Takes a lock of `kind` for `operation`, or says who is in the way
    /// (`BackupError::Locked`).
    pub(crate) async fn take(
        store: &Store,
        keys: &Arc<Keys>,
        policy: LockPolicy,
        kind: LockKind,
        operation: &str,
    ) -> Result<RepoLock> {
        let holder = Holder::this_process();
        let record = LockRecord {
            version: REPO_VERSION,
            exclusive: kind == LockKind::Exclusive,
            operation: operation.to_owned(),
            host: holder.host.clone(),
            boot_id: holder.boot_id.clone(),
            pid: holder.pid,
            taken_unix_ms: crate::backup::now_ms(),
        };
        let held = Arc::new(Held {
            store: store.clone(),
            keys: Arc::clone(keys),
            record,
            name: Mutex::new(String::new()),
            written: Mutex::new(Instant::now()),
            policy,
        });
        let name = held.write().await?;
        *held.name.lock().unwrap_or_else(|p| p.into_inner()) = name.clone();
        let others = match others(store, keys, &holder, policy, &name).await {
            Ok(o) => o,
            Err(e) => {
                let _ = store.delete(&name).await;
                return Err(e);
            }
        };
        let in_way: Vec<&OtherLock> = others
            .iter()
            .filter(|o| o.stale.is_none())
            .filter(|o| {
                kind == LockKind::Exclusive
                    // A lock that does not open is taken for exclusive.
                    || o.record.as_ref().is_none_or(|r| r.exclusive)
            })
            .collect();
        if !in_way.is_empty() {
            let _ = store.delete(&name).await;
            let who: Vec<String> = in_way.iter().map(|o| o.to_string()).collect();
            return Err(BackupError::Locked(format!(
                "the repository is in use: {}; try again when {} done (a lock not rewritten \
                 for {} minutes is stale)",
                who.join("; "),
                if who.len() == 1 { "it is" } else { "they are" },
                policy.stale_after.as_secs() / 60
            )));
        }
        let stale = others.into_iter().filter(|o| o.stale.is_some()).collect();
        let refresher = {
            let held = Arc::clone(&held);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(held.policy.refresh_every).await;
                    if let Err(e) = held.refresh().await {
                        tracing::warn!(lock = %held.name(), error = %crate::error_chain(&e), "could not rewrite a repository lock; trying again");
                    }
                }
            })
        };
        Ok(RepoLock {
            held,
            refresher,
            released: false,
            stale,
        })
    }

    /// Whether the lock is still surely held: written within half of
    /// `stale_after`. Called before each step that changes the repository.
    pub fn check(&self) -> Result<()> {
        let written = *self.held.written.lock().unwrap_or_else(|p| p.into_inner());
        let limit = self.held.policy.stale_after / 2;
        if written.elapsed() > limit {
            return Err(BackupError::Locked(format!(
                "the repository lock could not be rewritten for {} s (others may take it for \
                 stale after {} s): stopped before changing more",
                written.elapsed().as_secs(),
                self.held.policy.stale_after.as_secs()
            )));
        }
        Ok(())
    }

    /// Deletes the stale locks found when this one was taken (only the
    /// exclusive lock may: no one else gives way to them meanwhile).
    pub async fn delete_stale(&self) -> Result<()> {
        if !self.held.record.exclusive {
            return Err(BackupError::Internal(
                "only the exclusive lock deletes stale locks".into(),
            ));
        }
        for o in &self.stale {
            tracing::warn!(lock = %o, why = o.stale.as_deref().unwrap_or(""), "deleting a stale repository lock");
            self.held.store.delete(&o.name).await?;
        }
        Ok(())
    }

    /// The lock object's current name.
    pub fn name(&self) -> String {
        self.held.name()
    }

    /// Stops rewriting the lock and deletes it.
    pub async fn release(mut self) {
        self.released = true;
        self.refresher.abort();
        let name = self.held.name();
        if let Err(e) = self.held.store.delete(&name).await {
            tracing::warn!(lock = %name, error = %e, "could not delete a repository lock: it goes stale");
        }
    }
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        // Released: the task is already stopped. Dropped otherwise (a
        // cancelled request): stop rewriting and delete it in the
        // background; it goes stale if that fails.
        self.refresher.abort();
        if self.released {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, name) = (self.held.store.clone(), self.held.name());
            runtime.spawn(async move {
                let _ = store.delete(&name).await;
            });
        }
    }
}

/// Every lock but `own`, with its age against `own` by the store's clock.
pub(crate) async fn others(
    store: &Store,
    keys: &Keys,
    holder: &Holder,
    policy: LockPolicy,
    own: &str,
) -> Result<Vec<OtherLock>> {
    let listed = store.list(names::LOCKS).await?;
    let now = listed
        .iter()
        .find(|l| l.name == own)
        .map(|l| l.modified_ms)
        .ok_or_else(|| {
            BackupError::Store(crate::store::StoreError::unavailable(format!(
                "the store did not list the lock {own} just written"
            )))
        })?;
    let mut out = Vec::new();
    for l in listed.into_iter().filter(|l| l.name != own) {
        if id_of(&l.name).is_none() {
            continue;
        }
        let age =
            Duration::from_millis(u64::try_from(now.saturating_sub(l.modified_ms)).unwrap_or(0));
        let bytes = match store.get(&l.name).await {
            Ok(Some(b)) => b,
            // Released meanwhile.
            Ok(None) => continue,
            Err(e) if e.kind == StoreErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let record = lock::decode(keys, &bytes).ok();
        let stale = if age > policy.stale_after {
            Some(format!(
                "not rewritten for {} s (stale after {} s)",
                age.as_secs(),
                policy.stale_after.as_secs()
            ))
        } else {
            record.as_ref().and_then(|r| holder.gone(r))
        };
        out.push(OtherLock {
            name: l.name,
            record,
            age,
            stale,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &Holder, pid: u32) -> LockRecord {
        LockRecord {
            version: REPO_VERSION,
            exclusive: false,
            operation: "backup".into(),
            host: holder.host.clone(),
            boot_id: holder.boot_id.clone(),
            pid,
            taken_unix_ms: 0,
        }
    }

    #[test]
    fn a_lock_of_a_process_gone_from_this_host_is_stale_and_only_that() {
        let me = Holder::this_process();
        assert!(!me.boot_id.is_empty(), "no boot id on this host");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(me.gone(&record(&me, dead)).is_some());
        // This process, a live one, another host, another boot: not gone.
        assert!(me.gone(&record(&me, me.pid)).is_none());
        assert!(me.gone(&record(&me, 1)).is_none());
        let elsewhere = LockRecord {
            host: format!("{}-other", me.host),
            ..record(&me, dead)
        };
        assert!(me.gone(&elsewhere).is_none());
        let rebooted = LockRecord {
            boot_id: "another boot".into(),
            ..record(&me, dead)
        };
        assert!(me.gone(&rebooted).is_none());
    }
}
