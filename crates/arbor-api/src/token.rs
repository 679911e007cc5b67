//! The form of an API bearer token, `arbor_ID_SECRET` (docs/SECURITY.md §
//! Tokens): the daemon makes and verifies them, a client checks a token
//! file's content before sending it.

/// What every token starts with.
pub const PREFIX: &str = "arbor_";
/// Bytes of a token's ID (16 hex digits).
pub const ID_BYTES: usize = 8;
/// Bytes of a token's secret (64 hex digits).
pub const SECRET_BYTES: usize = 32;

/// The ID of a well-formed token: `arbor_` + 16 lower-case hex digits +
/// `_` + 64 lower-case hex digits.
pub fn parse(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix(PREFIX)?.split_once('_')?;
    let hex_of = |s: &str, bytes: usize| {
        s.len() == 2 * bytes && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (hex_of(id, ID_BYTES) && hex_of(secret, SECRET_BYTES)).then_some(id)
}

/// Whether `text` looks like a token (for clients reading a token file).
pub fn well_formed(text: &str) -> bool {
    parse(text).is_some()
}
