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

use std::sync::{Arc, Mutex, MutexGuard};

use arbor_api::model::KeyMaterial;
use arbor_crypt::{DataUnit, Kdf, KeyRecord, KeyStore, UserKey, VolumeCipher, KEY_STORE_PROPERTY};
use arbor_engine::{Pool, VolumeId};
use tracing::info;
use zeroize::Zeroize;

use crate::error::{DaemonError, Result};

/// The data units encrypted volumes get unless the request says.
pub const DEFAULT_UNIT: DataUnit = DataUnit::B512;

pub struct Keys {
    pool: Arc<Pool>,
    /// One change of the store at a time.
    change: Mutex<()>,
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
        Self {
            pool,
            change: Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.change.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store as the pool holds it (empty if it has none).
    fn store(&self) -> Result<KeyStore> {
        match self.pool.property(None, KEY_STORE_PROPERTY)? {
            None => Ok(KeyStore::default()),
            Some(bytes) => KeyStore::decode(&bytes)
                .map_err(|e| DaemonError::Invalid(format!("the pool's key store is damaged: {e}"))),
        }
    }

    fn save(&self, store: &KeyStore) -> Result<()> {
        self.pool
            .set_property(None, KEY_STORE_PROPERTY, &store.encode())?;
        Ok(())
    }

    /// Creates encrypted volume `name`: a new data key, wrapped by `user`,
    /// in a new slot of the store (recorded first), loaded, then the
    /// volume. A failure after the slot is recorded leaves the slot to the
    /// next change of the store, which drops slots no volume names.
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
        let slot = {
            let _one = self.lock();
            let mut store = self.store()?;
            self.forget_unused(&mut store)?;
            let slot = store.add(record).map_err(crypt_error)?;
            self.save(&store)?;
            slot
        };
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

    /// Drops from `store` the slots no volume or snapshot names (a create
    /// that failed after recording its slot, volumes destroyed since).
    fn forget_unused(&self, store: &mut KeyStore) -> Result<()> {
        let used: std::collections::HashSet<u64> = self
            .pool
            .list()?
            .into_iter()
            .filter_map(|v| v.key_slot)
            .collect();
        store.retain(|slot| {
            let keep = used.contains(&slot);
            if !keep {
                self.pool.unload_key(slot);
            }
            keep
        });
        Ok(())
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
        let store = self.store()?;
        let record = store.get(slot).ok_or_else(|| {
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
        let _one = self.lock();
        let mut store = self.store()?;
        let record = store
            .get(slot)
            .ok_or_else(|| DaemonError::Invalid(format!("no key for {name} in the store")))?;
        let rewrapped = record
            .rewrap(old, new, Kdf::PASSPHRASE_DEFAULT)
            .map_err(crypt_error)?;
        store.replace(slot, rewrapped).map_err(crypt_error)?;
        self.save(&store)?;
        info!(volume = %name, slot, "user key changed");
        Ok(())
    }
}
