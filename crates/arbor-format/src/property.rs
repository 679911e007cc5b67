//! A property's value as it is stored in its record's data (docs/FORMAT.md
//! §6, "Property"): a 16-byte header, then the value, padded with zeros to
//! a multiple of 512 bytes.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `APRP` |
//! | 4 | 2 | layout version (1) |
//! | 6 | 2 | reserved (0) |
//! | 8 | 4 | value length in bytes (≤ [`MAX_PROPERTY_BYTES`]) |
//! | 12 | 4 | crc32c of the value |
//! | 16 | len | the value |

use crate::FormatError;

/// Magic at the start of a stored property value.
pub const PROPERTY_MAGIC: [u8; 4] = *b"APRP";
/// The stored value's layout version.
pub const PROPERTY_LAYOUT_VERSION: u16 = 1;
/// Bytes before the value.
pub const PROPERTY_HEADER_LEN: usize = 16;
/// Longest property value, in bytes.
pub const MAX_PROPERTY_BYTES: usize = 64 * 1024;

/// The bytes a property record holds for `value` (a multiple of 512 long),
/// or an error if the value is too long.
pub fn encode_property(value: &[u8]) -> Result<Vec<u8>, FormatError> {
    if value.len() > MAX_PROPERTY_BYTES {
        return Err(FormatError::Invalid(format!(
            "property value of {} bytes (at most {MAX_PROPERTY_BYTES})",
            value.len()
        )));
    }
    let stored = (PROPERTY_HEADER_LEN + value.len()).div_ceil(512) * 512;
    let mut out = vec![0u8; stored];
    out[0..4].copy_from_slice(&PROPERTY_MAGIC);
    out[4..6].copy_from_slice(&PROPERTY_LAYOUT_VERSION.to_le_bytes());
    // The length fits: it is at most MAX_PROPERTY_BYTES.
    out[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    out[12..16].copy_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out[PROPERTY_HEADER_LEN..PROPERTY_HEADER_LEN + value.len()].copy_from_slice(value);
    Ok(out)
}

/// The value in a property record's bytes, verified.
pub fn decode_property(stored: &[u8]) -> Result<&[u8], FormatError> {
    if stored.len() < PROPERTY_HEADER_LEN {
        return Err(FormatError::Invalid(format!(
            "property of {} bytes",
            stored.len()
        )));
    }
    if stored[0..4] != PROPERTY_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let version = u16::from_le_bytes([stored[4], stored[5]]);
    if version != PROPERTY_LAYOUT_VERSION {
        return Err(FormatError::Invalid(format!(
            "property layout version {version}"
        )));
    }
    let len = u32::from_le_bytes([stored[8], stored[9], stored[10], stored[11]]) as usize;
    let end = PROPERTY_HEADER_LEN
        .checked_add(len)
        .filter(|&end| len <= MAX_PROPERTY_BYTES && end <= stored.len())
        .ok_or_else(|| {
            FormatError::Invalid(format!(
                "property value of {len} bytes in a record of {}",
                stored.len()
            ))
        })?;
    let value = &stored[PROPERTY_HEADER_LEN..end];
    let stored_crc = u32::from_le_bytes([stored[12], stored[13], stored[14], stored[15]]);
    let computed = crc32c::crc32c(value);
    if stored_crc != computed {
        return Err(FormatError::BadChecksum {
            stored: stored_crc,
            computed,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_limits() {
        for len in [0usize, 1, 496, 497, MAX_PROPERTY_BYTES] {
            let value: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let stored = encode_property(&value).unwrap();
            assert_eq!(stored.len() % 512, 0);
            assert_eq!(decode_property(&stored).unwrap(), &value[..]);
        }
        assert!(encode_property(&vec![0; MAX_PROPERTY_BYTES + 1]).is_err());
    }

    #[test]
    fn damage_is_an_error() {
        let stored = encode_property(b"policy").unwrap();
        for at in [0usize, 4, 8, 12, 16] {
            let mut bad = stored.clone();
            bad[at] ^= 1;
            assert!(decode_property(&bad).is_err(), "byte {at}");
        }
        assert!(decode_property(&[0; 512]).is_err());
        assert!(decode_property(&stored[..10]).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_property(&bytes);
        }
    }
}
