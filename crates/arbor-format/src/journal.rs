//! A journal area's contents (docs/FORMAT.md §4): one commit record, then
//! `page_count` space-map page images, contiguous, covered by `pages_crc`;
//! from version 9 a second copy of the record in the area's last block.

use zerocopy::little_endian::U32;

use crate::layout::Layout;
use crate::superblock::CommitRecord;
use crate::{FormatError, FormatVersion, SmPage, BLOCK_SIZE};

/// The bytes of a journal area for `record` (whose `page_count` and
/// `pages_crc` are set here) and `pages`, as a pool of format `version`
/// writes them: the record in the first block, the images after it.
pub fn encode_journal(
    record: &mut CommitRecord,
    version: FormatVersion,
    pages: &[impl AsRef<SmPage>],
) -> Result<Vec<u8>, FormatError> {
    let count = u32::try_from(pages.len())
        .map_err(|_| FormatError::Invalid(format!("{} page images", pages.len())))?;
    let mut journal = Vec::with_capacity((pages.len() + 1) * BLOCK_SIZE);
    journal.resize(BLOCK_SIZE, 0);
    for page in pages {
        journal.extend_from_slice(&page.as_ref().encode());
    }
    record.page_count = U32::new(count);
    record.pages_crc = U32::new(crc32c::crc32c(&journal[BLOCK_SIZE..]));
    let head = record.encode(version)?;
    journal[..BLOCK_SIZE].copy_from_slice(&head);
    Ok(journal)
}

/// Page images one commit of a pool of format `version` may journal, its
/// areas holding `journal_pages` pages besides the record: all of them, or
/// from version 9 one less (the area's last block holds the record's
/// second copy). The one place of the writer's capacity rule.
pub fn journal_capacity(version: FormatVersion, journal_pages: u64) -> u64 {
    if version.has_mirrored_commit_records() {
        journal_pages.saturating_sub(1)
    } else {
        journal_pages
    }
}

/// Blocks, counted from its area's first, that hold a copy of a commit
/// record of format `version`: the first, and from version 9 the last.
pub fn record_copies(version: FormatVersion, journal_pages: u64) -> Vec<u64> {
    if version.has_mirrored_commit_records() {
        vec![0, journal_pages]
    } else {
        vec![0]
    }
}

/// The commit record a journal area holds, chosen from its copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaRecord {
    pub record: CommitRecord,
    pub version: FormatVersion,
    /// The copy's block as read.
    pub block: Vec<u8>,
    /// Blocks (counted from the area's first) where a copy of this record
    /// belongs but does not verify or holds another record: rewrite them
    /// with `block`.
    pub damaged_copies: Vec<u64>,
}

/// Chooses the commit record of one journal area from its first block
/// (`head`) and its last (`tail`, block `journal_pages`), sans I/O:
/// the copy of the highest `txn` among those that verify and that
/// `accept` takes (this pool's uuid, a version no newer than the pool's);
/// a version 8 or older record counts only in the head, where its
/// protocol writes it. Two copies of one `txn` are one record (they are
/// equal unless a checksum collides; the head's is taken). `None` when no
/// copy verifies.
pub fn choose_area_record(
    head: &[u8],
    tail: &[u8],
    journal_pages: u64,
    accept: impl Fn(&CommitRecord, FormatVersion) -> bool,
) -> Option<AreaRecord> {
    let decode = |block: &[u8], at: u64| {
        let (record, version) = CommitRecord::decode_versioned(block).ok()?;
        let in_place = at == 0 || version.has_mirrored_commit_records();
        (in_place && accept(&record, version)).then_some((record, version, at))
    };
    let head_copy = decode(head, 0);
    let tail_copy = decode(tail, journal_pages);
    let (record, version, at) = match (head_copy, tail_copy) {
        (Some(h), Some(t)) if t.0.txn.get() > h.0.txn.get() => t,
        (Some(h), _) => h,
        (None, Some(t)) => t,
        (None, None) => return None,
    };
    let block = if at == 0 { head } else { tail }.to_vec();
    let damaged_copies = record_copies(version, journal_pages)
        .into_iter()
        .filter(|&copy| {
            let there = if copy == 0 { head } else { tail };
            there != &block[..]
        })
        .collect();
    Some(AreaRecord {
        record,
        version,
        block,
        damaged_copies,
    })
}

/// Bytes of page images that follow `record` in its area.
pub fn journal_images_len(record: &CommitRecord) -> usize {
    record.page_count.get() as usize * BLOCK_SIZE
}

/// The page images that follow `record` (`images` holds
/// [`journal_images_len`] bytes): valid when they match `pages_crc` and
/// each is a space-map page inside its map as `layout` (the record's)
/// sizes it.
pub fn decode_journal_pages(
    record: &CommitRecord,
    images: &[u8],
    layout: &Layout,
) -> Result<Vec<SmPage>, FormatError> {
    if images.len() != journal_images_len(record) {
        return Err(FormatError::Invalid(format!(
            "journal: {} bytes of page images for {} pages",
            images.len(),
            record.page_count.get()
        )));
    }
    let crc = crc32c::crc32c(images);
    if crc != record.pages_crc.get() {
        return Err(FormatError::BadChecksum {
            stored: record.pages_crc.get(),
            computed: crc,
        });
    }
    images
        .chunks_exact(BLOCK_SIZE)
        .map(|image| {
            let page = SmPage::decode_any(image)?;
            if u64::from(page.index) >= layout.sm_pages(page.kind) {
                return Err(FormatError::Invalid(format!(
                    "journal: {:?} space-map page {} beyond its map",
                    page.kind, page.index
                )));
            }
            Ok(page)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SmKind, Superblock};
    use zerocopy::little_endian::U64;

    fn layout() -> Layout {
        let mut sb = Superblock::new_zeroed_geometry();
        sb.chunk_size = U32::new(4096);
        sb.meta_blocks = U64::new(2000);
        sb.data_chunks = U64::new(1000);
        Layout::from_superblock(&sb)
    }

    fn v(number: u16) -> FormatVersion {
        FormatVersion::new(number).unwrap()
    }

    /// The record block of a commit `txn` of version `version`.
    fn record_block(txn: u64, version: FormatVersion) -> Vec<u8> {
        let mut record = CommitRecord::new_zeroed_record();
        record.txn = U64::new(txn);
        let pages: [SmPage; 0] = [];
        encode_journal(&mut record, version, &pages).unwrap()
    }

    const PAGES: u64 = 16;

    fn choose(head: &[u8], tail: &[u8]) -> Option<AreaRecord> {
        choose_area_record(head, tail, PAGES, |_, _| true)
    }

    #[test]
    fn version_9_journals_one_page_less_and_mirrors_its_record() {
        assert_eq!(journal_capacity(v(8), PAGES), PAGES);
        assert_eq!(journal_capacity(v(9), PAGES), PAGES - 1);
        assert_eq!(record_copies(v(8), PAGES), vec![0]);
        assert_eq!(record_copies(v(9), PAGES), vec![0, PAGES]);
    }

    #[test]
    fn both_copies_intact_give_the_record_and_nothing_to_rewrite() {
        let good = record_block(7, v(9));
        let chosen = choose(&good, &good).unwrap();
        assert_eq!(chosen.record.txn.get(), 7);
        assert!(chosen.damaged_copies.is_empty());
    }

    #[test]
    fn one_damaged_copy_gives_the_other_and_names_the_damaged_one() {
        let good = record_block(7, v(9));
        let mut flipped = good.clone();
        flipped[200] ^= 4;
        let zeroed = vec![0u8; BLOCK_SIZE];
        for bad in [&flipped, &zeroed] {
            let chosen = choose(bad, &good).unwrap();
            assert_eq!((chosen.record.txn.get(), &chosen.block), (7, &good));
            assert_eq!(chosen.damaged_copies, vec![0]);
            let chosen = choose(&good, bad).unwrap();
            assert_eq!(chosen.record.txn.get(), 7);
            assert_eq!(chosen.damaged_copies, vec![PAGES]);
        }
        assert_eq!(choose(&flipped, &zeroed), None);
    }

    /// A lost write leaves the area's earlier record (two commits older)
    /// in one copy: the newer copy wins, the stale one is to be rewritten.
    #[test]
    fn a_stale_copy_of_an_older_commit_loses_to_the_newer() {
        let new = record_block(9, v(9));
        let old = record_block(7, v(9));
        let chosen = choose(&old, &new).unwrap();
        assert_eq!(
            (chosen.record.txn.get(), chosen.damaged_copies),
            (9, vec![0])
        );
        let chosen = choose(&new, &old).unwrap();
        assert_eq!(
            (chosen.record.txn.get(), chosen.damaged_copies),
            (9, vec![PAGES])
        );
    }

    /// Version 8 and older records live in the head only: one in the last
    /// block is not a copy (it never is written there), and a version 8
    /// head has no copy to rewrite.
    #[test]
    fn older_records_count_in_the_head_only() {
        let old = record_block(5, v(8));
        let chosen = choose(&old, &[0u8; BLOCK_SIZE]).unwrap();
        assert_eq!(
            (chosen.record.txn.get(), chosen.damaged_copies),
            (5, vec![])
        );
        assert_eq!(choose(&[0u8; BLOCK_SIZE], &old), None);
        // The first version 9 commit into an area over a version 8 record.
        let new = record_block(7, v(9));
        let chosen = choose(&old, &new).unwrap();
        assert_eq!(
            (chosen.record.txn.get(), chosen.damaged_copies),
            (7, vec![0])
        );
    }

    #[test]
    fn records_the_pool_refuses_are_no_copies() {
        let good = record_block(7, v(9));
        assert_eq!(choose_area_record(&good, &good, PAGES, |_, _| false), None);
        let other = record_block(9, v(9));
        let chosen = choose_area_record(&good, &other, PAGES, |r, _| r.txn.get() == 7).unwrap();
        assert_eq!(
            (chosen.record.txn.get(), chosen.damaged_copies),
            (7, vec![PAGES])
        );
    }

    #[test]
    fn a_journal_round_trips_and_rejects_damage() {
        let mut pages = vec![
            SmPage::empty(SmKind::Meta, 1),
            SmPage::empty(SmKind::Data, 0),
        ];
        pages[0].counts[5] = 3;
        let mut record = CommitRecord::new_zeroed_record();
        let journal = encode_journal(&mut record, FormatVersion::new(2).unwrap(), &pages).unwrap();
        assert_eq!(journal.len(), 3 * BLOCK_SIZE);
        let head = CommitRecord::decode(&journal[..BLOCK_SIZE]).unwrap();
        assert_eq!(head, record);
        let images = &journal[BLOCK_SIZE..];
        assert_eq!(images.len(), journal_images_len(&head));
        assert_eq!(
            decode_journal_pages(&head, images, &layout()).unwrap(),
            pages
        );
        let mut torn = images.to_vec();
        torn[BLOCK_SIZE + 100] ^= 1;
        assert!(decode_journal_pages(&head, &torn, &layout()).is_err());
        assert!(decode_journal_pages(&head, &images[..BLOCK_SIZE], &layout()).is_err());
        // A page past its map (the data map has one page here).
        let far = [SmPage::empty(SmKind::Data, 1)];
        let mut record = CommitRecord::new_zeroed_record();
        let journal = encode_journal(&mut record, FormatVersion::new(2).unwrap(), &far).unwrap();
        assert!(decode_journal_pages(&record, &journal[BLOCK_SIZE..], &layout()).is_err());
    }
}
