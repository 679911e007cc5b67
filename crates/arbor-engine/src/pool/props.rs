//! Properties: small values that layers above the engine keep in the pool,
//! so that they survive restarts and move with it (the monitor's policies).
//!
//! A property is a hidden record ([`arbor_format::VolumeKind::Property`], named
//! `{owner}%prop%{key}`) whose own tree holds the value, framed and
//! checksummed (`arbor_format::encode_property`). Setting one writes the
//! value to a new staged record (`…%new`) and then, in one commit, puts it
//! in place of the old one, which goes to reclaim like a deleted volume:
//! a failure or a power cut at any point leaves the old value or the new
//! one, never a mix. A staged record left by a cut is replaced by the next
//! set of its key and never read. A volume's properties are deleted with it.
//! Sets and removals run one at a time (`Pool::property_change`), so
//! callers that set one key at once all succeed and the last one stays.

use arbor_format::{decode_property, encode_property};

use super::write::Unit;
use super::{Pool, VolumeId};
use crate::error::{Capability, Error, Invalid, Result, Unsupported};
use crate::meta::Privilege;
use crate::names::is_name_char;
use crate::volumes::Volumes;

/// Longest property key, in bytes.
pub const MAX_PROPERTY_KEY: usize = 64;

fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= MAX_PROPERTY_KEY
        && key.chars().all(is_name_char)
        && key.starts_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Invalid::PropertyKey {
            key: key.to_owned(),
            max: MAX_PROPERTY_KEY,
        }
        .into())
    }
}

fn owner_id(owner: Option<VolumeId>) -> u64 {
    owner.map_or(0, |v| v.0)
}

impl Pool {
    fn check_properties_supported(&self) -> Result<()> {
        if !self.format_version().has_properties() {
            return Err(Unsupported::Format(Capability::Properties).into());
        }
        Ok(())
    }

    fn check_owner(meta: &Volumes, owner: Option<VolumeId>) -> Result<()> {
        match owner {
            Some(id) => meta.visible_volume(id.0).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Sets property `key` of volume `owner` (`None`: of the pool) to
    /// `value` (at most [`arbor_format::MAX_PROPERTY_BYTES`]), durably and
    /// atomically: afterwards, and after a power cut at any point, it
    /// reads as the old value or this one. A pool out of space keeps the
    /// old value.
    pub fn set_property(&self, owner: Option<VolumeId>, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        self.check_properties_supported()?;
        let stored = encode_property(value).map_err(Invalid::PropertyValue)?;
        let owner = owner_id(owner);
        let size = stored.len() as u64;
        let _one = super::lock_mutex(&self.property_change);
        let staged = self.manage(Privilege::Normal, |m| {
            m.add_staged_property(owner, key, size)
        })?;
        let installed = self
            .apply_all(Unit::data(VolumeId(staged), 0, &stored))
            .and_then(|()| {
                self.manage(Privilege::Normal, |m| {
                    m.install_property(owner, key, staged)
                })
            });
        if let Err(e) = installed {
            // Leave no trace: the staged record goes (if it is still ours).
            let _ = self.manage(Privilege::Reserve, |m| {
                if m.property_id(owner, key, true) == Some(staged) {
                    m.delete_volume(staged)?;
                }
                Ok(())
            });
            return Err(e);
        }
        Ok(())
    }

    /// Property `key` of volume `owner` (`None`: of the pool), if set. A
    /// damaged value is an error ([`Fault::Corrupt`]), never wrong bytes.
    pub fn property(&self, owner: Option<VolumeId>, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let _gate = self.gates.io();
        let (pieces, size) = {
            let meta = self.read_meta()?;
            Self::check_owner(&meta, owner)?;
            let Some(id) = meta.property_id(owner_id(owner), key, false) else {
                return Ok(None);
            };
            let size = meta.volume(id)?.size_bytes;
            if size
                > (arbor_format::MAX_PROPERTY_BYTES + arbor_format::PROPERTY_HEADER_LEN)
                    .div_ceil(512) as u64
                    * 512
            {
                return Err(Error::inconsistent(format!(
                    "property {key}: a record of {size} bytes"
                )));
            }
            (Self::resolve(&meta, VolumeId(id), 0, size)?, size)
        };
        // The size was bounded just above.
        let mut stored = vec![0u8; size as usize];
        self.read_pieces(pieces, &mut stored, None)?;
        let value =
            decode_property(&stored).map_err(|e| Error::corrupt(format!("property {key}"), e))?;
        Ok(Some(value.to_vec()))
    }

    /// The keys of volume `owner`'s properties (`None`: the pool's), sorted.
    pub fn property_keys(&self, owner: Option<VolumeId>) -> Result<Vec<String>> {
        let meta = self.read_meta()?;
        Self::check_owner(&meta, owner)?;
        Ok(meta
            .properties(owner_id(owner))
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    /// Removes property `key` of volume `owner` (`None`: of the pool) in
    /// one commit. Returns whether it was set.
    pub fn remove_property(&self, owner: Option<VolumeId>, key: &str) -> Result<bool> {
        check_key(key)?;
        let owner = owner_id(owner);
        let _one = super::lock_mutex(&self.property_change);
        self.manage(Privilege::Reserve, |m| {
            if owner != 0 {
                m.visible_volume(owner)?;
            }
            match m.property_id(owner, key, false) {
                Some(id) => m.delete_volume(id).map(|()| true),
                None => Ok(false),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        for bad in ["", "a%b", "-x", "a b", &"k".repeat(MAX_PROPERTY_KEY + 1)] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        for good in ["policy", "monitor.policy.7", "a:b-c_d"] {
            check_key(good).unwrap();
        }
    }
}
