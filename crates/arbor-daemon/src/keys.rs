//! Encrypted volumes' keys (docs/SECURITY.md "Encryption at rest",
//! docs/FORMAT.md §6.6): the pool's key store (`arbor.keys`), the data keys
//! unwrapped with a user's key and loaded into the engine, and changes of
//! the user's key.
//!
//! A volume created with encryption gets a new data key in a new slot of
//! the store, wrapped by the user's key; its snapshots and clones name
//! the same slot, so loading the key of any of them unlocks them all, and
//! unloading locks them all. The engine refuses I/O to a locked volume;
//! the NBD layer does not export it. Keys are loaded until the daemon
//! stops or they are unloaded: after a restart every encrypted volume is
//! locked.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_api::model::KeyMaterial;
use arbor_crypt::{DataUnit, Kdf, KeyRecord, UserKey, VolumeCipher};
use arbor_engine::{Pool, VolumeId};
use tracing::{info, warn};
use zeroize::Zeroize;

use crate::error::{DaemonError, Result};

/// The data units encrypted volumes get unless the request says: 4 KiB,
/// which their NBD exports advertise as the minimum block size (512-byte
/// units cost 2.3x the cipher time, docs/PERFORMANCE.md §17).
pub const DEFAULT_UNIT: DataUnit = DataUnit::B4096;

pub struct Keys {
    pool: Arc<Pool>,
}

fn crypt_error(e: arbor_crypt::CryptError) -> DaemonError {
    DaemonError::Invalid(e.to_string())
}

/// The user's key a request carries (its text zeroed once read).
pub fn user_key(mut material: KeyMaterial) -> Result<UserKey> {
    let key = match &material {
        KeyMaterial::Raw { hex } => UserKey::raw_from_file(hex.as_bytes()),
        KeyMaterial::Passphrase { passphrase } => UserKey::passphrase(passphrase.as_bytes()),
    };
    match &mut material {
        KeyMaterial::Raw { hex } => hex.zeroize(),
        KeyMaterial::Passphrase { passphrase } => passphrase.zeroize(),
    }
    key.map_err(crypt_error)
}

impl Keys {
    pub fn new(pool: Arc<Pool>) -> Self {
        Self { pool }
    }

    /// Creates encrypted volume `name`: a new data key, wrapped by `user`,
    /// in a new slot of the pool's key store (recorded first, and kept
    /// while the volume is made), loaded, then the volume. A failure after
    /// the slot is recorded leaves the slot to the next change of the
    /// store, which drops slots no volume names.
    pub fn create_volume(
        &self,
        name: &str,
        size: u64,
        user: &UserKey,
        unit: Option<u32>,
    ) -> Result<VolumeId> {
        let unit = match unit {
            None => DEFAULT_UNIT,
            Some(bytes) => DataUnit::from_bytes(u64::from(bytes)).ok_or_else(|| {
                DaemonError::Invalid(format!(
                    "a data unit of {bytes} bytes: encrypted volumes take 512 or 4096"
                ))
            })?,
        };
        // Before the store changes (the engine checks again when the
        // volume is made): an older pool gets no key record it cannot use.
        if !self.pool.format_version().has_encryption() {
            return Err(arbor_engine::Error::from(arbor_engine::Unsupported::Format(
                arbor_engine::Capability::Encryption,
            ))
            .into());
        }
        let (record, data_key) =
            KeyRecord::create(user, unit, Kdf::PASSPHRASE_DEFAULT).map_err(crypt_error)?;
        let key_id = record.key_id;
        let cipher = VolumeCipher::new(data_key, key_id, unit).map_err(crypt_error)?;
        let new_slot = self.pool.add_key_record(record)?;
        let slot = new_slot.slot();
        self.pool.load_key(slot, cipher)?;
        match self.pool.create_encrypted_volume(name, size, slot) {
            Ok(id) => {
                info!(volume = %name, slot, key = %key_id, "encrypted volume created");
                Ok(id)
            }
            Err(e) => {
                self.pool.unload_key(slot);
                Err(e.into())
            }
        }
    }

    /// Clones encrypted snapshot `snapshot` as `name`, its data key
    /// wrapped by `new` in a slot of its own (opened with `old`, the
    /// snapshot's key): the clone shares the snapshot's chunks and is
    /// unlocked (loaded) now; after a restart `new` opens it, `old` does
    /// not.
    pub fn clone_with_key(
        &self,
        snapshot: &str,
        name: &str,
        old: &UserKey,
        new: &UserKey,
    ) -> Result<VolumeId> {
        let slot = self.slot_of(snapshot)?;
        let record = self
            .pool
            .key_record(slot)?
            .ok_or_else(|| DaemonError::Invalid(format!("no key for {snapshot} in the store")))?;
        let data_key = record.unwrap_key(old).map_err(crypt_error)?;
        let rewrapped = record
            .rewrap(old, new, Kdf::PASSPHRASE_DEFAULT)
            .map_err(crypt_error)?;
        let cipher =
            VolumeCipher::new(data_key, record.key_id, record.unit).map_err(crypt_error)?;
        let new_slot = self.pool.add_key_record(rewrapped)?;
        self.pool.load_key(new_slot.slot(), cipher)?;
        match self.pool.clone_snapshot_with_key(snapshot, name, &new_slot) {
            Ok(id) => {
                info!(snapshot = %snapshot, clone = %name, slot = new_slot.slot(), "clone with a key of its own");
                Ok(id)
            }
            Err(e) => {
                self.pool.unload_key(new_slot.slot());
                Err(e.into())
            }
        }
    }

    /// The slot of encrypted volume `name`.
    fn slot_of(&self, name: &str) -> Result<u64> {
        let id = self.pool.lookup(name)?;
        self.pool
            .info(id)?
            .key_slot
            .ok_or_else(|| DaemonError::Invalid(format!("{name} is not encrypted")))
    }

    /// Unwraps `name`'s data key with `user` and loads it: `name`, and
    /// every volume, snapshot and clone that shares its key, unlock.
    pub fn load(&self, name: &str, user: &UserKey) -> Result<()> {
        let slot = self.slot_of(name)?;
        let record = self.pool.key_record(slot)?.ok_or_else(|| {
            DaemonError::Invalid(format!(
                "the pool's key store has no key for {name} (slot {slot}): the store is damaged"
            ))
        })?;
        let data_key = record.unwrap_key(user).map_err(crypt_error)?;
        let cipher =
            VolumeCipher::new(data_key, record.key_id, record.unit).map_err(crypt_error)?;
        self.pool.load_key(slot, cipher)?;
        info!(volume = %name, slot, key = %record.key_id, "key loaded");
        Ok(())
    }

    /// Locks `name` and every volume that shares its key.
    pub fn unload(&self, name: &str) -> Result<()> {
        let slot = self.slot_of(name)?;
        if self.pool.unload_key(slot) {
            info!(volume = %name, slot, "key unloaded");
        }
        Ok(())
    }

    /// Wraps `name`'s data key with `new` instead of `old` (O(1): the data
    /// is not touched); every volume sharing the key takes the new one.
    pub fn change(&self, name: &str, old: &UserKey, new: &UserKey) -> Result<()> {
        let slot = self.slot_of(name)?;
        let record = self
            .pool
            .key_record(slot)?
            .ok_or_else(|| DaemonError::Invalid(format!("no key for {name} in the store")))?;
        let rewrapped = record
            .rewrap(old, new, Kdf::PASSPHRASE_DEFAULT)
            .map_err(crypt_error)?;
        self.pool.replace_key_record(slot, rewrapped)?;
        info!(volume = %name, slot, "user key changed");
        Ok(())
    }
}

/// Where an encrypted volume's key comes from (`volume_keys` in the
/// configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A raw key: 32 bytes, or 64 hex digits.
    KeyFile(PathBuf),
    /// A passphrase: the file's first line.
    PassphraseFile(PathBuf),
    /// A program (no shell) that prints the key, or with `passphrase` a
    /// passphrase, on standard output.
    Command { argv: Vec<String>, passphrase: bool },
}

/// A volume whose key the daemon loads at start and reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredKey {
    pub volume: String,
    pub source: KeySource,
}

/// The most bytes a key command may print (a key or a passphrase line).
const MAX_COMMAND_OUTPUT: u64 = 4096;
/// How long a key command may take (a policy: a key service answers in
/// seconds or not at all).
const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A raw key file's contents as key material (owner-only, bounded): 32
/// bytes, or text (64 hex digits) around which white space is ignored.
pub fn key_file_material(path: &Path) -> Result<KeyMaterial> {
    let bytes = arbor_backup::spec::read_secret(path, "key file")
        .map_err(|e| DaemonError::Invalid(e.to_string()))?;
    Ok(KeyMaterial::Raw {
        hex: raw_key_text(&bytes, &path.display().to_string())?,
    })
}

/// A passphrase file's first line as key material (owner-only, bounded).
pub fn passphrase_file_material(path: &Path) -> Result<KeyMaterial> {
    let line = arbor_backup::spec::passphrase_contents(path)
        .map_err(|e| DaemonError::Invalid(e.to_string()))?;
    Ok(KeyMaterial::Passphrase {
        passphrase: utf8(&line, &path.display().to_string())?,
    })
}

fn utf8(bytes: &[u8], what: &str) -> Result<String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| DaemonError::Invalid(format!("{what}: a key file holds 32 bytes, or text")))
}

/// A raw key read from elsewhere (standard input, a command) as key
/// material: 32 bytes, or 64 hex digits around which white space is
/// ignored.
pub fn raw_key_material(bytes: &[u8], what: &str) -> Result<KeyMaterial> {
    Ok(KeyMaterial::Raw {
        hex: raw_key_text(bytes, what)?,
    })
}

/// 32 raw bytes as hex, or the text trimmed.
fn raw_key_text(bytes: &[u8], what: &str) -> Result<String> {
    if bytes.len() == 32 {
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    } else {
        Ok(utf8(bytes, what)?.trim_ascii().to_owned())
    }
}

/// Runs a key command (no shell, nothing on its standard input) and takes
/// what it prints: at most [`MAX_COMMAND_OUTPUT`] bytes within
/// [`COMMAND_TIMEOUT`], exit status 0.
fn command_material(argv: &[String], passphrase: bool) -> Result<KeyMaterial> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let what = format!("the key command {:?}", argv.join(" "));
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| DaemonError::Invalid("an empty key command".into()))?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DaemonError::Invalid(format!("{what} cannot run: {e}")))?;
    let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(DaemonError::Invalid(format!("{what}: no output pipes")));
    };
    // Read in a thread, so that a command that never ends is killed at
    // the deadline rather than waited for.
    let reader = std::thread::spawn(move || {
        let mut out = zeroize::Zeroizing::new(Vec::new());
        let read = stdout
            .take(MAX_COMMAND_OUTPUT + 1)
            .read_to_end(&mut out)
            .map(|_| ());
        (read, out)
    });
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(DaemonError::Invalid(format!(
                    "{what} did not finish within {} s",
                    COMMAND_TIMEOUT.as_secs()
                )));
            }
            Err(e) => return Err(DaemonError::Invalid(format!("{what}: {e}"))),
        }
    };
    let (read, out) = reader
        .join()
        .map_err(|_| DaemonError::Invalid(format!("{what}: its output reader failed")))?;
    read.map_err(|e| DaemonError::Invalid(format!("{what}: {e}")))?;
    if !status.success() {
        let mut err = Vec::new();
        let _ = (&mut stderr).take(512).read_to_end(&mut err);
        return Err(DaemonError::Invalid(format!(
            "{what} failed ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        )));
    }
    if out.len() as u64 > MAX_COMMAND_OUTPUT {
        return Err(DaemonError::Invalid(format!(
            "{what} printed more than {MAX_COMMAND_OUTPUT} bytes"
        )));
    }
    if passphrase {
        let line = out.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        Ok(KeyMaterial::Passphrase {
            passphrase: utf8(line, &what)?,
        })
    } else {
        raw_key_material(&out, &what)
    }
}

impl KeySource {
    /// The key material this source gives now.
    pub fn material(&self) -> Result<KeyMaterial> {
        match self {
            KeySource::KeyFile(path) => key_file_material(path),
            KeySource::PassphraseFile(path) => passphrase_file_material(path),
            KeySource::Command { argv, passphrase } => command_material(argv, *passphrase),
        }
    }
}

impl Keys {
    /// Loads the configured keys of volumes that are locked now (at start,
    /// and at a reload: keys configured since, or volumes received since).
    /// A key that fails is logged and its volume stays locked; returns
    /// the volumes unlocked and the failures.
    pub fn load_configured(&self, keys: &[ConfiguredKey]) -> (Vec<String>, Vec<(String, String)>) {
        let (mut loaded, mut failed) = (Vec::new(), Vec::new());
        for k in keys {
            let slot = match self.slot_of(&k.volume) {
                Ok(slot) => slot,
                Err(e) => {
                    warn!(volume = %k.volume, "the configured key of a volume that cannot take one: {e}");
                    failed.push((k.volume.clone(), e.to_string()));
                    continue;
                }
            };
            if self.pool.key_loaded(slot) {
                continue;
            }
            let result = k
                .source
                .material()
                .and_then(user_key)
                .and_then(|user| self.load(&k.volume, &user));
            match result {
                Ok(()) => loaded.push(k.volume.clone()),
                Err(e) => {
                    warn!(volume = %k.volume, "its configured key was not loaded; it stays locked: {e}");
                    failed.push((k.volume.clone(), e.to_string()));
                }
            }
        }
        (loaded, failed)
    }
}
