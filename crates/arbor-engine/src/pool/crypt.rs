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
//! wrapped keys themselves, are in the pool's key store (`arbor.keys`),
//! which the engine keeps ([`Pool::add_key_record`]) but never opens: it
//! only holds the ciphers loaded into it and refuses I/O to a volume
//! whose slot has none ([`Conflict::Locked`]). A raw receive (an
//! encrypted volume's stored bytes, `pool/receive.rs`) moves ciphertext
//! with no cipher at all.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use arbor_crypt::{KeyRecord, KeyStore, VolumeCipher, KEY_STORE_PROPERTY};
use arbor_format::{BlockRef, VolumeKind, VolumeRecord};

use super::write::Unit;
use super::{check_size, check_volume_name, Piece, Pool, Source, VolumeId};
use crate::error::{Capability, Conflict, Error, Invalid, Result, Unsupported};
use crate::meta::Privilege;

/// The ciphers loaded, by key slot; and the key store's changes.
#[derive(Default)]
pub(super) struct Keyring {
    slots: RwLock<HashMap<u64, Arc<VolumeCipher>>>,
    /// One change of the key store at a time.
    change: Mutex<()>,
    /// Slots added to the store whose volume is not made yet: no change
    /// of the store drops them as unused meanwhile.
    pending: Mutex<HashSet<u64>>,
}

/// A slot just added to the key store ([`Pool::add_key_record`]): kept
/// while this lives, so that the volume naming it can be made; dropped
/// at a later change of the store if none was.
pub struct NewKeySlot<'p> {
    pool: &'p Pool,
    slot: u64,
}

impl NewKeySlot<'_> {
    pub fn slot(&self) -> u64 {
        self.slot
    }
}

impl Drop for NewKeySlot<'_> {
    fn drop(&mut self) {
        let mut pending = super::lock_mutex(&self.pool.keyring.pending);
        pending.remove(&self.slot);
    }
}

impl Keyring {
    fn get(&self, slot: u64) -> Option<Arc<VolumeCipher>> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.get(&slot).cloned()
    }
}

/// The longest range of an encrypted volume zeroed in one atomic unit with
/// ends inside chunks: its encrypted zeros are one buffer (a policy: bounds
/// that buffer; a plain volume's zeros kept allocated are atomic up to the
/// same 32 MiB).
const ATOMIC_ZEROS: u64 = 32 << 20;

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

    /// The data unit of encrypted volume `id` in bytes (512 or 4096), the
    /// smallest request it takes; None for a volume in the clear.
    pub fn data_unit(&self, id: VolumeId) -> Result<Option<u32>> {
        let slot = self.read_meta()?.visible_volume(id.0)?.key_slot;
        let Some(slot) = slot else {
            return Ok(None);
        };
        let unit = match self.keyring.get(slot) {
            Some(cipher) => cipher.unit(),
            None => {
                self.key_record(slot)?
                    .ok_or_else(|| Error::inconsistent(format!("key slot {slot} has no record")))?
                    .unit
            }
        };
        // 512 or 4096: fits.
        Ok(Some(unit.bytes() as u32))
    }

    /// The pool's key store (empty if it has none). A store that does not
    /// decode is damage, never an empty store.
    pub fn key_store(&self) -> Result<KeyStore> {
        match self.property(None, KEY_STORE_PROPERTY)? {
            None => Ok(KeyStore::default()),
            Some(bytes) => KeyStore::decode(&bytes).map_err(|e| {
                Error::inconsistent(format!("the pool's key store does not decode: {e}"))
            }),
        }
    }

    /// The key record in slot `slot`, if any.
    pub fn key_record(&self, slot: u64) -> Result<Option<KeyRecord>> {
        Ok(self.key_store()?.get(slot).cloned())
    }

    /// Adds `record` to the key store in a new slot, durably, dropping
    /// the slots no volume names first (a create that failed, volumes
    /// destroyed since), but not those of creates still under way.
    pub fn add_key_record(&self, record: KeyRecord) -> Result<NewKeySlot<'_>> {
        if !self.format_version().has_encryption() {
            return Err(Unsupported::Format(Capability::Encryption).into());
        }
        let _one = super::lock_mutex(&self.keyring.change);
        let mut store = self.key_store()?;
        self.forget_unused(&mut store)?;
        let slot = store
            .add(record)
            .map_err(|e| Error::from(Invalid::KeyStore(e.to_string())))?;
        super::lock_mutex(&self.keyring.pending).insert(slot);
        let guard = NewKeySlot { pool: self, slot };
        self.set_property(None, KEY_STORE_PROPERTY, &store.encode())?;
        Ok(guard)
    }

    /// Puts `record` in slot `slot` in place of the record there (the same
    /// data key wrapped another way), durably.
    pub fn replace_key_record(&self, slot: u64, record: KeyRecord) -> Result<()> {
        let _one = super::lock_mutex(&self.keyring.change);
        let mut store = self.key_store()?;
        store
            .replace(slot, record)
            .map_err(|e| Error::from(Invalid::KeyStore(e.to_string())))?;
        self.set_property(None, KEY_STORE_PROPERTY, &store.encode())
    }

    /// Drops from `store` the slots no volume, snapshot or receive names
    /// and no create under way holds, unloading their ciphers.
    fn forget_unused(&self, store: &mut KeyStore) -> Result<()> {
        let mut used: HashSet<u64> = self.read_meta()?.key_slots();
        used.extend(super::lock_mutex(&self.keyring.pending).iter().copied());
        store.retain(|slot| {
            let keep = used.contains(&slot);
            if !keep {
                self.unload_key(slot);
            }
            keep
        });
        Ok(())
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

    /// Clones encrypted snapshot `snapshot` as `new_name` with a key slot
    /// of its own, `slot`, just added with another wrapping of the same
    /// data key (the same key id): the clone shares every chunk, and is
    /// unlocked by its own user key, not by its origin's. Its snapshots
    /// and clones share its slot. Committed when it returns.
    pub fn clone_snapshot_with_key(
        &self,
        snapshot: &str,
        new_name: &str,
        slot: &NewKeySlot<'_>,
    ) -> Result<VolumeId> {
        check_volume_name(new_name)?;
        let source_slot = {
            let meta = self.read_meta()?;
            let rec = meta.volume(meta.volume_id(snapshot)?)?;
            rec.key_slot
                .ok_or_else(|| Error::from(Invalid::NotEncrypted(snapshot.to_owned())))?
        };
        let store = self.key_store()?;
        let key_id = |s: u64| store.get(s).map(|r| r.key_id);
        if key_id(source_slot).is_none() || key_id(source_slot) != key_id(slot.slot()) {
            return Err(Invalid::CloneKeyMismatch {
                snapshot: snapshot.to_owned(),
            }
            .into());
        }
        self.manage(Privilege::Normal, |m| {
            m.ensure_name_free(new_name)?;
            let source = m.volume_id(snapshot)?;
            let rec = m.volume(source)?;
            if rec.kind != VolumeKind::Snapshot {
                return Err(Invalid::CloneOfVolume(snapshot.to_owned()).into());
            }
            if rec.key_slot != Some(source_slot) {
                return Err(Conflict::Changed(snapshot.to_owned()).into());
            }
            let id = m.share_volume(source, new_name.to_owned(), VolumeKind::Volume)?;
            m.set_key_slot(id, slot.slot())?;
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
    /// [`Pool::write_zeroes`] for an encrypted volume, as atomic as it is
    /// for a plain one: whole chunks of a discard are unmapped (they read
    /// as zeros, undecrypted) and the parts of partial chunks that are
    /// mapped take encrypted zeros, in one unit (whatever the range when it
    /// is whole chunks; up to [`ATOMIC_ZEROS`] otherwise); zeros kept
    /// allocated are written encrypted, in atomic units of up to 32 MiB as
    /// a plain volume's are. A discard longer than [`ATOMIC_ZEROS`] with
    /// ends inside chunks takes three steps (its ends, then its whole
    /// chunks), each atomic: a power cut or a full pool may leave some done.
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
        if !keep_allocation && offset.is_multiple_of(cs) && len.is_multiple_of(cs) {
            // Nothing to store: every chunk is unmapped whole.
            let written = self.apply_all(Unit::zeros(id, offset, len, true));
            return self.after_damage(written);
        }
        // Encrypted zeros for `[from, to)`, as the data of one unit that
        // unmaps what it covers whole (a discard) or writes it all.
        let zeros = |from: u64, to: u64, unmap: bool| -> Result<()> {
            // At most ATOMIC_ZEROS bytes (the callers bound it).
            let mut buf = vec![0u8; (to - from) as usize];
            encrypt_in_place(cipher, from, &mut buf)?;
            let written = self.apply_all(Unit {
                cipher: Some(cipher),
                unmap,
                ..Unit::data(id, from, &buf)
            });
            self.after_damage(written)
        };
        if len <= ATOMIC_ZEROS {
            return zeros(offset, end, !keep_allocation);
        }
        if keep_allocation {
            let mut at = offset;
            while at < end {
                let to = (at + ATOMIC_ZEROS).min(end);
                zeros(at, to, false)?;
                at = to;
            }
            return Ok(());
        }
        // A long discard with ends inside chunks: each end's chunk in a unit
        // of its own (unmapping nothing whole), then the whole chunks.
        let (first_whole, end_whole) = (offset.div_ceil(cs) * cs, end / cs * cs);
        if first_whole > offset {
            zeros(offset, first_whole, true)?;
        }
        if end > end_whole {
            zeros(end_whole, end, true)?;
        }
        let written = self.apply_all(Unit::zeros(id, first_whole, end_whole - first_whole, true));
        self.after_damage(written)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arbor_crypt::{DataKey, DataUnit, KeyId, VolumeCipher};
    use arbor_format::SmKind;
    use arbor_io::{BlockDevice, SimDisk};

    use crate::{CreateOptions, Error, OpenOptions, Pool, Resource};

    const CS: u64 = 4096;
    const SIZE: u64 = 4 << 20;

    fn read_all(p: &Pool, id: crate::VolumeId) -> Vec<u8> {
        let mut buf = vec![0u8; SIZE as usize];
        p.read(id, 0, &mut buf).unwrap();
        buf
    }

    /// Regression (found by the exhaustion campaign's encrypted seeds): a
    /// discard of an encrypted volume with ends inside chunks took three
    /// steps (an end's encrypted zeros, the whole chunks unmapped, the
    /// other end's), so running out in the last left the first two done
    /// behind an error. Now the ends' zeros and the unmap are one unit, as
    /// a plain volume's discard is: with metadata running out at every
    /// point in turn, each discard and write-zeroes either completes or
    /// leaves the volume exactly as it was, and the pool checks clean.
    #[test]
    fn zeroing_an_encrypted_range_is_all_or_nothing_whatever_runs_out() {
        let (mut failed, mut finished) = (0, 0);
        for allow in 0..48u64 {
            let disk = SimDisk::new(64 << 20);
            let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
            let opts = CreateOptions {
                chunk_size: CS as u32,
                metadata_bytes: Some(4 << 20),
                ..Default::default()
            };
            let p = Pool::create(dev, &opts, &OpenOptions::default()).unwrap();
            let cipher =
                VolumeCipher::new(DataKey::generate(), KeyId::random(), DataUnit::B512).unwrap();
            p.load_key(1, cipher).unwrap();
            let v = p.create_encrypted_volume("v", SIZE, 1).unwrap();
            for i in 0..SIZE / CS {
                p.write(v, i * CS, &[i as u8 | 1; CS as usize]).unwrap();
            }
            // Shared with a snapshot: the ends' chunks are copied.
            p.snapshot("v@s").unwrap();
            let before = read_all(&p, v);
            {
                let mut meta = p.meta.write().unwrap();
                let free = meta.meta().allocatable(SmKind::Meta);
                meta.set_meta_reserve(free.saturating_sub(allow));
            }
            for (offset, len, keep) in [
                (300 * CS + 1024, 40 * CS + 512, true),
                (5 * CS + 512, 100 * CS, false),
                (700 * CS, 64 * CS + 512, false),
            ] {
                let mut want = read_all(&p, v);
                match p.write_zeroes(v, offset, len, keep) {
                    Ok(()) => {
                        finished += 1;
                        want[offset as usize..(offset + len) as usize].fill(0);
                    }
                    Err(Error::Exhausted(Resource::Metadata | Resource::DataSpace)) => failed += 1,
                    Err(e) => panic!("allow {allow}: {e}"),
                }
                assert!(
                    read_all(&p, v) == want,
                    "allow {allow}: {offset}+{len} keep {keep} left a trace"
                );
            }
            let s = p.lookup("v@s").unwrap();
            assert!(
                read_all(&p, s) == before,
                "allow {allow}: the snapshot changed"
            );
            p.meta.write().unwrap().set_meta_reserve(64);
            p.flush().unwrap();
            assert!(p.check().unwrap().is_clean(), "allow {allow}");
        }
        assert!(
            failed > 0 && finished > 0,
            "failed {failed}, finished {finished}"
        );
    }
}
