//! A journal area's contents (docs/FORMAT.md §4): one commit record, then
//! `page_count` space-map page images, contiguous, covered by `pages_crc`.

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
