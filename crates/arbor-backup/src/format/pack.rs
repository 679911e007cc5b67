//! Pack objects (docs/BACKUP.md, "Packs"): many sealed blobs in one object
//! of a few MiB, so that object counts stay in the thousands.
//!
//! ```text
//! "ARBPACK1"                      8 bytes
//! blob*                           each: nonce (24) | sealed payload | tag (16)
//! header                          sealed: u32 count, then per blob ENTRY_LEN bytes
//! u32 header length | "APK1"      8 bytes
//! ```
//!
//! A blob's payload is its plaintext, zstd-compressed when that is
//! smaller; it is sealed with the associated data [`blob_aad`] (its id,
//! kind, encoding and plaintext length), so a blob moved, swapped or
//! relabelled does not open; opened, its plaintext's keyed hash must be
//! its id. The header lists every blob, so a pack describes itself: an
//! index lost or never written is rebuilt from the packs' headers.

use crate::crypto::{BlobId, Keys, SEAL_OVERHEAD};
use crate::format::{invalid, BlobKind, Cursor, FormatError, ObjectId, MAX_BLOCK_SIZE};

pub const PACK_MAGIC: &[u8; 8] = b"ARBPACK1";
pub const TAIL_MAGIC: &[u8; 4] = b"APK1";
/// Bytes of the tail: the header's length and [`TAIL_MAGIC`].
pub const TAIL_LEN: usize = 8;
/// Bytes of one header entry: id (32), kind (1), encoding (1), offset,
/// stored length, plaintext length (u32 each).
pub const ENTRY_LEN: usize = 46;
/// A pack is written once it holds this many bytes.
pub const TARGET_PACK_BYTES: usize = 8 << 20;
/// The largest pack a reader accepts (a block of 1 MiB may end a pack just
/// under the target: well below this).
pub const MAX_PACK_BYTES: u64 = 64 << 20;
/// The most blobs a pack header may list.
pub const MAX_ENTRIES: u32 = 1 << 20;
/// The largest blob plaintext: a block of the largest size, or a map piece.
pub const MAX_BLOB_BYTES: u32 = MAX_BLOCK_SIZE;
/// zstd's level for blobs: fast (the network is the bottleneck).
pub const ZSTD_LEVEL: i32 = 1;

const HEADER_AAD: &[u8] = b"arbor-backup pack header v1";

/// How a blob's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Raw,
    Zstd,
}

impl Encoding {
    fn code(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Zstd => 1,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// Where one blob lies in its pack, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    pub id: BlobId,
    pub kind: BlobKind,
    pub encoding: Encoding,
    /// From the pack's first byte.
    pub offset: u32,
    /// Sealed bytes: nonce, payload and tag.
    pub stored_len: u32,
    /// Plaintext bytes.
    pub raw_len: u32,
}

impl Entry {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.0);
        out.push(self.kind.code());
        out.push(self.encoding.code());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
    }

    /// One entry, checked on its own (its place in a pack is checked by
    /// the caller).
    pub(crate) fn decode(c: &mut Cursor<'_>, what: &'static str) -> Result<Entry, FormatError> {
        let id = BlobId(c.id()?);
        let kind = c.u8()?;
        let kind = BlobKind::from_code(kind)
            .ok_or_else(|| invalid(what, format!("unknown blob kind {kind}")))?;
        let encoding = c.u8()?;
        let encoding = Encoding::from_code(encoding)
            .ok_or_else(|| invalid(what, format!("unknown blob encoding {encoding}")))?;
        let entry = Entry {
            id,
            kind,
            encoding,
            offset: c.u32()?,
            stored_len: c.u32()?,
            raw_len: c.u32()?,
        };
        if entry.raw_len > MAX_BLOB_BYTES {
            return Err(invalid(
                what,
                format!(
                    "a blob of {} bytes (at most {MAX_BLOB_BYTES})",
                    entry.raw_len
                ),
            ));
        }
        if (entry.stored_len as usize) < SEAL_OVERHEAD
            || u64::from(entry.stored_len) > u64::from(MAX_BLOB_BYTES) * 2 + SEAL_OVERHEAD as u64
        {
            return Err(invalid(
                what,
                format!("a blob stored in {} bytes", entry.stored_len),
            ));
        }
        Ok(entry)
    }

    /// The first byte after the blob.
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.stored_len)
    }
}

/// What a blob's seal is bound to.
pub fn blob_aad(id: &BlobId, kind: BlobKind, encoding: Encoding, raw_len: u32) -> [u8; 38] {
    let mut aad = [0u8; 38];
    aad[..32].copy_from_slice(&id.0);
    aad[32] = kind.code();
    aad[33] = encoding.code();
    aad[34..].copy_from_slice(&raw_len.to_le_bytes());
    aad
}

/// A pack being filled.
pub struct PackWriter {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

impl Default for PackWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PackWriter {
    pub fn new() -> Self {
        let mut bytes = Vec::with_capacity(TARGET_PACK_BYTES + (1 << 20));
        bytes.extend_from_slice(PACK_MAGIC);
        PackWriter {
            bytes,
            entries: Vec::new(),
        }
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the pack is full enough to be written.
    pub fn is_full(&self) -> bool {
        self.bytes.len() >= TARGET_PACK_BYTES
    }

    /// Adds a blob [`seal_blob`] sealed.
    pub fn add(&mut self, sealed: Sealed) -> &Entry {
        let offset = u32::try_from(self.bytes.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&sealed.bytes);
        self.entries.push(Entry {
            id: sealed.id,
            kind: sealed.kind,
            encoding: sealed.encoding,
            offset,
            stored_len: u32::try_from(sealed.bytes.len()).unwrap_or(u32::MAX),
            raw_len: sealed.raw_len,
        });
        // Just pushed.
        #[allow(clippy::expect_used)]
        self.entries.last().expect("an entry was just pushed")
    }

    /// The finished pack: its name, its bytes and its entries.
    pub fn finish(mut self, keys: &Keys) -> (ObjectId, Vec<u8>, Vec<Entry>) {
        let mut header = Vec::with_capacity(4 + self.entries.len() * ENTRY_LEN);
        header.extend_from_slice(
            &u32::try_from(self.entries.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for e in &self.entries {
            e.encode(&mut header);
        }
        let before = self.bytes.len();
        keys.seal(HEADER_AAD, &header, &mut self.bytes);
        let header_len = u32::try_from(self.bytes.len() - before).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&header_len.to_le_bytes());
        self.bytes.extend_from_slice(TAIL_MAGIC);
        (ObjectId::of(&self.bytes), self.bytes, self.entries)
    }
}

/// A blob sealed and ready for a pack (made on any thread).
pub struct Sealed {
    pub id: BlobId,
    pub kind: BlobKind,
    pub encoding: Encoding,
    pub raw_len: u32,
    pub bytes: Vec<u8>,
}

/// Seals `plain` as a blob of `kind` named `id`: zstd-compressed when that
/// saves bytes.
pub fn seal_blob(keys: &Keys, id: BlobId, kind: BlobKind, plain: &[u8]) -> Sealed {
    let raw_len = u32::try_from(plain.len()).unwrap_or(u32::MAX);
    let compressed = zstd::bulk::compress(plain, ZSTD_LEVEL)
        .ok()
        .filter(|c| c.len() < plain.len());
    let (encoding, payload) = match &compressed {
        Some(c) => (Encoding::Zstd, c.as_slice()),
        None => (Encoding::Raw, plain),
    };
    let mut bytes = Vec::with_capacity(payload.len() + SEAL_OVERHEAD);
    keys.seal(&blob_aad(&id, kind, encoding, raw_len), payload, &mut bytes);
    Sealed {
        id,
        kind,
        encoding,
        raw_len,
        bytes,
    }
}

/// Opens a blob `entry` describes, from its sealed bytes: authenticated,
/// decompressed to exactly its length, and its content hashed back to its
/// id.
pub fn open_blob(keys: &Keys, entry: &Entry, sealed: &[u8]) -> Result<Vec<u8>, FormatError> {
    const WHAT: &str = "a blob";
    if sealed.len() != entry.stored_len as usize {
        return Err(invalid(
            WHAT,
            format!(
                "{} bytes where {} were listed",
                sealed.len(),
                entry.stored_len
            ),
        ));
    }
    let aad = blob_aad(&entry.id, entry.kind, entry.encoding, entry.raw_len);
    let payload = keys.open(WHAT, &aad, sealed)?;
    let plain = match entry.encoding {
        Encoding::Raw => payload,
        Encoding::Zstd => {
            let plain = zstd::bulk::decompress(&payload, entry.raw_len as usize)
                .map_err(|e| invalid(WHAT, format!("does not decompress: {e}")))?;
            plain
        }
    };
    if plain.len() != entry.raw_len as usize {
        return Err(invalid(
            WHAT,
            format!("{} bytes where {} were listed", plain.len(), entry.raw_len),
        ));
    }
    if keys.blob_id(entry.kind.code(), &plain) != entry.id {
        return Err(invalid(
            WHAT,
            format!("{} holds other content than its name says", entry.id),
        ));
    }
    Ok(plain)
}

/// The length of a pack's sealed header, from its last [`TAIL_LEN`] bytes.
pub fn decode_tail(tail: &[u8], pack_len: u64) -> Result<u32, FormatError> {
    const WHAT: &str = "a pack's tail";
    if pack_len > MAX_PACK_BYTES {
        return Err(invalid(
            WHAT,
            format!("a pack of {pack_len} bytes (at most {MAX_PACK_BYTES})"),
        ));
    }
    if tail.len() != TAIL_LEN || &tail[4..] != TAIL_MAGIC {
        return Err(invalid(WHAT, "not a pack (no APK1 at its end)"));
    }
    let header_len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let fixed = (PACK_MAGIC.len() + TAIL_LEN) as u64;
    if (header_len as usize) < SEAL_OVERHEAD || u64::from(header_len) + fixed > pack_len {
        return Err(invalid(
            WHAT,
            format!("a header of {header_len} bytes in a pack of {pack_len}"),
        ));
    }
    Ok(header_len)
}

/// A pack's entries from its sealed header (the `header_len` bytes before
/// its tail), checked against the pack's length: in order, not
/// overlapping, between the magic and the header.
pub fn decode_header(keys: &Keys, sealed: &[u8], pack_len: u64) -> Result<Vec<Entry>, FormatError> {
    let header = keys.open("a pack's header", HEADER_AAD, sealed)?;
    decode_header_plain(&header, sealed.len(), pack_len)
}

/// A pack header's opened contents, `sealed_len` bytes sealed, checked
/// against the pack's length.
pub fn decode_header_plain(
    header: &[u8],
    sealed_len: usize,
    pack_len: u64,
) -> Result<Vec<Entry>, FormatError> {
    const WHAT: &str = "a pack's header";
    let mut c = Cursor::new(header, WHAT);
    let count = c.u32()?;
    if count > MAX_ENTRIES || (count as usize).checked_mul(ENTRY_LEN) != Some(c.remaining()) {
        return Err(invalid(
            WHAT,
            format!("{count} entries in {} bytes", c.remaining()),
        ));
    }
    let mut at = PACK_MAGIC.len() as u64;
    // The blobs lie between the magic and the header: a header that
    // leaves less room than the magic is not a pack's.
    let blobs_end = pack_len
        .checked_sub((sealed_len + TAIL_LEN) as u64)
        .filter(|&end| end >= at)
        .ok_or_else(|| invalid(WHAT, "longer than its pack"))?;
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let e = Entry::decode(&mut c, WHAT)?;
        if u64::from(e.offset) != at || e.end() > blobs_end {
            return Err(invalid(
                WHAT,
                format!(
                    "a blob at {}+{} where {at} was next",
                    e.offset, e.stored_len
                ),
            ));
        }
        at = e.end();
        entries.push(e);
    }
    c.finish()?;
    if at != blobs_end {
        return Err(invalid(
            WHAT,
            format!("{} bytes between its blobs and its header", blobs_end - at),
        ));
    }
    Ok(entries)
}

/// A whole pack's entries (its name checked by the caller).
pub fn decode_pack(keys: &Keys, pack: &[u8]) -> Result<Vec<Entry>, FormatError> {
    let len = pack.len() as u64;
    if pack.len() < PACK_MAGIC.len() + TAIL_LEN || &pack[..PACK_MAGIC.len()] != PACK_MAGIC {
        return Err(invalid("a pack", "not a pack (no ARBPACK1 at its start)"));
    }
    let header_len = decode_tail(&pack[pack.len() - TAIL_LEN..], len)? as usize;
    let start = pack.len() - TAIL_LEN - header_len;
    decode_header(keys, &pack[start..pack.len() - TAIL_LEN], len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Secret;

    fn keys() -> Keys {
        Keys::derive(&Secret::from_bytes([7; 32]), b"repo")
    }

    fn pack_of(keys: &Keys, blobs: &[Vec<u8>]) -> (ObjectId, Vec<u8>, Vec<Entry>) {
        let mut w = PackWriter::new();
        for b in blobs {
            let id = keys.blob_id(BlobKind::Data.code(), b);
            w.add(seal_blob(keys, id, BlobKind::Data, b));
        }
        w.finish(keys)
    }

    #[test]
    fn a_pack_lists_its_blobs_and_each_opens_to_its_content() {
        let keys = keys();
        let blobs = vec![
            vec![0u8; 65536],
            (0..70000u32).map(|i| (i * 7919) as u8).collect(),
            b"x".to_vec(),
        ];
        let (id, bytes, entries) = pack_of(&keys, &blobs);
        assert_eq!(id, ObjectId::of(&bytes));
        assert_eq!(decode_pack(&keys, &bytes).unwrap(), entries);
        assert_eq!(entries[0].encoding, Encoding::Zstd);
        assert!(entries[0].stored_len < 1000);
        for (e, b) in entries.iter().zip(&blobs) {
            let sealed = &bytes[e.offset as usize..e.end() as usize];
            assert_eq!(&open_blob(&keys, e, sealed).unwrap(), b);
        }
    }

    /// Found by fuzzing: a header with no entries whose pack is too short
    /// to hold the magic before it underflowed while naming the gap.
    #[test]
    fn a_header_leaving_no_room_for_the_magic_is_refused() {
        let no_entries = 0u32.to_le_bytes();
        for pack_len in 0..=(PACK_MAGIC.len() + TAIL_LEN + SEAL_OVERHEAD + 4 + 8) as u64 {
            let sealed_len = no_entries.len() + SEAL_OVERHEAD;
            let got = decode_header_plain(&no_entries, sealed_len, pack_len);
            let fits = pack_len == (PACK_MAGIC.len() + TAIL_LEN + sealed_len) as u64;
            assert_eq!(got.is_ok(), fits, "pack of {pack_len} bytes: {got:?}");
        }
    }

    #[test]
    fn damaged_moved_or_relabelled_blobs_do_not_open() {
        let keys = keys();
        let blobs = vec![b"first block".to_vec(), b"second block".to_vec()];
        let (_, bytes, entries) = pack_of(&keys, &blobs);
        let sealed = |e: &Entry| bytes[e.offset as usize..e.end() as usize].to_vec();
        // A flipped bit.
        let mut flipped = sealed(&entries[0]);
        flipped[30] ^= 4;
        assert!(open_blob(&keys, &entries[0], &flipped).is_err());
        // The other blob's bytes under this blob's entry.
        let mut swapped = entries[0];
        swapped.stored_len = entries[1].stored_len;
        assert!(open_blob(&keys, &swapped, &sealed(&entries[1])).is_err());
        // Relabelled as a map piece.
        let mut relabelled = entries[0];
        relabelled.kind = BlobKind::Map;
        assert!(open_blob(&keys, &relabelled, &sealed(&entries[0])).is_err());
        // Another repository's keys.
        let other = Keys::derive(&Secret::from_bytes([8; 32]), b"repo");
        assert!(open_blob(&other, &entries[0], &sealed(&entries[0])).is_err());
        // A damaged header or tail.
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 20] ^= 1;
        assert!(decode_pack(&keys, &bad).is_err());
        assert!(decode_pack(&keys, &bytes[..n - 1]).is_err());
        assert!(decode_pack(&keys, &bytes[1..]).is_err());
    }

    proptest::proptest! {
        /// Any bytes: an error or entries that lie inside the pack, never
        /// a panic.
        #[test]
        fn any_bytes_decode_to_an_error_or_entries_inside_the_pack(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
            cut in 0usize..400,
        ) {
            let keys = keys();
            let _ = decode_pack(&keys, &bytes);
            let (_, pack, _) = pack_of(&keys, std::slice::from_ref(&bytes));
            let cut = cut.min(pack.len());
            if let Ok(entries) = decode_pack(&keys, &pack[..cut]) {
                for e in entries {
                    proptest::prop_assert!(e.end() <= cut as u64);
                }
            }
        }
    }
}
