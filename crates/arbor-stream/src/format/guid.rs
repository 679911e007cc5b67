//! Snapshot identities.

use std::fmt;
use std::str::FromStr;

use super::error::StreamError;

/// A snapshot's identity: 16 bytes the engine gives it at creation and that
/// send and receive keep, so that an incremental stream's base is found by
/// what it is, not by its name. Shown as 32 lowercase hex digits. All zeros
/// means "none" and is never a valid identity in a stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Guid(pub [u8; 16]);

impl Guid {
    /// The all-zero value ("no identity").
    pub const ZERO: Guid = Guid([0; 16]);

    /// Whether this is the all-zero value.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl From<[u8; 16]> for Guid {
    fn from(bytes: [u8; 16]) -> Self {
        Guid(bytes)
    }
}

impl From<Guid> for [u8; 16] {
    fn from(guid: Guid) -> Self {
        guid.0
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

impl FromStr for Guid {
    type Err = StreamError;

    /// Parses 32 hex digits (either case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| StreamError::BadGuid {
            reason: format!("{s:?} {reason}"),
        };
        if s.len() != 32 {
            return Err(bad("is not 32 hex digits"));
        }
        let mut out = [0u8; 16];
        super::wire::hex_decode(s.as_bytes(), &mut out)
            .ok_or_else(|| bad("has a character that is not a hex digit"))?;
        Ok(Guid(out))
    }
}
