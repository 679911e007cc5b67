//! Online growth (format version 2) and the upgrade from version 1.
//!
//! A growth appends one region after the pool's end (see
//! [`arbor_format::Layout`]):
//! 1. the device is enlarged (a file) or its new size read (a device);
//! 2. the region's space-map home pages are formatted and flushed: they lie
//!    past the end of every committed layout, so a power cut here leaves
//!    the pool as it was;
//! 3. with commits and writers held off, the region is published and the
//!    space maps take its entries;
//! 4. a commit names the region. Before its record is durable, a power cut
//!    opens the pool at its old size; after, at the new one.
//!
//! Writes and commits go on during steps 1 and 2 (formatting a large
//! region's pages takes a while); writes use the new space once step 3 is
//! done. One growth runs at a time.

use super::*;

/// What a growth adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrowOptions {
    /// The pool's new size in bytes. A regular file is enlarged to it
    /// first when smaller; a block device must be enlarged with its own
    /// tools. Without it the pool grows to the device's current size.
    pub size: Option<u64>,
    /// Metadata space in the new region, in bytes (rounded down to 4 KiB
    /// blocks); the rest becomes data chunks. Default: as at creation, 1/64
    /// of the added bytes and at least 128 bytes per added chunk. Give it to
    /// cure `MetadataFull` with little new data space.
    pub metadata_bytes: Option<u64>,
}

/// What a growth did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowReport {
    pub old_pool_bytes: u64,
    pub new_pool_bytes: u64,
    pub data_bytes_added: u64,
    pub metadata_bytes_added: u64,
}

/// Metadata blocks for a region of `bytes` bytes when the user does not
/// say: the creation policy (1/64 of the space, at least 128 bytes per
/// chunk, at most 1/8 of the space).
fn default_growth_metadata(bytes: u64, chunk_size: u64) -> u64 {
    let blocks = bytes / BLOCK_SIZE_U64;
    (blocks / 64).max(bytes / chunk_size / 32).min(blocks / 8)
}

impl Pool {
    /// The pool's on-disk format version: ask it what the pool has.
    pub fn format_version(&self) -> FormatVersion {
        self.store.geo.version()
    }

    /// Converts a pool of an older format version to the newest (version
    /// 2 can grow; version 3 gives every volume and snapshot an identity,
    /// which send and receive need). Older arbor releases cannot open it
    /// afterwards. Returns false when there was nothing to do.
    pub fn upgrade(&self) -> Result<bool> {
        let wrote = self.upgrade_superblocks()?;
        Ok(self.convert_table()? || wrote)
    }

    /// Rewrites a version 1 volume table as a version 3 one in a version 3
    /// pool (the second half of an upgrade), in one commit. Returns whether
    /// there was anything to do.
    pub(super) fn convert_table(&self) -> Result<bool> {
        if !self.store.geo.version().has_identities() || self.read_meta()?.has_identities() {
            return Ok(false);
        }
        self.manage(Privilege::Normal, |m| m.convert_table())
    }

    fn upgrade_superblocks(&self) -> Result<bool> {
        let _grow = lock_mutex(&self.grow_lock);
        let _commit = self.committer.lock();
        self.committer.check_failed()?;
        let geo = &self.store.geo;
        if geo.version().is_newest() {
            return Ok(false);
        }
        let block = geo
            .superblock()
            .encode(FormatVersion::NEWEST)
            .map_err(|e| Error::inconsistent(format!("superblock: {e}")))?;
        // The newest version may journal fewer pages per commit (version
        // 9: one less, FORMAT.md §7): the open transaction is committed
        // under the old one, and writers wait until the version is set, so
        // no transaction outgrows the new capacity.
        let _gate = self.gates.commit();
        let job = self.freeze(&mut *self.write_meta()?)?;
        if let Some(job) = job {
            self.complete_commit(job)?;
        }
        // One copy at a time: a power cut leaves a new copy and an old
        // one, both valid for a reader of the new version, and the commit
        // records written so far are valid in either. The volume table is
        // converted after both (`convert_table`): a new version pool may
        // hold an old table until then.
        for slot in 0..SUPERBLOCK_SLOTS {
            self.store.write_block(slot, &block)?;
            self.store.dev.flush()?;
        }
        // Commits write records of the newest version from now on.
        geo.set_version(FormatVersion::NEWEST);
        Ok(true)
    }

    /// Grows the pool onto the rest of its device (enlarged first when
    /// `opts.size` is given), adding data and metadata space, while it
    /// serves. Atomic: a failure or power cut leaves the old size.
    pub fn grow(&self, opts: &GrowOptions) -> Result<GrowReport> {
        // Only growths change the layout: it stays as read here until this
        // one publishes. Commits go on during the device work.
        let _grow = lock_mutex(&self.grow_lock);
        self.committer.check_failed()?;
        let geo = &self.store.geo;
        if !geo.version().has_grown_regions() {
            return Err(Invalid::CannotGrow(geo.version()).into());
        }
        let dev = &self.store.dev;
        let layout = geo.layout();
        let old_end = layout.end_bytes();
        let target = match opts.size {
            Some(size) if size < old_end => {
                return Err(Invalid::PoolShrink { end: old_end, size }.into())
            }
            Some(size) => {
                if size > dev.refresh_size()? {
                    dev.extend(size).map_err(|e| match e.kind() {
                        // The device cannot grow this way, or not that far.
                        std::io::ErrorKind::Unsupported
                        | std::io::ErrorKind::FileTooLarge
                        | std::io::ErrorKind::InvalidInput => {
                            Invalid::PoolFileNotEnlarged { size, error: e }.into()
                        }
                        _ => Error::from(e),
                    })?;
                }
                size
            }
            None => dev.refresh_size()?,
        };
        let added = target.saturating_sub(old_end);
        let meta_blocks = match opts.metadata_bytes {
            Some(bytes) => bytes / BLOCK_SIZE_U64,
            None => default_growth_metadata(added, geo.chunk_size),
        };
        let plan = layout
            .plan_growth(target, meta_blocks)
            .map_err(Invalid::Growth)?;
        let region = plan.region;
        // Past every committed layout's end: no trace if anything fails.
        format_space_map(dev.as_ref(), &region, SmKind::Meta)?;
        format_space_map(dev.as_ref(), &region, SmKind::Data)?;
        dev.flush()?;
        let _commit = self.committer.lock();
        let job = {
            let _gate = self.gates.commit();
            let mut meta = self.write_meta()?;
            if let Err(e) = meta.grow(plan.layout) {
                self.committer.fail(&e);
                return Err(e);
            }
            self.freeze(&mut meta)?
        };
        if let Some(job) = job {
            self.complete_commit(job)?;
        }
        Ok(GrowReport {
            old_pool_bytes: old_end,
            new_pool_bytes: geo.pool_bytes(),
            data_bytes_added: region.data_chunks * geo.chunk_size,
            metadata_bytes_added: region.meta_blocks * BLOCK_SIZE_U64,
        })
    }
}
