//! Receiving a snapshot from elsewhere, atomically and resumably: the
//! engine's half of `arbor receive` (the stream format and its checks are
//! the `arbor-stream` crate's).
//!
//! A receive is applied to a hidden volume (a [`VolumeKind::Receiving`]
//! record named `VOL%recv`, which no name lookup finds): empty for a full
//! stream, sharing the base snapshot's tree for an incremental one. Its
//! record keeps the stream's identities and how far it got; each
//! [`Pool::receive_checkpoint`] commits the data applied so far with that
//! offset, so a receive interrupted anyhow (a broken pipe, a killed
//! sender, a power cut) resumes there. Nothing of it is visible until
//! [`Pool::finish_receive`], which creates the snapshot (and the volume, or
//! rolls it forward) in one commit.

use arbor_format::{Guid, ReceiveState, VolumeKind};

use super::write::Unit;
use super::{check_size, NewKeySlot, Pool, VolumeId};
use crate::error::{Capability, Conflict, Error, Invalid, Result, Unsupported};
use crate::meta::Privilege;
use crate::names::{check_volume_name, split_snapshot_name};
use crate::volumes::{receiving_name, Volumes};

/// What a stream says it holds, for [`Pool::begin_receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveTarget {
    /// The volume received into: created by a full stream, rolled forward
    /// by an incremental one.
    pub volume: String,
    /// The identity the new snapshot gets (the sender's snapshot's).
    pub target: Guid,
    /// The base snapshot's identity, for an incremental stream.
    pub base: Option<Guid>,
    /// The snapshot's size in bytes.
    pub size: u64,
    /// A raw stream (an encrypted volume's stored bytes): the record of
    /// the key its data is encrypted with. A full stream's receive gets a
    /// slot of its own for it; an incremental one goes onto a base
    /// encrypted with the same data key (and takes this wrapping of it).
    pub key: Option<arbor_crypt::KeyRecord>,
}

/// A receive in progress, as [`Pool::receive_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveStatus {
    /// The hidden volume the stream is applied to.
    pub id: VolumeId,
    pub target: Guid,
    pub base: Option<Guid>,
    pub size: u64,
    /// Bytes of the volume applied and committed: a resumed stream starts here.
    pub offset: u64,
    /// An incremental receive whose base snapshot no longer exists: it can
    /// never finish, and the next receive into the volume discards it.
    pub stale: bool,
}

/// What [`Pool::begin_receive`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveStart {
    pub status: ReceiveStatus,
    /// A receive of another stream into the same volume whose base snapshot
    /// no longer exists was discarded (it could never finish); this says
    /// which.
    pub discarded: Option<String>,
}

/// A raw receive's key: the store as it was before the receive began,
/// and the slot added for a new one.
struct RawKey<'p> {
    store: arbor_crypt::KeyStore,
    new_slot: Option<NewKeySlot<'p>>,
}

fn nonzero(guid: Guid) -> Option<Guid> {
    (guid != [0; 16]).then_some(guid)
}

fn status_of(meta: &Volumes, id: u64) -> Result<ReceiveStatus> {
    let rec = meta.volume(id)?;
    let base = nonzero(rec.receive.base);
    Ok(ReceiveStatus {
        id: VolumeId(id),
        target: rec.receive.target,
        base,
        size: rec.size_bytes,
        offset: rec.receive.offset,
        stale: base.is_some_and(|b| meta.guid_id(&b).is_none()),
    })
}

impl Pool {
    /// The identity of volume or snapshot `id` (None in a pool whose volume
    /// table predates identities: `arbor pool upgrade` gives them).
    pub fn guid(&self, id: VolumeId) -> Result<Option<Guid>> {
        let meta = self.read_meta()?;
        Ok(nonzero(meta.visible_volume(id.0)?.guid))
    }

    /// The volume or snapshot whose identity is `guid`.
    pub fn find_guid(&self, guid: &Guid) -> Result<Option<VolumeId>> {
        Ok(self.read_meta()?.guid_id(guid).map(VolumeId))
    }

    /// The receive in progress into `volume`, if any, as durable: its
    /// offset is one a restart keeps (a checkpoint changes it only inside
    /// a management operation, which holds the commit lock until its
    /// commit is durable).
    pub fn receive_status(&self, volume: &str) -> Result<Option<ReceiveStatus>> {
        let _durable = self.committer.lock();
        let meta = self.read_meta()?;
        match meta.receiving_id(volume) {
            Some(id) => status_of(&meta, id).map(Some),
            None => Ok(None),
        }
    }

    /// Starts receiving a stream into `t.volume`, or resumes the receive of
    /// the same stream (same identities and size) left by an earlier call:
    /// the returned status says from which offset the stream must go on.
    ///
    /// A full stream needs `t.volume` not to exist. An incremental one
    /// needs its base, found by identity: into an existing volume it must
    /// be one of the volume's snapshots (the volume is rolled forward);
    /// into a new one it may be any snapshot (the volume is created as its
    /// clone: a stream against a sibling or a clone's origin).
    /// A receive of another stream into the same volume is refused
    /// ([`Refusal::Conflict`]: abort it first), unless its base is gone, in
    /// which case it is discarded and the start says so.
    pub fn begin_receive(&self, t: &ReceiveTarget) -> Result<ReceiveStart> {
        check_volume_name(&t.volume)?;
        check_size(t.size)?;
        if t.target == [0; 16] || t.base == Some([0; 16]) {
            return Err(Invalid::ZeroStreamIdentity.into());
        }
        let cs = self.chunk_size();
        // A receive whose base is gone can never finish: it is discarded
        // first, in a commit of its own (so it stays discarded even if this
        // stream is refused), and the start says so.
        let discarded = self.manage(Privilege::Reserve, |m| {
            let Some(id) = m.receiving_id(&t.volume) else {
                return Ok(None);
            };
            let status = status_of(m, id)?;
            if !status.stale {
                return Ok(None);
            }
            m.delete_volume(id)?;
            Ok(Some(format!(
                "discarded the interrupted receive of snapshot {} into {}: its base snapshot \
                 {} no longer exists",
                hex(&status.target),
                t.volume,
                status.base.map(|b| hex(&b)).unwrap_or_default()
            )))
        })?;
        let raw = match &t.key {
            Some(key) => Some(self.raw_receive_key(t, key)?),
            None => None,
        };
        let key_id_of = |slot: Option<u64>| {
            let raw = raw.as_ref()?;
            raw.store.get(slot?).map(|r| r.key_id)
        };
        let started = self.manage(Privilege::Normal, |m| {
            if let Some(id) = m.receiving_id(&t.volume) {
                let status = status_of(m, id)?;
                if status.target == t.target && status.base == t.base {
                    let rec = m.volume(id)?;
                    match &t.key {
                        Some(key) if key_id_of(rec.key_slot) != Some(key.key_id) => {
                            return Err(Invalid::RawResumeKeyMismatch {
                                volume: t.volume.clone(),
                            }
                            .into())
                        }
                        None if rec.key_slot.is_some() => {
                            return Err(Invalid::PlainOntoEncrypted {
                                base: t.volume.clone(),
                            }
                            .into())
                        }
                        _ => {}
                    }
                    // The same stream: resume (sizing it again if an
                    // earlier start stopped before that).
                    let resize = status.size != t.size && status.offset == 0;
                    return Ok(resize.then_some(VolumeId(id)));
                }
                return Err(Conflict::ReceiveInProgress {
                    volume: t.volume.clone(),
                    snapshot: hex(&status.target),
                }
                .into());
            }
            if let Some(existing) = m.guid_id(&t.target) {
                return Err(Conflict::HaveSnapshot {
                    name: m.volume(existing)?.name.clone(),
                    identity: hex(&t.target),
                }
                .into());
            }
            let state = ReceiveState {
                target: t.target,
                base: t.base.unwrap_or([0; 16]),
                offset: 0,
            };
            let id = match t.base {
                None => {
                    m.ensure_name_free(&t.volume)?;
                    let id = m.add_receiving(&t.volume, None, t.size, state)?;
                    if let Some(slot) = raw.as_ref().and_then(|r| r.new_slot.as_ref()) {
                        m.set_key_slot(id, slot.slot())?;
                    }
                    id
                }
                Some(base) => {
                    let base_id = m.guid_id(&base).ok_or_else(|| {
                        Error::not_found(format!(
                            "the stream's base snapshot (identity {}) is not in this pool",
                            hex(&base)
                        ))
                    })?;
                    let rec = m.volume(base_id)?;
                    if rec.kind != VolumeKind::Snapshot {
                        return Err(Invalid::StreamBaseNotSnapshot(rec.name.clone()).into());
                    }
                    // Plaintext never goes into an encrypted volume, nor
                    // ciphertext into a plain one or under another key.
                    let base_name = || rec.name.clone();
                    match (&t.key, rec.key_slot) {
                        (None, Some(_)) => {
                            return Err(Invalid::PlainOntoEncrypted { base: base_name() }.into())
                        }
                        (Some(_), None) => {
                            return Err(Invalid::RawOntoPlain { base: base_name() }.into())
                        }
                        (Some(key), slot) if key_id_of(slot) != Some(key.key_id) => {
                            return Err(Invalid::RawKeyMismatch { base: base_name() }.into())
                        }
                        _ => {}
                    }
                    // Into an existing volume: the base must be one of its
                    // snapshots (the volume rolls forward). Else the volume
                    // is created as a clone of the base.
                    if let Ok(vol) = m.volume_id(&t.volume) {
                        m.writable_volume(vol)?;
                        if rec.parent != vol {
                            return Err(Invalid::StreamBaseElsewhere {
                                base: rec.name.clone(),
                                volume: t.volume.clone(),
                            }
                            .into());
                        }
                    }
                    let old_size = rec.size_bytes;
                    let id = m.add_receiving(&t.volume, Some(base_id), t.size, state)?;
                    if t.size < old_size {
                        m.unmap_chunks(id, t.size.div_ceil(cs), old_size.div_ceil(cs))?;
                    }
                    id
                }
            };
            Ok(Some(VolumeId(id)))
        });
        let fresh = match (started, &discarded) {
            (Ok(fresh), _) => fresh,
            (Err(e), None) => return Err(e),
            // Say what was discarded, whatever else went wrong.
            (Err(e), Some(note)) => {
                return Err(Conflict::AfterDiscard {
                    note: note.clone(),
                    error: Box::new(e),
                }
                .into())
            }
        };
        // A raw increment carries the sender's wrapping of the data key:
        // the receiver takes it (a change of the user's key on the sender
        // reaches its replicas).
        if let (Some(key), Some(_), Some(id)) = (&t.key, t.base, fresh) {
            let slot = self.read_meta()?.volume(id.0)?.key_slot;
            if let Some(slot) = slot {
                if self.key_record(slot)?.as_ref() != Some(key) {
                    self.replace_key_record(slot, key.clone())?;
                }
            }
        }
        // An incremental receive starts at its base's size: bytes of the
        // base's last chunk past that size must read as zeros (as a grow
        // does) before a larger size is set. A failure here leaves a
        // receive at offset 0 that the same stream resumes.
        if let (Some(id), Some(_)) = (fresh, t.base) {
            self.size_receiving(id, t.size)?;
        }
        Ok(ReceiveStart {
            status: self
                .receive_status(&t.volume)?
                .ok_or_else(|| Error::inconsistent("a receive vanished as it began"))?,
            discarded,
        })
    }

    /// What a raw stream's receive needs before it begins: a pool that
    /// takes encrypted receives, a size of whole chunks, the key store,
    /// and for a full stream that does not resume one under way, a new
    /// slot holding the stream's key record.
    fn raw_receive_key(
        &self,
        t: &ReceiveTarget,
        key: &arbor_crypt::KeyRecord,
    ) -> Result<RawKey<'_>> {
        if !self.format_version().has_encrypted_receives() {
            return Err(Unsupported::Format(Capability::EncryptedReceive).into());
        }
        self.check_encrypted_size(t.size)?;
        let resumes = {
            let meta = self.read_meta()?;
            meta.receiving_id(&t.volume).is_some()
        };
        let new_slot = match (t.base, resumes) {
            (None, false) => Some(self.add_key_record(key.clone())?),
            _ => None,
        };
        Ok(RawKey {
            store: self.key_store()?,
            new_slot,
        })
    }

    /// Sets an incremental receive's size to `size` (its base's chunks
    /// past a smaller size are already unmapped), zeroing the base's last
    /// chunk past its size first when larger.
    fn size_receiving(&self, id: VolumeId, size: u64) -> Result<()> {
        let cs = self.chunk_size();
        let old = self.read_meta()?.volume(id.0)?.size_bytes;
        if size <= old {
            if size < old {
                self.manage(Privilege::Reserve, |m| m.set_volume_size(id.0, size))?;
            }
            return Ok(());
        }
        let tail_end = (old.div_ceil(cs) * cs).min(size);
        if tail_end > old {
            self.zero_tail(id, old, tail_end - old)?;
        }
        self.manage(Privilege::Normal, |m| m.set_volume_size(id.0, size))
    }

    /// Fails unless `id` is a receive in progress and the range lies in
    /// it; says whether the receive is encrypted.
    fn check_receiving(&self, id: VolumeId, offset: u64, len: u64) -> Result<bool> {
        let meta = self.read_meta()?;
        let rec = meta.volume(id.0)?;
        if rec.kind != VolumeKind::Receiving {
            return Err(Invalid::NotAReceive(rec.name.clone()).into());
        }
        Self::check_range(rec, offset, len)?;
        Ok(rec.key_slot.is_some())
    }

    /// Applies a stream's data to receive `id` (see [`Pool::write`]).
    pub fn receive_write(&self, id: VolumeId, offset: u64, data: &[u8]) -> Result<()> {
        if self.check_receiving(id, offset, data.len() as u64)? {
            return Err(Invalid::PlainOntoEncrypted {
                base: self.read_meta()?.volume(id.0)?.name.clone(),
            }
            .into());
        }
        self.apply_all(Unit::data(id, offset, data))
    }

    /// Applies a raw stream's data to receive `id`: the bytes an encrypted
    /// volume stores (ciphertext), stored as they are, in whole chunks.
    pub fn receive_write_raw(&self, id: VolumeId, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        if !self.check_receiving(id, offset, len)? {
            return Err(Invalid::NotEncrypted(self.read_meta()?.volume(id.0)?.name.clone()).into());
        }
        self.check_whole_chunks(offset, len)?;
        self.apply_all(Unit {
            stored: true,
            ..Unit::data(id, offset, data)
        })
    }

    /// Makes a range of receive `id` read as zeros, unmapping whole chunks
    /// (a stream's zero and discard records). An encrypted receive takes
    /// whole chunks only (it has no key to store zeros with).
    pub fn receive_discard(&self, id: VolumeId, offset: u64, len: u64) -> Result<()> {
        if self.check_receiving(id, offset, len)? {
            self.check_whole_chunks(offset, len)?;
        }
        self.apply_all(Unit::zeros(id, offset, len, true))
    }

    fn check_whole_chunks(&self, offset: u64, len: u64) -> Result<()> {
        let chunk = self.chunk_size();
        if offset.is_multiple_of(chunk) && len.is_multiple_of(chunk) {
            Ok(())
        } else {
            Err(Invalid::RawUnaligned { offset, len, chunk }.into())
        }
    }

    /// Makes everything applied to receive `id` durable, with `offset`, the
    /// point a resumed stream goes on from, in the same commit.
    pub fn receive_checkpoint(&self, id: VolumeId, offset: u64) -> Result<()> {
        self.manage(Privilege::Normal, |m| {
            let rec = m.volume(id.0)?;
            if rec.kind != VolumeKind::Receiving || offset > rec.size_bytes {
                return Err(Invalid::Checkpoint {
                    offset,
                    name: rec.name.clone(),
                }
                .into());
            }
            m.set_received(id.0, offset)
        })
    }

    /// Makes the finished receive `id` visible in one commit: the snapshot
    /// `snapshot` (`volume@name`, with the stream's identity and the time
    /// the sender took it) and, for a
    /// full stream, the volume. An incremental receive rolls the volume
    /// forward to the new snapshot, which needs the volume unchanged since
    /// the base unless `force` (its changes are then discarded, as
    /// `zfs receive -F` does).
    pub fn finish_receive(
        &self,
        id: VolumeId,
        snapshot: &str,
        created_unix_secs: u64,
        force: bool,
    ) -> Result<VolumeId> {
        let (volume, _) = split_snapshot_name(snapshot)?;
        self.manage(Privilege::Normal, |m| {
            let rec = m.volume(id.0)?;
            if rec.kind != VolumeKind::Receiving || rec.name != receiving_name(volume) {
                return Err(Invalid::ReceiveElsewhere {
                    name: rec.name.clone(),
                    volume: volume.to_owned(),
                }
                .into());
            }
            if let (Some(base), Ok(vol)) = (nonzero(rec.receive.base), m.volume_id(volume)) {
                let base_id = m
                    .guid_id(&base)
                    .ok_or_else(|| Error::from(Conflict::BaseDeleted(hex(&base))))?;
                if m.volume(vol)?.root != m.volume(base_id)?.root && !force {
                    return Err(Conflict::WrittenSinceBase {
                        volume: volume.to_owned(),
                        base: m.volume(base_id)?.name.clone(),
                    }
                    .into());
                }
            }
            m.finish_receiving(id.0, volume, snapshot, created_unix_secs)
                .map(VolumeId)
        })
    }

    /// Abandons the receive into `volume`, if any; its space is reclaimed
    /// in the background. Returns whether there was one.
    pub fn abort_receive(&self, volume: &str) -> Result<bool> {
        self.manage(Privilege::Reserve, |m| match m.receiving_id(volume) {
            Some(id) => m.delete_volume(id).map(|()| true),
            None => Ok(false),
        })
    }
}

/// A GUID as 32 lowercase hex digits.
pub fn hex(guid: &Guid) -> String {
    guid.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arbor_io::{BlockDevice, SimDisk};

    use crate::{CreateOptions, Error, OpenOptions, Pool, Refusal, Resource, Result};

    fn pool(disk: &SimDisk) -> Pool {
        let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(4 << 20),
            ..Default::default()
        };
        Pool::create(dev, &opts, &OpenOptions::default()).unwrap()
    }

    /// Every step of a receive (begin, writes, checkpoint, finish) run out
    /// of metadata at every point in turn: each fails cleanly or completes;
    /// nothing shows before the finish, the volume and its base are
    /// unchanged until then, the pool checks clean, and once there is room
    /// again the same receive resumes and finishes.
    #[test]
    fn a_receive_is_atomic_whatever_point_metadata_runs_out_at() {
        use arbor_format::SmKind;

        use crate::ReceiveTarget;
        const CS: u64 = 4096;
        let (mut failed, mut finished) = (0, 0);
        for allow in 0..400u64 {
            let disk = SimDisk::new(64 << 20);
            let p = pool(&disk);
            let v = p.create_volume("v", 4 << 20).unwrap();
            for i in 0..256u64 {
                p.write(v, i * 4 * CS, &[i as u8 | 1; 4096]).unwrap();
            }
            let base = p.snapshot("v@a").unwrap();
            let before = read_all(&p, v);
            let target = ReceiveTarget {
                volume: "v".into(),
                target: [9; 16],
                base: Some(p.guid(base).unwrap().unwrap()),
                size: 4 << 20,
                key: None,
            };
            {
                let mut meta = p.meta.write().unwrap();
                let free = meta.meta().allocatable(SmKind::Meta);
                meta.set_meta_reserve(free.saturating_sub(allow));
            }
            let run = || -> Result<()> {
                let id = p.begin_receive(&target)?.status.id;
                for i in 0..256u64 {
                    p.receive_write(id, i * 4 * CS + CS, &[0xee; 4096])?;
                }
                p.receive_checkpoint(id, 4 << 20)?;
                p.finish_receive(id, "v@b", 1, false).map(drop)
            };
            match run() {
                Ok(()) => finished += 1,
                Err(Error::Exhausted(Resource::Metadata | Resource::DataSpace)) => {
                    failed += 1;
                    assert!(p.lookup("v@b").is_err(), "allow {allow}: visible");
                    assert!(read_all(&p, v) == before, "allow {allow}: volume changed");
                    assert!(read_all(&p, base) == before, "allow {allow}: base changed");
                    p.flush().unwrap();
                    assert!(p.check().unwrap().is_clean(), "allow {allow}");
                    // Room again: the same receive resumes and finishes.
                    p.meta.write().unwrap().set_meta_reserve(64);
                    run().unwrap();
                }
                Err(e) => panic!("allow {allow}: {e}"),
            }
            let b = p.lookup("v@b").unwrap();
            let got = read_all(&p, b);
            for i in 0..256usize {
                let at = i * 4 * CS as usize;
                assert_eq!(got[at], i as u8 | 1, "allow {allow}");
                assert_eq!(got[at + CS as usize], 0xee, "allow {allow}");
            }
            assert!(read_all(&p, v) == got);
            assert!(read_all(&p, base) == before);
            assert!(p.check().unwrap().is_clean(), "allow {allow}");
            if finished >= 2 {
                break;
            }
        }
        assert!(
            failed > 0 && finished > 0,
            "failed {failed}, finished {finished}"
        );
    }

    fn read_all(p: &Pool, id: crate::VolumeId) -> Vec<u8> {
        let mut buf = vec![0u8; p.info(id).unwrap().size as usize];
        p.read(id, 0, &mut buf).unwrap();
        buf
    }

    /// A held snapshot survives destroy until its holds are released or
    /// the destroy is forced; holds are durable, hidden from listings, and
    /// follow the snapshot through a rename of its volume.
    #[test]
    fn holds_keep_a_snapshot_until_released_or_forced() {
        let disk = SimDisk::new(64 << 20);
        let p = pool(&disk);
        let v = p.create_volume("v", 1 << 20).unwrap();
        p.write(v, 0, &[3; 4096]).unwrap();
        p.snapshot("v@s").unwrap();
        assert!(p.hold("v@s", "backup").unwrap());
        assert!(!p.hold("v@s", "backup").unwrap(), "the same tag twice");
        assert!(p.hold("v@s", "repl:site-b").unwrap());
        assert!(matches!(
            p.hold("v", "x"),
            Err(Error::Refused(Refusal::Invalid(_)))
        ));
        assert!(matches!(
            p.hold("v@s", "bad tag"),
            Err(Error::Refused(Refusal::Invalid(_)))
        ));
        let err = p.delete("v@s").unwrap_err();
        assert!(matches!(err, Error::Refused(Refusal::Conflict(_))), "{err}");
        assert!(err.to_string().contains("backup, repl:site-b"), "{err}");
        assert_eq!(p.list().unwrap().len(), 2, "holds are not volumes");
        p.rename("v", "w").unwrap();
        p.close().unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
        let p = Pool::open(dev, &OpenOptions::default()).unwrap();
        let s = p.lookup("w@s").unwrap();
        assert_eq!(p.holds(s).unwrap(), ["backup", "repl:site-b"]);
        assert!(p.release("w@s", "backup").unwrap());
        assert!(!p.release("w@s", "backup").unwrap());
        assert!(p.delete("w@s").is_err());
        p.delete_forced("w@s", true).unwrap();
        assert!(p.lookup("w@s").is_err());
        assert_eq!(p.list().unwrap().len(), 1);
        assert!(p.check().unwrap().is_clean());
    }
}
