//! The one place that answers "does format version N have X": a
//! [`FormatVersion`] exists only for a version this crate knows, and says
//! what it has in the words of docs/FORMAT.md §8. Nothing outside this
//! crate compares format version numbers.

use std::fmt;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::{FormatError, FORMAT_VERSION, OLDEST_FORMAT_VERSION};

/// A pool's on-disk format version, one this crate reads and writes
/// ([`OLDEST_FORMAT_VERSION`] ..= [`FORMAT_VERSION`]). It has no order:
/// ask it what it has instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FormatVersion(u16);

impl FormatVersion {
    /// The version new pools get.
    pub const NEWEST: Self = Self(FORMAT_VERSION);
    /// The oldest version this crate still opens.
    pub const OLDEST: Self = Self(OLDEST_FORMAT_VERSION);
    /// The version in the header of blocks whose layout has not changed
    /// since it was introduced (space-map pages and nodes, and intent log
    /// records, FORMAT.md §2).
    pub const UNCHANGED_LAYOUT: Self = Self(1);

    /// `number` as a version this crate knows, or
    /// [`FormatError::UnsupportedVersion`].
    pub fn new(number: u16) -> Result<Self, FormatError> {
        if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&number) {
            Ok(Self(number))
        } else {
            Err(FormatError::UnsupportedVersion(number))
        }
    }

    /// Every version this crate knows, oldest first.
    pub fn all() -> impl DoubleEndedIterator<Item = Self> {
        (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).map(Self)
    }

    /// The number written in block headers and reported to users.
    pub fn number(self) -> u16 {
        self.0
    }

    /// Whether this is the version new pools get (an upgrade has nothing
    /// to do).
    pub fn is_newest(self) -> bool {
        self == Self::NEWEST
    }

    /// Version 2: pools grow online, their grown regions listed in the
    /// commit record (FORMAT.md §1.1, §4.1).
    pub fn has_grown_regions(self) -> bool {
        self.0 >= 2
    }

    /// Version 3: identities, receives and holds, in a volume table of
    /// the kind 4 layout (FORMAT.md §6).
    pub fn has_identities(self) -> bool {
        self.0 >= 3
    }

    /// Version 4: properties, volume records of kind 4 (FORMAT.md §6).
    pub fn has_properties(self) -> bool {
        self.0 >= 4
    }

    /// Version 5: copy-on-write volumes, snapshot stores and homes in the
    /// pool (FORMAT.md §6.1).
    pub fn has_cow_volumes(self) -> bool {
        self.0 >= 5
    }

    /// Version 6: packed mapping leaves, node kind 5 (FORMAT.md §6.2).
    pub fn has_packed_leaves(self) -> bool {
        self.0 >= 6
    }

    /// Version 7: partial extents (FORMAT.md §6.3).
    pub fn has_partial_extents(self) -> bool {
        self.0 >= 7
    }

    /// Version 8: middle layers of partial extents (FORMAT.md §6.3).
    pub fn has_middle_layers(self) -> bool {
        self.0 >= 8
    }

    /// Version 9: the page images of a commit are durable before its
    /// record, which is written twice (FORMAT.md §4, "Version 9").
    pub fn has_mirrored_commit_records(self) -> bool {
        self.0 >= 9
    }

    /// Version 10: a crc32c of every 4 KiB block of data, in the checksum
    /// tree, and the in-place intent set (FORMAT.md §6.4).
    pub fn has_data_checksums(self) -> bool {
        self.0 >= 10
    }

    /// Version 11: encrypted volumes, their key slot in the volume record
    /// and the pool's key store (FORMAT.md §6.6).
    pub fn has_encryption(self) -> bool {
        self.0 >= 11
    }

    /// Version 12: an encrypted record may be a receive in progress (a raw
    /// stream's, or any stream's onto an encrypted base), its receive
    /// state beside its key slot (FORMAT.md §6.6).
    pub fn has_encrypted_receives(self) -> bool {
        self.0 >= 12
    }

    /// Version 13: pools created at this version have an intent log area
    /// (superblock `log_start`, `log_blocks`), whose records list regions
    /// of the in-place intent set durably between commits (FORMAT.md
    /// §6.4.1). An upgraded pool has none.
    pub fn has_intent_log(self) -> bool {
        self.0 >= 13
    }

    /// Version 14: the intent log (of a pool that has one) may also hold
    /// snapshot records, snapshots taken after the newest durable commit
    /// and made durable by the record instead of a commit (FORMAT.md
    /// §6.4.2).
    pub fn has_logged_snapshots(self) -> bool {
        self.0 >= 14
    }

    /// Whether a commit record of version `record` is valid in a pool of
    /// this version: one no newer than the pool (FORMAT.md §4; each
    /// upgrade keeps the older records valid, §8).
    pub fn accepts_commit_record(self, record: FormatVersion) -> bool {
        record.0 <= self.0
    }
}

impl fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A [`FormatVersion`] that an upgrade changes while readers ask it.
#[derive(Debug)]
pub struct AtomicFormatVersion(AtomicU16);

impl AtomicFormatVersion {
    pub fn new(version: FormatVersion) -> Self {
        Self(AtomicU16::new(version.0))
    }

    pub fn get(&self) -> FormatVersion {
        // Only a FormatVersion was ever stored.
        FormatVersion(self.0.load(Ordering::Acquire))
    }

    pub fn set(&self, version: FormatVersion) {
        self.0.store(version.0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_versions_exist() {
        assert_eq!(
            FormatVersion::new(0),
            Err(FormatError::UnsupportedVersion(0))
        );
        assert_eq!(
            FormatVersion::new(FORMAT_VERSION + 1),
            Err(FormatError::UnsupportedVersion(FORMAT_VERSION + 1))
        );
        let all: Vec<u16> = FormatVersion::all().map(FormatVersion::number).collect();
        assert_eq!(
            all,
            (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).collect::<Vec<_>>()
        );
        assert!(FormatVersion::new(FORMAT_VERSION).unwrap().is_newest());
    }

    /// FORMAT.md §8: each version has what it added and what every older
    /// one did, and nothing newer.
    #[test]
    fn each_version_has_what_it_and_older_ones_added() {
        let added: [fn(FormatVersion) -> bool; 12] = [
            FormatVersion::has_grown_regions,
            FormatVersion::has_identities,
            FormatVersion::has_properties,
            FormatVersion::has_cow_volumes,
            FormatVersion::has_packed_leaves,
            FormatVersion::has_partial_extents,
            FormatVersion::has_middle_layers,
            FormatVersion::has_mirrored_commit_records,
            FormatVersion::has_data_checksums,
            FormatVersion::has_encryption,
            FormatVersion::has_encrypted_receives,
            FormatVersion::has_intent_log,
        ];
        for v in FormatVersion::all() {
            for (i, has) in added.iter().enumerate() {
                let since = i as u16 + 2;
                assert_eq!(
                    has(v),
                    v.number() >= since,
                    "version {v}, capability of {since}"
                );
            }
        }
    }

    #[test]
    fn a_pool_accepts_commit_records_no_newer_than_itself() {
        for pool in FormatVersion::all() {
            for record in FormatVersion::all() {
                assert_eq!(
                    pool.accepts_commit_record(record),
                    record.number() <= pool.number()
                );
            }
        }
    }

    #[test]
    fn the_atomic_version_reads_what_was_set() {
        let v = AtomicFormatVersion::new(FormatVersion::OLDEST);
        assert_eq!(v.get(), FormatVersion::OLDEST);
        v.set(FormatVersion::NEWEST);
        assert_eq!(v.get(), FormatVersion::NEWEST);
    }
}
