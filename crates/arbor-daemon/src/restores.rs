//! Volumes that serve while a restore fills them (docs/BACKUP.md, "Instant
//! restore"): which volumes they are, shared by the NBD exports (every
//! request of such a volume goes through its restore), the volume views
//! and the restores' own tasks (`backups.rs`).
//!
//! A volume is listed from the moment its restore makes it (or, after a
//! restart, from before anything is served) until the restore is whole. A
//! restore taken up after a restart is listed before it can run (its
//! repository may not answer yet): meanwhile its volume's requests fail
//! with EIO, saying why, rather than read holes as zeros.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arbor_api::model::RestoringView;
use arbor_backup::LiveRestore;
use arbor_engine::VolumeId;

/// One volume's restore.
pub struct Slot {
    live: OnceLock<Arc<LiveRestore>>,
    /// Why it is not filling: taken up after a restart and waiting for its
    /// repository, or its fill ended with failed blocks.
    note: Mutex<Option<String>>,
    pub repository: String,
    pub backup: String,
    pub size: u64,
}

impl Slot {
    pub fn new(repository: &str, backup: &str, size: u64, note: Option<String>) -> Arc<Self> {
        Arc::new(Slot {
            live: OnceLock::new(),
            note: Mutex::new(note),
            repository: repository.to_owned(),
            backup: backup.to_owned(),
            size,
        })
    }

    /// The restore, once it runs.
    pub fn live(&self) -> Option<&Arc<LiveRestore>> {
        self.live.get()
    }

    pub fn set_live(&self, live: Arc<LiveRestore>) {
        // Set once, by the one task that runs this restore.
        let _ = self.live.set(live);
        self.set_note(None);
    }

    pub fn note(&self) -> Option<String> {
        self.note_lock().clone()
    }

    pub fn set_note(&self, note: Option<String>) {
        *self.note_lock() = note;
    }

    fn note_lock(&self) -> MutexGuard<'_, Option<String>> {
        // Every change under the lock is whole (a replacement).
        self.note.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every block is in place: requests go straight to the pool.
    pub fn is_complete(&self) -> bool {
        self.live().is_some_and(|l| l.is_complete())
    }

    pub fn view(&self) -> RestoringView {
        let note = self.note();
        let Some(live) = self.live() else {
            return RestoringView {
                repository: self.repository.clone(),
                backup: self.backup.clone(),
                state: "resuming".into(),
                done_bytes: 0,
                size: self.size,
                failed_blocks: 0,
                message: note,
            };
        };
        let status = live.status();
        let (state, message) = if status.failed > 0 {
            ("failed", status.first_failure)
        } else if let Some(waiting) = status.waiting_for {
            ("waiting", Some(waiting))
        } else {
            ("filling", note)
        };
        RestoringView {
            repository: self.repository.clone(),
            backup: self.backup.clone(),
            state: state.into(),
            done_bytes: live
                .progress()
                .done_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
                .min(self.size),
            size: self.size,
            failed_blocks: status.failed,
            message,
        }
    }
}

/// The volumes being restored while they serve.
#[derive(Default)]
pub struct LiveRestores {
    slots: Mutex<HashMap<VolumeId, Arc<Slot>>>,
    /// Names of volumes a restore is making, not listed yet.
    making: Mutex<HashSet<String>>,
}

/// A volume being made by a restore, until dropped.
pub struct Making<'a> {
    restores: &'a LiveRestores,
    name: String,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        lock(&self.restores.making).remove(&self.name);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is whole (an insert or a removal).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LiveRestores {
    fn slots(&self) -> MutexGuard<'_, HashMap<VolumeId, Arc<Slot>>> {
        lock(&self.slots)
    }

    /// Marks `name` as being made by a restore until the guard drops (it
    /// is listed by then): an export of it meanwhile is refused.
    pub fn making(&self, name: &str) -> Making<'_> {
        lock(&self.making).insert(name.to_owned());
        Making {
            restores: self,
            name: name.to_owned(),
        }
    }

    pub fn is_making(&self, name: &str) -> bool {
        lock(&self.making).contains(name)
    }

    pub fn get(&self, id: VolumeId) -> Option<Arc<Slot>> {
        self.slots().get(&id).cloned()
    }

    pub fn insert(&self, id: VolumeId, slot: Arc<Slot>) {
        self.slots().insert(id, slot);
    }

    pub fn remove(&self, id: VolumeId) {
        self.slots().remove(&id);
    }

    pub fn view(&self, id: VolumeId) -> Option<RestoringView> {
        self.get(id).map(|s| s.view())
    }

    /// The `restore_incomplete` alerts: a restore that cannot fill its
    /// volume now (critical once blocks failed).
    pub fn conditions(&self, pool: &arbor_engine::Pool) -> Vec<crate::alerts::Condition> {
        use arbor_api::model::{AlertKind, Severity};
        let slots: Vec<(VolumeId, Arc<Slot>)> = self
            .slots()
            .iter()
            .map(|(id, s)| (*id, Arc::clone(s)))
            .collect();
        slots
            .into_iter()
            .filter_map(|(id, slot)| {
                let view = slot.view();
                let severity = match view.state.as_str() {
                    "failed" => Severity::Critical,
                    "waiting" | "resuming" => Severity::Warning,
                    _ => return None,
                };
                let name = pool.info(id).ok()?.name;
                let message = match view.state.as_str() {
                    "failed" => format!(
                        "{} blocks of {name} could not be restored from backup {} (reads of them fail): {}",
                        view.failed_blocks,
                        view.backup,
                        view.message.unwrap_or_default()
                    ),
                    _ => format!(
                        "the restore of {name} from backup {} waits: {}",
                        view.backup,
                        view.message.unwrap_or_default()
                    ),
                };
                Some(crate::alerts::Condition::new(
                    AlertKind::RestoreIncomplete,
                    severity,
                    &name,
                    message,
                ))
            })
            .collect()
    }
}
