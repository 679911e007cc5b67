//! The pool's key store: the property `arbor.keys` of the pool (docs/FORMAT.md
//! §6.6), the key records of its encrypted volumes by slot. Layout 1,
//! little-endian: 1 byte layout version (1), 3 reserved (0), u32 count
//! `n` (at most [`MAX_SLOTS`]), then `n` entries of 160 bytes in strictly
//! increasing slot order: u64 slot (nonzero), then the slot's
//! [`KeyRecord`] (152 bytes). A volume record names its slot; the
//! snapshots and clones of an encrypted volume name the same one.

use crate::record::{KeyRecord, KEY_RECORD_LEN};
use crate::CryptError;

/// The property that holds the store, on the pool.
pub const KEY_STORE_PROPERTY: &str = "arbor.keys";

const LAYOUT: u8 = 1;
const HEADER: usize = 8;
const ENTRY: usize = 8 + KEY_RECORD_LEN;

/// The most slots a store holds: what fits a property (64 KiB).
pub const MAX_SLOTS: usize = (64 * 1024 - HEADER) / ENTRY;

/// The key records of a pool's encrypted volumes, by slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyStore {
    entries: std::collections::BTreeMap<u64, KeyRecord>,
}

impl KeyStore {
    pub fn get(&self, slot: u64) -> Option<&KeyRecord> {
        self.entries.get(&slot)
    }

    pub fn slots(&self) -> impl Iterator<Item = (u64, &KeyRecord)> {
        self.entries.iter().map(|(&slot, record)| (slot, record))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds `record` in a new slot (one past the highest); the slot.
    pub fn add(&mut self, record: KeyRecord) -> Result<u64, CryptError> {
        if self.entries.len() >= MAX_SLOTS {
            return Err(CryptError::Invalid(format!(
                "the pool's key store is full ({MAX_SLOTS} keys); destroy encrypted volumes no longer needed"
            )));
        }
        let slot = self
            .entries
            .last_key_value()
            .map_or(Some(1), |(&last, _)| last.checked_add(1))
            .ok_or_else(|| CryptError::Invalid("key slots exhausted".to_string()))?;
        self.entries.insert(slot, record);
        Ok(slot)
    }

    /// Replaces the record of `slot` (a rewrapped key).
    pub fn replace(&mut self, slot: u64, record: KeyRecord) -> Result<(), CryptError> {
        match self.entries.get_mut(&slot) {
            Some(old) if old.key_id == record.key_id => {
                *old = record;
                Ok(())
            }
            Some(_) => Err(CryptError::Invalid(format!(
                "slot {slot} holds another data key"
            ))),
            None => Err(CryptError::Invalid(format!("no key in slot {slot}"))),
        }
    }

    /// Drops the slots `keep` says no volume names any more.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.entries.retain(|&slot, _| keep(slot));
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.push(LAYOUT);
        out.extend_from_slice(&[0; 3]);
        // At most MAX_SLOTS (`add`), a u32.
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (slot, record) in &self.entries {
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&record.encode());
        }
        out
    }

    /// Parses a store, every entry checked (a pool may be damaged).
    pub fn decode(bytes: &[u8]) -> Result<Self, CryptError> {
        let invalid = |what: String| CryptError::Invalid(format!("key store: {what}"));
        if bytes.len() < HEADER {
            return Err(invalid(format!("{} bytes", bytes.len())));
        }
        if bytes[0] != LAYOUT || bytes[1..4] != [0, 0, 0] {
            return Err(invalid(format!("layout {}", bytes[0])));
        }
        let n = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
        if n > MAX_SLOTS || bytes.len() != HEADER + n * ENTRY {
            return Err(invalid(format!("{n} entries in {} bytes", bytes.len())));
        }
        let mut store = KeyStore::default();
        let mut last = 0u64;
        for entry in bytes[HEADER..].chunks_exact(ENTRY) {
            let mut word = [0u8; 8];
            word.copy_from_slice(&entry[..8]);
            let slot = u64::from_le_bytes(word);
            if slot <= last {
                return Err(invalid(format!("slot {slot} after {last}")));
            }
            last = slot;
            store.entries.insert(slot, KeyRecord::decode(&entry[8..])?);
        }
        Ok(store)
    }
}
