//! Packed mapping leaves (format version 6, tree-kind byte 5): the entries
//! of a mapping-tree leaf as variable-length records instead of 32 fixed
//! bytes each, so one 4 KiB leaf holds up to [`PACKED_LEAF_MAX`] extents
//! (docs/FORMAT.md §6.2).
//!
//! In memory a packed leaf is the same [`crate::Node`] as a fixed one:
//! `u64` keys and 56-byte values (`pchunk` u64, `len` u32, a u32 word, `gen`
//! u64, `base + 1` u64, then the middle layers: the [`crate::MapValue`]
//! layout). Only the bytes on disk differ. Every entry is
//!
//! * `head`: LEB128 of `gap << 2 | word_flag << 1 | len_flag`, where `gap`
//!   is the key minus the previous entry's key minus one (the first entry's
//!   gap is its key), `len_flag` says `len` is not 1 and `word_flag` that
//!   the word is not 0;
//! * `len` as LEB128, if `len_flag`;
//! * the word as LEB128, if `word_flag`;
//! * `pchunk` as LEB128;
//! * `gen` as LEB128;
//! * for a *partial* extent (format version 7, [`crate::Partial`]), `base`
//!   as LEB128. A partial is written with `len_flag` and a `len` of 0 (no
//!   other extent has length 0), and with `word_flag`: its word is its mask,
//!   never 0. In memory its `len` is 1;
//! * for a partial with middle layers (version 8), its word is written as
//!   `mask | layers << 32` (34 bits; a partial without layers writes its
//!   mask alone, as in version 7), and each layer follows `base`, newest
//!   first: its `chunk` and its mask (never 0) as LEB128s.
//!
//! An entry's size depends only on its own value and its key's distance
//! from the previous key. So taking entries out of a leaf never makes it
//! larger (a removed entry takes at least 3 bytes with it; the next gap grows
//! by at most one byte), and half of an overfull leaf always fits.
//!
//! Decoding accepts exactly one encoding of each leaf: shortest LEB128s,
//! flags only for values that need them, and zeros after the last entry.

use crate::records::RawMapValue;
use crate::{FormatError, BLOCK_SIZE};

/// Most entries one packed leaf holds. Dropping a leaf changes the data
/// space-map pages of its extents, at most two each: 448 extents stay
/// within 896 pages, so that one step fits the default journal (1024
/// pages) whatever the pool's size.
pub const PACKED_LEAF_MAX: usize = 448;

/// Value bytes of a mapping entry in memory (the [`crate::MapValue`] layout).
const VALUE_LEN: usize = crate::MapValue::ENCODED_LEN;
const LEN_FLAG: u128 = 1;
const WORD_FLAG: u128 = 2;
const FLAG_BITS: u32 = 2;
/// The fewest bytes an entry takes: head, pchunk and gen, one byte each.
pub const MIN_PACKED_ENTRY: usize = 3;
/// The most bytes an entry takes: a head of 66 bits, a u32, a word of 34
/// bits, three u64s (a partial's base the third) and two middle layers
/// (a u64 and a u32 each).
pub const MAX_PACKED_ENTRY: usize = 10 + 5 + 5 + 10 + 10 + 10 + 2 * (10 + 5);

/// Bits of a partial's word on disk: its 32-bit mask and its count of
/// middle layers above them.
const PARTIAL_WORD_BITS: u32 = 34;

/// The length an entry writes out: 0 marks a partial extent.
fn written_len(f: &RawMapValue) -> u32 {
    if f.base().is_some() {
        0
    } else {
        f.len
    }
}

/// The word an entry writes out: a partial's mask, with its count of
/// middle layers above its 32 bits.
fn written_word(f: &RawMapValue) -> u64 {
    u64::from(f.word) | (f.layers().count() as u64) << 32
}

/// Whether the in-memory value has middle layers (a version 8 partial):
/// its first layer's `chunk + 1` is not 0.
fn has_layers(value: &[u8]) -> bool {
    let at = RawMapValue::FIRST_LAYER_AT;
    let mut word = [0u8; 8];
    word.copy_from_slice(&value[at..at + 8]);
    u64::from_ne_bytes(word) != 0
}

/// The weight of the in-memory entries `values` against a leaf's entry
/// limit: one each, two for a partial with middle layers (its three or four
/// chunks take up to four data space-map pages when its leaf is shadowed or
/// freed, as two extents' runs do).
pub fn weight(values: &[u8]) -> usize {
    let layered = values
        .chunks_exact(VALUE_LEN)
        .filter(|v| has_layers(v))
        .count();
    values.len() / VALUE_LEN + layered
}

fn varint_len(v: u128) -> usize {
    let bits = (128 - v.leading_zeros()) as usize;
    bits.div_ceil(7).max(1)
}

fn put_varint(out: &mut [u8], at: &mut usize, mut v: u128) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[*at] = byte;
            *at += 1;
            return;
        }
        out[*at] = byte | 0x80;
        *at += 1;
    }
}

/// Reads a shortest LEB128 of at most `max_bits` bits from `body[*at..]`.
fn get_varint(body: &[u8], at: &mut usize, max_bits: u32) -> Result<u128, FormatError> {
    let mut v: u128 = 0;
    let mut shift = 0u32;
    loop {
        let Some(&byte) = body.get(*at) else {
            return Err(FormatError::Invalid(
                "packed leaf: an entry runs past the leaf's length".into(),
            ));
        };
        *at += 1;
        let part = u128::from(byte & 0x7f);
        if shift >= max_bits || (shift > 0 && part >> (max_bits - shift) != 0) {
            return Err(FormatError::Invalid(format!(
                "packed leaf: a number wider than {max_bits} bits"
            )));
        }
        v |= part << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            if byte == 0 && shift > 7 {
                return Err(FormatError::Invalid(
                    "packed leaf: a number not in its shortest form".into(),
                ));
            }
            return Ok(v);
        }
    }
}

/// The head of the entry `key` with `f`, after the entry keyed `prev`.
fn head(prev: Option<u64>, key: u64, f: &RawMapValue) -> u128 {
    // Keys are strictly increasing in a valid node; a node that breaks it
    // encodes a gap no reader accepts (the key overflows).
    let gap = match prev {
        None => key,
        Some(p) => key.wrapping_sub(p).wrapping_sub(1),
    };
    let mut head = u128::from(gap) << FLAG_BITS;
    if written_len(f) != 1 {
        head |= LEN_FLAG;
    }
    if written_word(f) != 0 {
        head |= WORD_FLAG;
    }
    head
}

/// Encoded bytes of the entry `key` → `value` after the entry keyed `prev`.
pub fn entry_len(prev: Option<u64>, key: u64, value: &[u8]) -> usize {
    let f = RawMapValue::read(value);
    let mut n = varint_len(head(prev, key, &f));
    if written_len(&f) != 1 {
        n += varint_len(u128::from(written_len(&f)));
    }
    if written_word(&f) != 0 {
        n += varint_len(u128::from(written_word(&f)));
    }
    if let Some(base) = f.base() {
        n += varint_len(u128::from(base));
    }
    for (chunk, mask) in f.layers() {
        n += varint_len(u128::from(chunk)) + varint_len(u128::from(mask));
    }
    n + varint_len(u128::from(f.pchunk)) + varint_len(u128::from(f.gen))
}

/// Encoded bytes of entries `keys` / `values` (in memory), the first
/// coming after the entry keyed `prev`.
pub fn entries_len(prev: Option<u64>, keys: &[u64], values: &[u8]) -> usize {
    let mut prev = prev;
    let mut n = 0;
    for (key, value) in keys.iter().zip(values.chunks_exact(VALUE_LEN)) {
        n += entry_len(prev, *key, value);
        prev = Some(*key);
    }
    n
}

/// Writes the entries into `out` (which must hold [`entries_len`] bytes);
/// returns the bytes written.
pub fn encode_entries(keys: &[u64], values: &[u8], out: &mut [u8]) -> usize {
    let mut at = 0;
    let mut prev = None;
    for (key, value) in keys.iter().zip(values.chunks_exact(VALUE_LEN)) {
        let f = RawMapValue::read(value);
        put_varint(out, &mut at, head(prev, *key, &f));
        if written_len(&f) != 1 {
            put_varint(out, &mut at, u128::from(written_len(&f)));
        }
        if written_word(&f) != 0 {
            put_varint(out, &mut at, u128::from(written_word(&f)));
        }
        put_varint(out, &mut at, u128::from(f.pchunk));
        put_varint(out, &mut at, u128::from(f.gen));
        if let Some(base) = f.base() {
            put_varint(out, &mut at, u128::from(base));
        }
        for (chunk, mask) in f.layers() {
            put_varint(out, &mut at, u128::from(chunk));
            put_varint(out, &mut at, u128::from(mask));
        }
        prev = Some(*key);
    }
    at
}

/// Decodes `count` entries that take exactly `body` (the leaf's length
/// field) into keys and in-memory values. `rest` is the block after the body:
/// it must be zeros.
pub fn decode_entries(
    body: &[u8],
    rest: &[u8],
    count: usize,
) -> Result<(Vec<u64>, Vec<u8>), FormatError> {
    if count > PACKED_LEAF_MAX {
        return Err(FormatError::Invalid(format!(
            "packed leaf of {count} entries (at most {PACKED_LEAF_MAX})"
        )));
    }
    let mut keys = Vec::with_capacity(count);
    let mut values = Vec::with_capacity(count * VALUE_LEN);
    let mut at = 0;
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let head = get_varint(body, &mut at, 64 + FLAG_BITS)?;
        // Fits: at most 66 bits, shifted down by 2.
        let gap = (head >> FLAG_BITS) as u64;
        let key = match prev {
            None => Some(gap),
            Some(p) => p.checked_add(1).and_then(|k| k.checked_add(gap)),
        }
        .ok_or_else(|| FormatError::Invalid("packed leaf: a key past 2^64".into()))?;
        let len = flagged(body, &mut at, head & LEN_FLAG != 0, 1, 32, "a length of 1")?;
        // A length of 0 marks a partial extent, whose word also counts its
        // middle layers.
        let word_bits = if len == 0 { PARTIAL_WORD_BITS } else { 32 };
        let word = flagged(
            body,
            &mut at,
            head & WORD_FLAG != 0,
            0,
            word_bits,
            "a zero word",
        )?;
        let pchunk = get_varint(body, &mut at, 64)? as u64;
        let gen = get_varint(body, &mut at, 64)? as u64;
        // A partial extent: one chunk, its mask in the word's low 32 bits
        // (never 0), its base after `gen`, then its middle layers.
        let mut mids = [(0u64, 0u32); crate::MAX_PARTIAL_MIDS];
        let (len, base_plus_one) = if len == 0 {
            if word as u32 == 0 {
                return Err(FormatError::Invalid(
                    "packed leaf: a partial extent without a mask".into(),
                ));
            }
            let layers = (word >> 32) as usize;
            if layers > crate::MAX_PARTIAL_MIDS {
                return Err(FormatError::Invalid(format!(
                    "packed leaf: a partial extent of {layers} middle layers"
                )));
            }
            let plus_one = |what: &str, v: u64| {
                v.checked_add(1).ok_or_else(|| {
                    FormatError::Invalid(format!(
                        "packed leaf: a partial extent's {what} past 2^64 - 2"
                    ))
                })
            };
            let base = plus_one("base", get_varint(body, &mut at, 64)? as u64)?;
            for mid in mids.iter_mut().take(layers) {
                let chunk = plus_one("layer", get_varint(body, &mut at, 64)? as u64)?;
                let mask = get_varint(body, &mut at, 32)? as u32;
                if mask == 0 {
                    return Err(FormatError::Invalid(
                        "packed leaf: a partial extent's layer without a mask".into(),
                    ));
                }
                *mid = (chunk, mask);
            }
            (1, base)
        } else {
            (len, 0)
        };
        keys.push(key);
        let mut value = [0u8; VALUE_LEN];
        RawMapValue {
            pchunk,
            // At most 32 bits each (`flagged` checks; a partial's word
            // keeps its mask, the layer count is in `mids`).
            len: len as u32,
            word: word as u32,
            gen,
            base_plus_one,
            mids,
        }
        .write(&mut value);
        values.extend_from_slice(&value);
        prev = Some(key);
    }
    let weight = weight(&values);
    if weight > PACKED_LEAF_MAX {
        return Err(FormatError::Invalid(format!(
            "packed leaf of weight {weight} (at most {PACKED_LEAF_MAX})"
        )));
    }
    if at != body.len() {
        return Err(FormatError::Invalid(format!(
            "packed leaf: {count} entries take {at} bytes, its length says {}",
            body.len()
        )));
    }
    if rest.iter().any(|&b| b != 0) {
        return Err(FormatError::Invalid(
            "packed leaf: bytes after its last entry".into(),
        ));
    }
    Ok((keys, values))
}

/// A field of at most `bits` bits written only when `present` (else
/// `default`); one written out with the default value is refused, so each
/// leaf has one encoding.
fn flagged(
    body: &[u8],
    at: &mut usize,
    present: bool,
    default: u64,
    bits: u32,
    what: &str,
) -> Result<u64, FormatError> {
    if !present {
        return Ok(default);
    }
    // At most `bits` bits, 34 or fewer (`get_varint` checks).
    let value = get_varint(body, at, bits)? as u64;
    if value == default {
        return Err(FormatError::Invalid(format!(
            "packed leaf: {what} written out"
        )));
    }
    Ok(value)
}

/// Where to split an overfull packed leaf: the first entry of the upper
/// half by bytes (each half then fits: it holds at most half the bytes plus
/// one entry, and its first key written whole).
pub fn split_point(keys: &[u64], values: &[u8]) -> usize {
    let total = entries_len(None, keys, values);
    let mut prev = None;
    let mut sum = 0;
    for (i, (key, value)) in keys.iter().zip(values.chunks_exact(VALUE_LEN)).enumerate() {
        sum += entry_len(prev, *key, value);
        prev = Some(*key);
        if sum * 2 >= total {
            // At least one entry on each side.
            return (i + 1).clamp(1, keys.len().saturating_sub(1).max(1));
        }
    }
    keys.len() / 2
}

const _: () = assert!(MIN_PACKED_ENTRY * PACKED_LEAF_MAX <= BLOCK_SIZE);
