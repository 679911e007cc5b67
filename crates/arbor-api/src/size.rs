//! Byte sizes as people write them (`512`, `4K`, `64KiB`, `10M`, `1.5T`)
//! and as tables show them (`1.5 GiB`). Every multiple is binary.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A size in bytes, parsed from a number with an optional binary unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

/// Unit letters in increasing powers of 1024, starting at KiB.
const UNITS: [char; 6] = ['K', 'M', 'G', 'T', 'P', 'E'];

/// Bytes per unit: `B` (or nothing), `K`/`KiB`, `M`/`MiB`, ... `E`/`EiB`,
/// case-insensitive.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let upper = unit.to_ascii_uppercase();
    if upper.is_empty() || upper == "B" {
        return Some(1);
    }
    let letter = upper.strip_suffix("IB").unwrap_or(&upper);
    let mut chars = letter.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return None;
    };
    let power = UNITS.iter().position(|&u| u == c)?;
    Some(1u64 << (10 * (power + 1)))
}

/// Most fractional digits accepted (`1.125G`); more is a typo, not a size.
const MAX_FRACTION_DIGITS: u32 = 9;

impl FromStr for ByteSize {
    type Err = String;

    /// A whole or decimal number with an optional binary unit: `512`, `4K`,
    /// `1.5T`. A decimal must come to a whole number of bytes.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let number_end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let fraction_digits = u32::try_from(fraction.len()).unwrap_or(u32::MAX);
        if whole.is_empty()
            || fraction.contains('.')
            || (number.contains('.') && fraction.is_empty())
            || fraction_digits > MAX_FRACTION_DIGITS
        {
            return Err(format!(
                "invalid size {text:?}: expected a number with an optional unit, like 512, 64K, 10GiB or 1.5T"
            ));
        }
        let multiplier = unit_multiplier(unit.trim_start()).ok_or_else(|| {
            format!("invalid size {text:?}: unknown unit {unit:?} (use K, M, G, T, P or E, optionally followed by iB)")
        })?;
        let too_large = || format!("invalid size {text:?}: too large");
        // Exact arithmetic in u128: digits (at most 20 + 9) times a 2^60
        // multiplier cannot overflow it.
        let scale = 10u128.pow(fraction_digits);
        let digits: u128 = format!("{whole}{fraction}")
            .parse()
            .map_err(|_| too_large())?;
        let scaled = digits
            .checked_mul(u128::from(multiplier))
            .ok_or_else(too_large)?;
        if scaled % scale != 0 {
            return Err(format!(
                "invalid size {text:?}: not a whole number of bytes"
            ));
        }
        u64::try_from(scaled / scale)
            .map(ByteSize)
            .map_err(|_| too_large())
    }
}

impl fmt::Display for ByteSize {
    /// Binary units with one decimal where the value is not a whole number of them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        let Some(power) = (1..=UNITS.len()).rev().find(|&p| bytes >= 1u64 << (10 * p)) else {
            return write!(f, "{bytes} B");
        };
        let unit = 1u64 << (10 * power);
        let letter = UNITS[power - 1];
        if bytes.is_multiple_of(unit) {
            write!(f, "{} {letter}iB", bytes / unit)
        } else {
            // f64 is exact enough for one decimal of display.
            write!(f, "{:.1} {letter}iB", bytes as f64 / unit as f64)
        }
    }
}

/// In JSON a size is either a number of bytes or a string such as `"10G"`.
impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes or a string such as \"10G\"")
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                // TOML integers are signed.
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }

            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                text.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// In JSON a size is always written as a number of bytes.
impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<u64, String> {
        text.parse::<ByteSize>().map(|s| s.0)
    }

    #[test]
    fn parses_plain_numbers_and_binary_units() {
        assert_eq!(parse("512"), Ok(512));
        assert_eq!(parse("512B"), Ok(512));
        assert_eq!(parse("4K"), Ok(4096));
        assert_eq!(parse("4k"), Ok(4096));
        assert_eq!(parse("64KiB"), Ok(64 << 10));
        assert_eq!(parse("10M"), Ok(10 << 20));
        assert_eq!(parse("1G"), Ok(1 << 30));
        assert_eq!(parse("1 GiB"), Ok(1 << 30));
        assert_eq!(parse("2T"), Ok(2 << 40));
        assert_eq!(parse("8E"), Ok(8 << 60));
    }

    #[test]
    fn parses_decimals_that_come_to_whole_bytes() {
        assert_eq!(parse("1.5T"), Ok(3 << 39));
        assert_eq!(parse("0.5K"), Ok(512));
        assert_eq!(parse("2.25 GiB"), Ok(9 << 28));
        assert_eq!(parse("1.0"), Ok(1));
        assert!(parse("1.3K").unwrap_err().contains("whole number of bytes"));
        assert!(parse("16.5E").unwrap_err().contains("too large"));
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in [
            "",
            "G",
            "-1",
            "1.5.5G",
            ".5G",
            "1.G",
            "1.0000000001G",
            "10X",
            "10KB",
            "10 K B",
            "1Gi",
            "16E",
            "99999999999999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert!(parse("16E").unwrap_err().contains("too large"));
        assert!(parse("10X").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn displays_human_sizes() {
        assert_eq!(ByteSize(0).to_string(), "0 B");
        assert_eq!(ByteSize(512).to_string(), "512 B");
        assert_eq!(ByteSize(64 << 10).to_string(), "64 KiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(ByteSize(u64::MAX).to_string(), "16.0 EiB");
    }

    #[test]
    fn deserializes_numbers_and_strings() {
        let n: ByteSize = serde_json::from_str("4096").unwrap();
        let s: ByteSize = serde_json::from_str("\"4K\"").unwrap();
        assert_eq!(n, s);
        assert!(serde_json::from_str::<ByteSize>("\"4Q\"").is_err());
        assert!(serde_json::from_str::<ByteSize>("-1").is_err());
    }
}
