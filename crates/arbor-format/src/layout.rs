//! Where a pool's metadata and data live (format version 2).
//!
//! A pool is one or more **regions**. Region 0 is the superblock's layout
//! (version 1 pools have only it). Each online growth appends one region
//! after the end of the last one, with the same parts in the same order:
//! space-map home pages for its metadata blocks, space-map home pages for
//! its data chunks, metadata blocks, data chunks. The commit record lists
//! the grown regions, so a growth takes effect atomically with the commit
//! that first names it.
//!
//! Space-map entries are numbered across regions: the metadata entries of
//! region `r` are `meta_base(r) .. meta_base(r) + meta_blocks(r)` (data
//! likewise), with no gaps. A space-map page holds entries
//! `p * SM_ENTRIES_PER_PAGE ..`; its home is in the region that holds its
//! first entry, so a page whose entries straddle two regions stays at home
//! in the older one, and a grown region holds home pages only for pages
//! that start inside it.

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::superblock::{CommitRecord, Superblock, SUPERBLOCK_SLOTS};
use crate::{FormatError, SmKind, BLOCK_SIZE_U64, SM_ENTRIES_PER_PAGE};

/// How many times a pool can grow (regions after region 0), bounded by the
/// room in a commit record.
pub const MAX_GROWTHS: usize = 64;

const PER_PAGE: u64 = SM_ENTRIES_PER_PAGE as u64;

/// One grown region as stored in a commit record (48 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RegionRaw {
    pub meta_sm_start: U64,
    pub data_sm_start: U64,
    pub meta_start: U64,
    pub meta_blocks: U64,
    pub data_start_bytes: U64,
    pub data_chunks: U64,
}

/// One region, with the first space-map entry of each of its maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First block of the home pages this region holds for the metadata map.
    pub meta_sm_start: u64,
    /// First block of the home pages this region holds for the data map.
    pub data_sm_start: u64,
    /// First metadata-node block of this region and how many there are.
    pub meta_start: u64,
    pub meta_blocks: u64,
    /// Byte offset of this region's first data chunk and how many there are.
    pub data_start_bytes: u64,
    pub data_chunks: u64,
    /// Space-map entry of this region's first metadata block.
    pub meta_base: u64,
    /// Space-map entry (global chunk number) of this region's first chunk.
    pub data_base: u64,
}

/// Pages of a map whose first entry lies in `[base, base + count)`.
fn owned_pages(base: u64, count: u64) -> Option<u64> {
    Some(base.checked_add(count)?.div_ceil(PER_PAGE) - base.div_ceil(PER_PAGE))
}

impl Region {
    fn base(&self, kind: SmKind) -> u64 {
        match kind {
            SmKind::Meta => self.meta_base,
            SmKind::Data => self.data_base,
        }
    }

    /// Entries this region adds to a map.
    pub fn entries(&self, kind: SmKind) -> u64 {
        match kind {
            SmKind::Meta => self.meta_blocks,
            SmKind::Data => self.data_chunks,
        }
    }

    /// The first page of a map whose home is in this region.
    pub fn first_page(&self, kind: SmKind) -> u64 {
        self.base(kind).div_ceil(PER_PAGE)
    }

    /// How many home pages of a map this region holds.
    pub fn sm_pages(&self, kind: SmKind) -> u64 {
        // Validated when the region was built: base + entries does not overflow.
        owned_pages(self.base(kind), self.entries(kind)).unwrap_or(0)
    }

    /// Home block of page `page` of a map, which must be one of this region's.
    pub fn sm_home(&self, kind: SmKind, page: u64) -> u64 {
        let start = match kind {
            SmKind::Meta => self.meta_sm_start,
            SmKind::Data => self.data_sm_start,
        };
        start + (page - self.first_page(kind))
    }

    /// The byte just past this region's last data chunk.
    pub fn data_end(&self, chunk_size: u64) -> u64 {
        // Validated: the data region lies inside the device.
        self.data_start_bytes + self.data_chunks * chunk_size
    }

    /// The byte just past everything this region holds.
    pub fn end_bytes(&self, chunk_size: u64) -> u64 {
        self.data_end(chunk_size)
            .max((self.meta_start + self.meta_blocks) * BLOCK_SIZE_U64)
    }

    fn raw(&self) -> RegionRaw {
        RegionRaw {
            meta_sm_start: U64::new(self.meta_sm_start),
            data_sm_start: U64::new(self.data_sm_start),
            meta_start: U64::new(self.meta_start),
            meta_blocks: U64::new(self.meta_blocks),
            data_start_bytes: U64::new(self.data_start_bytes),
            data_chunks: U64::new(self.data_chunks),
        }
    }
}

/// Home block of page `page` of a map, in a pool of `regions` (in order).
pub fn sm_home_in<'a>(
    regions: impl DoubleEndedIterator<Item = &'a Region>,
    kind: SmKind,
    page: u64,
) -> Option<u64> {
    regions
        .rev()
        .find(|r| {
            let first = r.first_page(kind);
            first <= page && page - first < r.sm_pages(kind)
        })
        .map(|r| r.sm_home(kind, page))
}

/// The metadata space-map entry of `block`, if it is a metadata block.
pub fn meta_entry_in<'a>(regions: impl Iterator<Item = &'a Region>, block: u64) -> Option<u64> {
    regions.into_iter().find_map(|r| {
        let offset = block.checked_sub(r.meta_start)?;
        (offset < r.meta_blocks).then(|| r.meta_base + offset)
    })
}

/// The metadata block of space-map entry `entry`.
pub fn meta_block_in<'a>(regions: impl Iterator<Item = &'a Region>, entry: u64) -> Option<u64> {
    regions.into_iter().find_map(|r| {
        let offset = entry.checked_sub(r.meta_base)?;
        (offset < r.meta_blocks).then(|| r.meta_start + offset)
    })
}

/// The byte offset of data chunk `pchunk` (a global chunk number), and
/// how many chunks from it on are contiguous on the device (to the end of
/// its region: consecutive chunk numbers in two regions are not).
pub fn chunk_run_in<'a>(
    regions: impl Iterator<Item = &'a Region>,
    chunk_size: u64,
    pchunk: u64,
) -> Option<(u64, u64)> {
    regions.into_iter().find_map(|r| {
        let offset = pchunk.checked_sub(r.data_base)?;
        // In range: the region was validated to fit the device.
        (offset < r.data_chunks).then(|| {
            (
                r.data_start_bytes + offset * chunk_size,
                r.data_chunks - offset,
            )
        })
    })
}

/// The regions of a pool at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    chunk_size: u64,
    regions: Vec<Region>,
}

/// A growth: the region to add and the layout with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowPlan {
    pub region: Region,
    pub layout: Layout,
}

fn invalid(what: impl Into<String>) -> FormatError {
    FormatError::Invalid(format!("pool layout: {}", what.into()))
}

impl Layout {
    /// The layout of a pool that never grew: region 0 from a validated superblock.
    pub fn from_superblock(sb: &Superblock) -> Self {
        Self {
            chunk_size: u64::from(sb.chunk_size.get()),
            regions: vec![Region {
                meta_sm_start: sb.meta_sm_start.get(),
                data_sm_start: sb.data_sm_start.get(),
                meta_start: sb.meta_start.get(),
                meta_blocks: sb.meta_blocks.get(),
                data_start_bytes: sb.data_start_bytes.get(),
                data_chunks: sb.data_chunks.get(),
                meta_base: 0,
                data_base: 0,
            }],
        }
    }

    /// The layout a commit record describes: the superblock's region and
    /// the record's grown regions, each validated to follow the previous
    /// one and to lie inside a device of `device_bytes`.
    pub fn from_record(
        sb: &Superblock,
        record: &CommitRecord,
        device_bytes: u64,
    ) -> Result<Self, FormatError> {
        let mut layout = Self::from_superblock(sb);
        let count = record.grown_count.get() as usize;
        let grown = record
            .grown
            .get(..count)
            .ok_or_else(|| invalid(format!("{count} grown regions, at most {MAX_GROWTHS}")))?;
        for raw in grown {
            let region = layout.next_region(raw)?;
            layout.check_region(&region, device_bytes)?;
            layout.regions.push(region);
        }
        Ok(layout)
    }

    /// Writes the grown regions into a commit record.
    pub fn store(&self, record: &mut CommitRecord) {
        let grown = &self.regions[1..];
        // At most MAX_GROWTHS: plan_growth refuses more.
        record.grown_count = (grown.len() as u32).into();
        for (slot, region) in record.grown.iter_mut().zip(grown) {
            *slot = region.raw();
        }
    }

    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Entries of a map across all regions.
    pub fn entries(&self, kind: SmKind) -> u64 {
        // Each region was checked to keep the sum in range.
        self.regions.iter().map(|r| r.entries(kind)).sum()
    }

    /// Home block of page `page` of a map.
    pub fn sm_home(&self, kind: SmKind, page: u64) -> Option<u64> {
        sm_home_in(self.regions.iter(), kind, page)
    }

    /// Pages of a map across all regions.
    pub fn sm_pages(&self, kind: SmKind) -> u64 {
        self.entries(kind).div_ceil(PER_PAGE)
    }

    /// The byte just past the last region.
    pub fn end_bytes(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| r.end_bytes(self.chunk_size))
            .max()
            .unwrap_or(0)
    }

    /// Plans a growth onto a device of `device_bytes`: a new region with
    /// `meta_blocks` metadata blocks after the last region, and as many data
    /// chunks as fit behind them.
    pub fn plan_growth(
        &self,
        device_bytes: u64,
        meta_blocks: u64,
    ) -> Result<GrowPlan, FormatError> {
        if self.regions.len() > MAX_GROWTHS {
            return Err(invalid(format!(
                "the pool has grown {MAX_GROWTHS} times, the most a commit record can describe"
            )));
        }
        let cs = self.chunk_size;
        let start = self.end_bytes().next_multiple_of(BLOCK_SIZE_U64);
        let meta_base = self.entries(SmKind::Meta);
        let data_base = self.entries(SmKind::Data);
        let too_big = || invalid("growth overflows");
        // An upper bound on the chunks, to size the data map's pages.
        let chunk_guess = device_bytes.saturating_sub(start) / cs;
        let meta_sm_start = start / BLOCK_SIZE_U64;
        let data_sm_start = meta_sm_start
            .checked_add(owned_pages(meta_base, meta_blocks).ok_or_else(too_big)?)
            .ok_or_else(too_big)?;
        let meta_start = data_sm_start
            .checked_add(owned_pages(data_base, chunk_guess).ok_or_else(too_big)?)
            .ok_or_else(too_big)?;
        let data_start_bytes = meta_start
            .checked_add(meta_blocks)
            .and_then(|end| end.checked_mul(BLOCK_SIZE_U64))
            .and_then(|end| end.checked_next_multiple_of(cs))
            .ok_or_else(too_big)?;
        if data_start_bytes > device_bytes {
            return Err(invalid(format!(
                "the device ({device_bytes} bytes) has no room for {meta_blocks} metadata blocks after the pool's end ({start} bytes)"
            )));
        }
        let data_chunks = (device_bytes - data_start_bytes) / cs;
        if meta_blocks == 0 && data_chunks == 0 {
            return Err(invalid(format!(
                "the device ({device_bytes} bytes) has no room for a chunk after the pool's end ({start} bytes)"
            )));
        }
        let region = Region {
            meta_sm_start,
            data_sm_start,
            meta_start,
            meta_blocks,
            data_start_bytes,
            data_chunks,
            meta_base,
            data_base,
        };
        self.check_region(&region, device_bytes)?;
        let mut layout = self.clone();
        layout.regions.push(region);
        Ok(GrowPlan { region, layout })
    }

    /// A raw grown region placed after the current last one.
    fn next_region(&self, raw: &RegionRaw) -> Result<Region, FormatError> {
        Ok(Region {
            meta_sm_start: raw.meta_sm_start.get(),
            data_sm_start: raw.data_sm_start.get(),
            meta_start: raw.meta_start.get(),
            meta_blocks: raw.meta_blocks.get(),
            data_start_bytes: raw.data_start_bytes.get(),
            data_chunks: raw.data_chunks.get(),
            meta_base: self.entries(SmKind::Meta),
            data_base: self.entries(SmKind::Data),
        })
    }

    /// A region to append must start after the last one, keep its parts in
    /// order and disjoint, lie inside the device and keep every map's page
    /// numbers within `u32`.
    fn check_region(&self, r: &Region, device_bytes: u64) -> Result<(), FormatError> {
        let cs = self.chunk_size;
        let end = self.end_bytes();
        let overflow = || invalid("a grown region's end overflows");
        let mut next_free = end.div_ceil(BLOCK_SIZE_U64).max(SUPERBLOCK_SLOTS);
        for (what, start, len) in [
            (
                "metadata space-map pages",
                r.meta_sm_start,
                owned_pages(r.meta_base, r.meta_blocks),
            ),
            (
                "data space-map pages",
                r.data_sm_start,
                owned_pages(r.data_base, r.data_chunks),
            ),
            ("metadata blocks", r.meta_start, Some(r.meta_blocks)),
        ] {
            let len = len.ok_or_else(overflow)?;
            if start < next_free {
                return Err(invalid(format!(
                    "a grown region's {what} start at block {start}, before block {next_free}"
                )));
            }
            next_free = start.checked_add(len).ok_or_else(overflow)?;
        }
        let meta_end = next_free.checked_mul(BLOCK_SIZE_U64).ok_or_else(overflow)?;
        if r.data_start_bytes < meta_end || !r.data_start_bytes.is_multiple_of(cs) {
            return Err(invalid(
                "a grown region's data overlaps its metadata or is not chunk aligned",
            ));
        }
        let data_end = r
            .data_chunks
            .checked_mul(cs)
            .and_then(|len| len.checked_add(r.data_start_bytes))
            .ok_or_else(overflow)?;
        if data_end > device_bytes || meta_end > device_bytes {
            return Err(invalid(format!(
                "a grown region ends past the device ({device_bytes} bytes)"
            )));
        }
        for kind in [SmKind::Meta, SmKind::Data] {
            let entries = self
                .entries(kind)
                .checked_add(r.entries(kind))
                .ok_or_else(overflow)?;
            if entries.div_ceil(PER_PAGE) > u64::from(u32::MAX) {
                return Err(invalid(format!("{kind:?} space map too large")));
            }
        }
        if r.meta_blocks == 0 && r.data_chunks == 0 {
            return Err(invalid("a grown region adds nothing"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use zerocopy::little_endian::U32;

    use super::*;
    use crate::BLOCK_SIZE;

    const MIB: u64 = 1 << 20;

    /// A region 0 like `Pool::create` lays out: 64 MiB, 4 KiB chunks,
    /// metadata that does not fill whole space-map pages.
    fn superblock() -> Superblock {
        let mut sb = Superblock::new_zeroed_geometry();
        sb.pool_bytes = U64::new(64 * MIB);
        sb.chunk_size = U32::new(4096);
        sb.journal_pages = U32::new(16);
        sb.journal_start = [U64::new(2), U64::new(19)];
        sb.meta_sm_start = U64::new(36);
        sb.data_sm_start = U64::new(37);
        sb.meta_start = U64::new(53);
        sb.meta_blocks = U64::new(700);
        sb.data_start_bytes = U64::new(753 * BLOCK_SIZE_U64);
        sb.data_chunks = U64::new(64 * MIB / 4096 - 753);
        sb.validate(64 * MIB).unwrap();
        sb
    }

    /// Where every block of every region's parts is, as (what, region).
    fn occupancy(layout: &Layout) -> HashMap<u64, (&'static str, usize)> {
        let mut owner = HashMap::new();
        let cs = layout.chunk_size();
        for (i, r) in layout.regions().iter().enumerate() {
            let mut claim = |what, start: u64, blocks: u64| {
                for b in start..start + blocks {
                    if let Some(prev) = owner.insert(b, (what, i)) {
                        panic!("block {b}: {what} of region {i} over {prev:?}");
                    }
                }
            };
            claim("meta sm", r.meta_sm_start, r.sm_pages(SmKind::Meta));
            claim("data sm", r.data_sm_start, r.sm_pages(SmKind::Data));
            claim("meta", r.meta_start, r.meta_blocks);
            claim(
                "data",
                r.data_start_bytes / BLOCK_SIZE_U64,
                r.data_chunks * cs / BLOCK_SIZE_U64,
            );
        }
        owner
    }

    /// Every entry of both maps lives in exactly one region, every page has
    /// exactly one home, in the region that holds its first entry, and no
    /// two parts of any regions share a block.
    fn check_layout(layout: &Layout) {
        let owner = occupancy(layout);
        for kind in [SmKind::Meta, SmKind::Data] {
            let entries = layout.entries(kind);
            let mut homes = HashMap::new();
            for page in 0..layout.sm_pages(kind) {
                let home = layout.sm_home(kind, page).expect("every page has a home");
                let first = page * PER_PAGE;
                let holder = layout
                    .regions()
                    .iter()
                    .position(|r| first >= r.base(kind) && first - r.base(kind) < r.entries(kind))
                    .expect("a page's first entry is in a region");
                let want = if kind == SmKind::Meta {
                    "meta sm"
                } else {
                    "data sm"
                };
                assert_eq!(
                    owner.get(&home),
                    Some(&(want, holder)),
                    "{kind:?} page {page}"
                );
                assert!(
                    homes.insert(home, page).is_none(),
                    "two pages at block {home}"
                );
            }
            assert!(layout.sm_home(kind, layout.sm_pages(kind)).is_none());
            assert_eq!(entries.div_ceil(PER_PAGE), layout.sm_pages(kind));
        }
        let regions = layout.regions();
        for e in (0..layout.entries(SmKind::Meta)).step_by(97) {
            let block = meta_block_in(regions.iter(), e).expect("a block per entry");
            assert_eq!(owner.get(&block).map(|o| o.0), Some("meta"));
            assert_eq!(meta_entry_in(regions.iter(), block), Some(e));
        }
        let cs = layout.chunk_size();
        for c in (0..layout.entries(SmKind::Data)).step_by(89) {
            let (at, run) = chunk_run_in(regions.iter(), cs, c).expect("an offset per chunk");
            assert!(run >= 1);
            assert_eq!(owner.get(&(at / BLOCK_SIZE_U64)).map(|o| o.0), Some("data"));
        }
    }

    /// The layout a commit record holding `layout`'s regions decodes to.
    fn through_record(sb: &Superblock, layout: &Layout, device: u64) -> Layout {
        let mut rec = CommitRecord::new_zeroed_record();
        layout.store(&mut rec);
        let rec = CommitRecord::decode(&rec.encode(crate::FormatVersion::new(2).unwrap()).unwrap())
            .unwrap();
        Layout::from_record(sb, &rec, device).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any sequence of growths lays out disjoint regions whose pages
        /// and entries resolve exactly once, and a commit record carries
        /// them unchanged.
        #[test]
        fn growths_lay_out_disjoint_regions(
            steps in prop::collection::vec((1u64..40_000, 0u64..3_000), 1..12)
        ) {
            let sb = superblock();
            let mut layout = Layout::from_superblock(&sb);
            let mut device = 64 * MIB;
            for (add_blocks, meta) in steps {
                device += add_blocks * BLOCK_SIZE_U64;
                match layout.plan_growth(device, meta) {
                    Ok(plan) => {
                        prop_assert_eq!(plan.layout.regions().len(), layout.regions().len() + 1);
                        prop_assert!(plan.layout.end_bytes() <= device);
                        layout = plan.layout;
                    }
                    // Too little room for the metadata asked for.
                    Err(e) => prop_assert!(e.to_string().contains("no room"), "{}", e),
                }
                check_layout(&layout);
                prop_assert_eq!(&through_record(&sb, &layout, device), &layout);
            }
        }
    }

    #[test]
    fn records_with_overlapping_or_escaping_regions_are_invalid() {
        let sb = superblock();
        let layout = Layout::from_superblock(&sb);
        let plan = layout.plan_growth(80 * MIB, 64).unwrap();
        let mut rec = CommitRecord::new_zeroed_record();
        plan.layout.store(&mut rec);
        assert!(Layout::from_record(&sb, &rec, 80 * MIB).is_ok());
        assert!(
            Layout::from_record(&sb, &rec, 79 * MIB).is_err(),
            "past the device"
        );
        let mut bad = rec;
        bad.grown[0].meta_sm_start = U64::new(100);
        assert!(
            Layout::from_record(&sb, &bad, 80 * MIB).is_err(),
            "over region 0"
        );
        let mut bad = rec;
        bad.grown[0].meta_start = bad.grown[0].data_sm_start;
        assert!(
            Layout::from_record(&sb, &bad, 80 * MIB).is_err(),
            "metadata over its space-map pages"
        );
        let mut bad = rec;
        bad.grown[0].data_start_bytes = U64::new(bad.grown[0].data_start_bytes.get() + 512);
        assert!(
            Layout::from_record(&sb, &bad, 80 * MIB).is_err(),
            "unaligned data"
        );
        let mut bad = rec;
        bad.grown[0].data_chunks = U64::new(u64::MAX / 2);
        assert!(
            Layout::from_record(&sb, &bad, u64::MAX).is_err(),
            "overflow"
        );
        let mut bad = rec;
        bad.grown[0].meta_blocks = U64::new(0);
        bad.grown[0].data_chunks = U64::new(0);
        assert!(
            Layout::from_record(&sb, &bad, 80 * MIB).is_err(),
            "an empty region"
        );
        let mut bad = rec;
        bad.grown_count = U32::new(2);
        bad.grown[1] = bad.grown[0];
        assert!(
            Layout::from_record(&sb, &bad, 160 * MIB).is_err(),
            "a region over the previous one"
        );
        let mut full = Layout::from_superblock(&sb);
        let mut device = 64 * MIB;
        for _ in 0..MAX_GROWTHS {
            device += MIB;
            full = full.plan_growth(device, 8).unwrap().layout;
        }
        let e = full.plan_growth(device + MIB, 8).unwrap_err();
        assert!(e.to_string().contains("64 times"), "{e}");
        assert_eq!(BLOCK_SIZE, 4096);
    }
}
