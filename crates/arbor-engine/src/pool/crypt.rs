//! Encrypted volumes (FORMAT.md §6.6, version 11): the keys loaded, and
//! the transform of a volume's data at its own offsets.
//!
//! A volume record names a key slot; a snapshot or clone has its
//! source's. The engine stores and checksums ciphertext only: data is
//! encrypted before a write plans anything, so every path below it (in
//! place, redirected, partial extents, the copies around a partial write,
//! sums, scrub, heal, reclaim) moves ciphertext as it moves any data, at
//! the same volume offsets, where the tweak stays valid. What the engine
//! itself would store as zeros in a chunk it maps (the rest of a new
//! chunk around a partial write, zeroed ranges of mapped chunks) it
//! stores encrypted, so that a read decrypts it to zeros; unmapped ranges
//! read as zeros without decryption. Which key opens which slot, and the
//! wrapped keys themselves, are the daemon's (`arbor.keys`): the engine
//! only holds the ciphers loaded into it and refuses I/O to a volume
//! whose slot has none ([`Conflict::Locked`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arbor_crypt::VolumeCipher;
use arbor_format::{BlockRef, VolumeKind, VolumeRecord};

use super::write::Unit;
use super::{check_size, check_volume_name, Piece, Pool, Source, VolumeId};
use crate::error::{Capability, Conflict, Error, Invalid, Result, Unsupported};
use crate::meta::Privilege;

/// The ciphers loaded, by key slot.
#[derive(Default)]
pub(super) struct Keyring {
    slots: RwLock<HashMap<u64, Arc<VolumeCipher>>>,
}

impl Keyring {
    fn get(&self, slot: u64) -> Option<Arc<VolumeCipher>> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.get(&slot).cloned()
    }
}

/// The most bytes of zeros encrypted at once (a policy: bounds the buffer).
const ZEROS_STEP: u64 = 1 << 20;

impl Pool {
    /// Loads the cipher of key slot `slot`: the volumes that name it serve
    /// I/O from now on. Replaces a cipher loaded there before.
    pub fn load_key(&self, slot: u64, cipher: VolumeCipher) -> Result<()> {
        if slot == 0 {
            return Err(Invalid::KeyNotLoaded(0).into());
        }
        let mut slots = self
            .keyring
            .slots
            .write()
            .unwrap_or_else(|p| p.into_inner());
        slots.insert(slot, Arc::new(cipher));
        Ok(())
    }

    /// Unloads key slot `slot` (its volumes refuse I/O until it is loaded
    /// again; requests already past the check finish). Whether one was
    /// loaded.
    pub fn unload_key(&self, slot: u64) -> bool {
        let mut slots = self
            .keyring
            .slots
            .write()
            .unwrap_or_else(|p| p.into_inner());
        slots.remove(&slot).is_some()
    }

    /// Whether a cipher is loaded in key slot `slot`.
    pub fn key_loaded(&self, slot: u64) -> bool {
        self.keyring.get(slot).is_some()
    }

    /// Creates an empty thin volume of `size` bytes (a multiple of the
    /// chunk size) whose data is encrypted with the key in slot `slot`,
    /// which must be loaded (so its creator can write it at once).
    pub fn create_encrypted_volume(&self, name: &str, size: u64, slot: u64) -> Result<VolumeId> {
        check_volume_name(name)?;
        check_size(size)?;
        if !self.format_version().has_encryption() {
            return Err(Unsupported::Format(Capability::Encryption).into());
        }
        self.check_encrypted_size(size)?;
        if !self.key_loaded(slot) {
            return Err(Invalid::KeyNotLoaded(slot).into());
        }
        self.manage(Privilege::Normal, |m| {
            m.ensure_name_free(name)?;
            let id = m.add_volume(
                name.to_owned(),
                VolumeKind::Volume,
                size,
                BlockRef::NONE,
                0,
                0,
            );
            m.set_key_slot(id, slot)?;
            Ok(VolumeId(id))
        })
    }

    /// An encrypted volume's size is a multiple of the chunk size: no
    /// chunk is ever part inside and part past its end, so a growth never
    /// makes bytes the engine zeroed in the clear part of it.
    pub(super) fn check_encrypted_size(&self, size: u64) -> Result<()> {
        let chunk = self.chunk_size();
        if size.is_multiple_of(chunk) {
            Ok(())
        } else {
            Err(Invalid::EncryptedSize { size, chunk }.into())
        }
    }

    /// The cipher of `rec`'s data: None in the clear, an error when locked.
    pub(super) fn cipher_of(&self, rec: &VolumeRecord) -> Result<Option<Arc<VolumeCipher>>> {
        match rec.key_slot {
            None => Ok(None),
            Some(slot) => match self.keyring.get(slot) {
                Some(cipher) => Ok(Some(cipher)),
                None => Err(Conflict::Locked(rec.name.clone()).into()),
            },
        }
    }
}

/// Refuses a request that is not whole, aligned data units.
pub(super) fn check_units(cipher: &VolumeCipher, offset: u64, len: u64) -> Result<()> {
    let unit = cipher.unit().bytes() as u64;
    if offset.is_multiple_of(unit) && len.is_multiple_of(unit) {
        Ok(())
    } else {
        Err(Invalid::EncryptedUnaligned { offset, len, unit }.into())
    }
}

fn cipher_failed(e: arbor_crypt::CryptError) -> Error {
    Error::inconsistent(format!("cipher: {e}"))
}

/// The most bytes of a thread's scratch buffer kept between writes (a
/// policy: larger writes allocate their own).
const SCRATCH_KEPT: usize = 4 << 20;

thread_local! {
    /// Each writing thread's buffer for the ciphertext of its writes: a
    /// fresh allocation of a large write costs the page faults of fresh
    /// memory every time (on this VM, more than the cipher).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with `data` encrypted for the volume's bytes at `offset`.
pub(super) fn with_encrypted<T>(
    cipher: &VolumeCipher,
    offset: u64,
    data: &[u8],
    f: impl FnOnce(&[u8]) -> Result<T>,
) -> Result<T> {
    let encrypt = |buf: &mut Vec<u8>| {
        buf.clear();
        buf.extend_from_slice(data);
        cipher.encrypt(offset, buf).map_err(cipher_failed)
    };
    if data.len() > SCRATCH_KEPT {
        let mut own = Vec::with_capacity(data.len());
        encrypt(&mut own)?;
        return f(&own);
    }
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            encrypt(&mut buf)?;
            f(&buf)
        }
        // A write within a write on this thread (none does): its own.
        Err(_) => {
            let mut own = Vec::with_capacity(data.len());
            encrypt(&mut own)?;
            f(&own)
        }
    })
}

/// Encrypts `buf`, the volume's bytes at `offset`, in place.
pub(super) fn encrypt_in_place(cipher: &VolumeCipher, offset: u64, buf: &mut [u8]) -> Result<()> {
    cipher.encrypt(offset, buf).map_err(cipher_failed)
}

/// Decrypts what a read of the volume's bytes at `offset` put in `buf`
/// from the pool, piece by piece; what read as zeros (unmapped) stays.
pub(super) fn decrypt_pieces(
    cipher: &VolumeCipher,
    offset: u64,
    pieces: &[Piece],
    buf: &mut [u8],
) -> Result<()> {
    let mut pos = 0usize;
    for piece in pieces {
        // A piece is within the read's buffer (its length is the buffer's).
        let len = piece.len as usize;
        match piece.source {
            Source::Pool(_) => cipher
                .decrypt(offset + pos as u64, &mut buf[pos..pos + len])
                .map_err(cipher_failed)?,
            Source::Zeros => {}
            // Encrypted volumes have no copy-on-write device.
            Source::Origin(_) => {
                return Err(Error::inconsistent(
                    "an encrypted volume reads through a device",
                ))
            }
        }
        pos += len;
    }
    Ok(())
}

impl Pool {
    /// [`Pool::write_zeroes`] for an encrypted volume: whole chunks of a
    /// discard are unmapped (they read as zeros, undecrypted); every other
    /// byte is written as encrypted zeros, in steps of [`ZEROS_STEP`]. Not
    /// atomic as a whole: a power cut leaves each step done or not.
    pub(super) fn write_zeroes_encrypted(
        &self,
        id: VolumeId,
        offset: u64,
        len: u64,
        keep_allocation: bool,
        cipher: &VolumeCipher,
    ) -> Result<()> {
        check_units(cipher, offset, len)?;
        let cs = self.chunk_size();
        let end = offset + len;
        let (first_whole, end_whole) = (offset.div_ceil(cs) * cs, end / cs * cs);
        let unmap = !keep_allocation && first_whole < end_whole;
        let zeros = |from: u64, to: u64| -> Result<()> {
            let mut at = from;
            while at < to {
                let n = (to - at).min(ZEROS_STEP);
                // At most ZEROS_STEP bytes.
                let mut buf = vec![0u8; n as usize];
                encrypt_in_place(cipher, at, &mut buf)?;
                let written = self.apply_all(Unit {
                    cipher: Some(cipher),
                    ..Unit::data(id, at, &buf)
                });
                self.after_damage(written)?;
                at += n;
            }
            Ok(())
        };
        if unmap {
            zeros(offset, first_whole)?;
            let written =
                self.apply_all(Unit::zeros(id, first_whole, end_whole - first_whole, true));
            self.after_damage(written)?;
            zeros(end_whole, end)
        } else {
            zeros(offset, end)
        }
    }
}

/// The cipher a unit's own new zeros are encrypted with: the zeros around
/// a partial write into an unmapped chunk (`pool/write.rs`).
pub(super) fn unit_zeros(
    cipher: Option<&VolumeCipher>,
    chunk_offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    match cipher {
        Some(cipher) => encrypt_in_place(cipher, chunk_offset, buf),
        None => Ok(()),
    }
}
