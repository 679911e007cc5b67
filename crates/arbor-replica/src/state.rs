//! Replication state that survives restarts: the pairs this host sends
//! (`arbor replica add`) and the volumes it holds as replicas (whose
//! source, through which hosts). One JSON file in the data directory
//! (docs/REPLICATION.md, "State file"), mode 0600, replaced atomically on
//! every change (`arbor_io::small_file`: written to a temporary file,
//! synced, renamed over, the directory synced).
//!
//! Which snapshot each pair last replicated is not here: it is the
//! snapshot that carries the pair's hold in the pool, so the pool and this
//! file can never disagree about it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// The state file's version.
pub const STATE_VERSION: u32 = 1;
/// The largest state file read.
const MAX_STATE_BYTES: u64 = 16 << 20;
/// Most pairs one host sends.
pub const MAX_PAIRS: usize = 1024;

/// One replication pair, as configured at its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// The local volume replicated.
    pub volume: String,
    /// The target daemon's replication listener, `HOST:PORT`.
    pub target: String,
    /// The volume's name on the target.
    pub remote_volume: String,
    /// The identity the target's certificate must carry (default: HOST).
    #[serde(default)]
    pub identity: Option<String>,
    /// Bytes per second sent at most.
    #[serde(default)]
    pub rate_limit: Option<u64>,
    /// Seconds between cycles.
    pub interval_secs: u64,
    /// Replication snapshots kept here (the newest; held ones always).
    #[serde(default)]
    pub keep: Option<u32>,
    /// The target was seeded by hand: never start over with a full stream.
    #[serde(default)]
    pub seeded: bool,
    /// The next cycle rolls a diverged target back (`resync --force`).
    #[serde(default)]
    pub resync: bool,
}

impl Pair {
    /// How the pair is named in messages, status and the API.
    pub fn key(&self) -> String {
        format!("{}->{}/{}", self.volume, self.target, self.remote_volume)
    }

    /// The hold tag that keeps this pair's last replicated snapshot.
    pub fn hold_tag(&self) -> String {
        let raw = format!("replica-to:{}:{}", self.target, self.remote_volume);
        raw.chars()
            .map(|c| {
                if arbor_engine::is_name_char(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(arbor_engine::MAX_HOLD_TAG_LEN)
            .collect()
    }

    /// The host part of the target address.
    pub fn host(&self) -> &str {
        let t = self.target.as_str();
        match t.rsplit_once(':') {
            Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => t,
        }
    }
}

/// A volume this host holds as a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// The identity of its one source; None after `demote`, until the
    /// first source (allowed by the configuration) replicates to it.
    pub source: Option<String>,
    /// The hosts its snapshots came through, master first, source last.
    #[serde(default)]
    pub path: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct File {
    version: u32,
    pairs: Vec<Pair>,
    replicas: BTreeMap<String, Role>,
}

/// What is wrong with the state or a change to it.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("replication state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("replication state {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("replication state {path} is version {version}; this build reads {STATE_VERSION}")]
    Version { path: PathBuf, version: u32 },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
}

/// The state file, loaded, and every change written through.
pub struct Store {
    path: PathBuf,
    file: Mutex<File>,
}

impl Store {
    /// Loads `path`; a missing file is an empty state.
    pub fn open(path: &Path) -> Result<Store, StateError> {
        let io = |source| StateError::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = arbor_io::small_file::read_bounded(path, MAX_STATE_BYTES).map_err(|e| {
            if e.kind() == std::io::ErrorKind::FileTooLarge {
                StateError::Damaged {
                    path: path.to_owned(),
                    reason: format!("larger than {MAX_STATE_BYTES} bytes"),
                }
            } else {
                io(e)
            }
        })?;
        let file = match bytes {
            None => File {
                version: STATE_VERSION,
                ..File::default()
            },
            Some(text) => {
                let file: File =
                    serde_json::from_slice(&text).map_err(|e| StateError::Damaged {
                        path: path.to_owned(),
                        reason: e.to_string(),
                    })?;
                if file.version != STATE_VERSION {
                    return Err(StateError::Version {
                        path: path.to_owned(),
                        version: file.version,
                    });
                }
                file
            }
        };
        Ok(Store {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    fn lock(&self) -> MutexGuard<'_, File> {
        // Every change is applied to a copy and stored before it replaces
        // the state: a panic cannot leave it half-changed.
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change` to a copy of the state, stores it durably, then
    /// keeps it: a failed write changes nothing.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut File) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let mut file = self.lock();
        let mut next = file.clone();
        let out = change(&mut next)?;
        self.write(&next)?;
        *file = next;
        Ok(out)
    }

    fn write(&self, file: &File) -> Result<(), StateError> {
        let io = |source| StateError::Io {
            path: self.path.clone(),
            source,
        };
        let text =
            serde_json::to_vec_pretty(file).map_err(|e| StateError::Invalid(e.to_string()))?;
        arbor_io::small_file::replace_atomically(&self.path, &text, 0o600).map_err(io)
    }

    /// The configured pairs.
    pub fn pairs(&self) -> Vec<Pair> {
        self.lock().pairs.clone()
    }

    /// Adds `pair`; refuses a second pair of the same volume and target, and
    /// a pair sending a volume this host holds as a replica of the same
    /// target (a two-host cycle).
    pub fn add_pair(&self, pair: Pair) -> Result<(), StateError> {
        self.change(|f| {
            if f.pairs.iter().any(|p| p.key() == pair.key()) {
                return Err(StateError::Invalid(format!(
                    "{} is already replicated to {}",
                    pair.volume, pair.target
                )));
            }
            if f.pairs.len() >= MAX_PAIRS {
                return Err(StateError::Invalid(format!(
                    "at most {MAX_PAIRS} replication pairs"
                )));
            }
            f.pairs.push(pair);
            Ok(())
        })
    }

    /// Removes the pairs of `volume` to `target` (all of its pairs if None);
    /// returns them.
    pub fn remove_pairs(
        &self,
        volume: &str,
        target: Option<&str>,
    ) -> Result<Vec<Pair>, StateError> {
        self.change(|f| {
            let (gone, kept): (Vec<Pair>, Vec<Pair>) = f
                .pairs
                .drain(..)
                .partition(|p| p.volume == volume && target.is_none_or(|t| p.target == t));
            f.pairs = kept;
            if gone.is_empty() {
                return Err(StateError::NotFound(format!(
                    "{volume} is not replicated{}",
                    target.map(|t| format!(" to {t}")).unwrap_or_default()
                )));
            }
            Ok(gone)
        })
    }

    /// Changes the pairs of `volume` (to `target`, or all) with `edit`;
    /// returns how many.
    pub fn edit_pairs(
        &self,
        volume: &str,
        target: Option<&str>,
        edit: impl Fn(&mut Pair),
    ) -> Result<usize, StateError> {
        self.change(|f| {
            let mut n = 0;
            for p in f
                .pairs
                .iter_mut()
                .filter(|p| p.volume == volume && target.is_none_or(|t| p.target == t))
            {
                edit(p);
                n += 1;
            }
            if n == 0 {
                return Err(StateError::NotFound(format!("{volume} is not replicated")));
            }
            Ok(n)
        })
    }

    /// The replica role of `volume`, if it is one.
    pub fn role(&self, volume: &str) -> Option<Role> {
        self.lock().replicas.get(volume).cloned()
    }

    /// Every volume held as a replica.
    pub fn replicas(&self) -> BTreeMap<String, Role> {
        self.lock().replicas.clone()
    }

    /// Makes `volume` a replica with `role` (read-only here).
    pub fn set_role(&self, volume: &str, role: Role) -> Result<(), StateError> {
        if self.role(volume).as_ref() == Some(&role) {
            return Ok(());
        }
        self.change(|f| {
            f.replicas.insert(volume.to_owned(), role);
            Ok(())
        })
    }

    /// Changes the role of `volume`, which must still be a replica (a
    /// promote may have made it writable meanwhile: NotFound then, and
    /// nothing changes).
    pub fn update_role(&self, volume: &str, role: Role) -> Result<(), StateError> {
        if self.role(volume).as_ref() == Some(&role) {
            return Ok(());
        }
        self.change(|f| match f.replicas.get_mut(volume) {
            Some(r) => {
                *r = role;
                Ok(())
            }
            None => Err(StateError::NotFound(format!(
                "{volume} is not a replica here"
            ))),
        })
    }

    /// Makes `volume` writable again; returns the role it had.
    pub fn clear_role(&self, volume: &str) -> Result<Role, StateError> {
        self.change(|f| {
            f.replicas
                .remove(volume)
                .ok_or_else(|| StateError::NotFound(format!("{volume} is not a replica here")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(volume: &str, target: &str) -> Pair {
        Pair {
            volume: volume.into(),
            target: target.into(),
            remote_volume: volume.into(),
            identity: None,
            rate_limit: None,
            interval_secs: 30,
            keep: None,
            seeded: false,
            resync: false,
        }
    }

    #[test]
    fn changes_survive_a_reopen_and_a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replication.json");
        let store = Store::open(&path).unwrap();
        store.add_pair(pair("vm1", "10.0.0.2:7400")).unwrap();
        assert!(store.add_pair(pair("vm1", "10.0.0.2:7400")).is_err());
        store.add_pair(pair("vm1", "10.0.0.3:7400")).unwrap();
        store
            .set_role(
                "db",
                Role {
                    source: Some("alpha".into()),
                    path: vec!["alpha".into()],
                },
            )
            .unwrap();
        store
            .edit_pairs("vm1", Some("10.0.0.3:7400"), |p| p.resync = true)
            .unwrap();
        let again = Store::open(&path).unwrap();
        assert_eq!(again.pairs(), store.pairs());
        assert!(again.pairs()[1].resync && !again.pairs()[0].resync);
        assert_eq!(again.role("db").unwrap().source.as_deref(), Some("alpha"));
        assert_eq!(again.remove_pairs("vm1", None).unwrap().len(), 2);
        assert!(again.remove_pairs("vm1", None).is_err());
        again.clear_role("db").unwrap();
        assert!(Store::open(&path).unwrap().replicas().is_empty());

        std::fs::write(&path, b"{\"version\": 1, \"pairs\": [").unwrap();
        assert!(matches!(
            Store::open(&path),
            Err(StateError::Damaged { .. })
        ));
        std::fs::write(&path, b"{\"version\": 9, \"pairs\": [], \"replicas\": {}}").unwrap();
        assert!(matches!(
            Store::open(&path),
            Err(StateError::Version { version: 9, .. })
        ));
    }

    #[test]
    fn hold_tags_are_valid_names() {
        let mut p = pair("vm1", "[fe80::1]:7400");
        p.remote_volume = "db/x".into();
        let tag = p.hold_tag();
        assert!(tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)));
        assert_eq!(p.host(), "fe80::1");
        assert_eq!(pair("v", "beta:7400").host(), "beta");
        // However long the target, the tag fits its hold record.
        let long = pair("vm1", &format!("{}:7400", "h".repeat(253)));
        assert_eq!(long.hold_tag().len(), arbor_engine::MAX_HOLD_TAG_LEN);
        arbor_engine::check_hold_tag(&long.hold_tag()).unwrap();
    }
}
