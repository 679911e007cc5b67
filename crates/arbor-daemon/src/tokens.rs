//! API bearer tokens (docs/SECURITY.md § Tokens): made here, shown once,
//! stored only as SHA-256 hashes in `DATA_DIR/tokens.json` (mode 0600,
//! replaced atomically on every change).
//!
//! A token is `arbor_ID_SECRET`: ID is 16 hex digits that name the record
//! (public: it shows in `token list` and logs), SECRET 64 hex digits (256
//! bits from the operating system's CSPRNG). The file keeps the SHA-256 of
//! the whole token. A secret this long needs no salt or slow hash: nobody
//! can guess it, so a stolen file gives nothing to try offline; the hash
//! keeps the file from being a list of working credentials. Verification
//! finds the record by ID and compares the hashes in constant time.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rand::RngCore;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use arbor_api::model::{Scope, TokenView};
#[cfg(test)]
use arbor_api::token::well_formed;
use arbor_api::token::{parse, ID_BYTES, PREFIX, SECRET_BYTES};

/// The token file's version.
const VERSION: u32 = 1;
/// Most tokens kept: a few per person or program is the use.
pub const MAX_TOKENS: usize = 1024;
/// The largest token file read (1024 records take about 300 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Longest token name.
const MAX_NAME: usize = 64;
/// Longest life a token can be given: 100 years.
pub const MAX_EXPIRY_SECS: u64 = 100 * 365 * 86_400;
/// How often a token's last use is saved to the file, at most.
const LAST_USED_SAVE_SECS: u64 = 3600;

/// Why a token management request is refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("a token named {0} exists; revoke it first, or choose another name")]
    AlreadyExists(String),
    #[error("no token named {0} (arbor token list shows them)")]
    NotFound(String),
    #[error("the daemon keeps at most {MAX_TOKENS} tokens; revoke unused ones first")]
    Full,
    #[error("cannot save the tokens in {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why a presented token does not authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Not of the form `arbor_ID_SECRET`.
    Malformed,
    /// No such token: never made, revoked, or a wrong secret.
    Unknown,
    /// The token named here has expired.
    Expired(String),
}

/// A token that authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub name: String,
    pub id: String,
    pub scope: Scope,
    /// A last-use time waits to be saved: call [`TokenStore::save`] (off
    /// the async workers).
    pub save_due: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    name: String,
    id: String,
    /// Hex SHA-256 of the whole token.
    sha256: String,
    scope: Scope,
    created_unix_secs: u64,
    #[serde(default)]
    expires_unix_secs: Option<u64>,
    #[serde(default)]
    last_used_unix_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    tokens: Vec<Record>,
}

#[derive(Debug, Clone)]
struct State {
    file: File,
    /// The records' hashes, decoded, in the records' order.
    hashes: Vec<[u8; 32]>,
    /// A last use not saved yet.
    dirty: bool,
    /// When the file was last written (Unix seconds).
    saved_at: u64,
}

/// The daemon's tokens: the file, loaded, and every change written through.
pub struct TokenStore {
    path: PathBuf,
    state: Mutex<State>,
}

impl TokenStore {
    /// Loads `path`; a missing file is no tokens. A damaged file, one of
    /// another version or with too many tokens is an error: the daemon
    /// must not start with fewer tokens revoked than its owner thinks.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(Self::read(path)?),
        })
    }

    /// Reads the file again (a reload: its owner restored or edited it),
    /// in place of what was loaded; last uses not saved yet are lost. A
    /// file that cannot be used changes nothing. How many tokens it holds.
    pub fn reread(&self) -> anyhow::Result<usize> {
        let mut state = self.lock();
        let read = Self::read(&self.path)?;
        let count = read.file.tokens.len();
        *state = read;
        Ok(count)
    }

    /// How many tokens are loaded.
    pub fn count(&self) -> usize {
        self.lock().file.tokens.len()
    }

    /// Whether the file can be read again ([`TokenStore::reread`]): what a
    /// reload checks before it changes anything.
    pub fn check(&self) -> anyhow::Result<()> {
        Self::read(&self.path).map(|_| ())
    }

    fn read(path: &Path) -> anyhow::Result<State> {
        let bytes = arbor_io::small_file::read_bounded(path, MAX_FILE_BYTES).map_err(|e| {
            anyhow::anyhow!("cannot read the API tokens in {}: {e}", path.display())
        })?;
        let file = match bytes {
            None => File {
                version: VERSION,
                tokens: Vec::new(),
            },
            Some(bytes) => parse_file(&bytes)
                .map_err(|e| anyhow::anyhow!("the API tokens in {} are damaged: {e}; restore the file, or move it away and make new tokens", path.display()))?,
        };
        let hashes = file
            .tokens
            .iter()
            .map(|r| decode_hash(&r.sha256))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the API tokens in {} are damaged: a sha256 is not 64 hex digits",
                    path.display()
                )
            })?;
        Ok(State {
            file,
            hashes,
            dirty: false,
            saved_at: 0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Changes are made on a copy and stored before they replace the
        // state, so a panic elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change` to a copy, writes it durably, then keeps it: a
    /// failed write changes nothing, and a revoked token stops working
    /// only once its revocation is on disk.
    fn change<T>(
        &self,
        now: u64,
        change: impl FnOnce(&mut State) -> Result<T, TokenError>,
    ) -> Result<T, TokenError> {
        let mut state = self.lock();
        let mut next = state.clone();
        let out = change(&mut next)?;
        self.write(&next.file)?;
        next.dirty = false;
        next.saved_at = now;
        *state = next;
        Ok(out)
    }

    fn write(&self, file: &File) -> Result<(), TokenError> {
        let io = |source| TokenError::Io {
            path: self.path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(file).map_err(|e| io(std::io::Error::other(e)))?;
        arbor_io::small_file::replace_atomically(&self.path, &text, 0o600).map_err(io)
    }

    /// Makes a token; returns its record and the token itself, which is
    /// not kept anywhere: this is the one time anybody sees it.
    pub fn create(
        &self,
        name: &str,
        scope: Scope,
        expires_in_secs: Option<u64>,
        now: u64,
    ) -> Result<(TokenView, String), TokenError> {
        check_name(name)?;
        let expires = match expires_in_secs {
            None => None,
            Some(0) => {
                return Err(TokenError::InvalidArgument(
                    "a token's life must be longer than 0 seconds".into(),
                ))
            }
            Some(secs) if secs > MAX_EXPIRY_SECS => {
                return Err(TokenError::InvalidArgument(format!(
                    "a token's life is at most 100 years ({MAX_EXPIRY_SECS} seconds); \
                     leave the expiry out for a token that never expires"
                )))
            }
            Some(secs) => Some(now.saturating_add(secs)),
        };
        let (id, token) = new_token();
        self.change(now, |state| {
            if state.file.tokens.iter().any(|r| r.name == name) {
                return Err(TokenError::AlreadyExists(name.to_owned()));
            }
            if state.file.tokens.len() >= MAX_TOKENS {
                return Err(TokenError::Full);
            }
            let hash = sha256(&token);
            let record = Record {
                name: name.to_owned(),
                id: id.clone(),
                sha256: hex(&hash),
                scope,
                created_unix_secs: now,
                expires_unix_secs: expires,
                last_used_unix_secs: None,
            };
            let view = view_of(&record, now);
            state.file.tokens.push(record);
            state.hashes.push(hash);
            Ok(view)
        })
        .map(|view| (view, token))
    }

    /// Every token, oldest first.
    pub fn list(&self, now: u64) -> Vec<TokenView> {
        let state = self.lock();
        state.file.tokens.iter().map(|r| view_of(r, now)).collect()
    }

    /// Removes the token `name`: it stops working at once.
    pub fn revoke(&self, name: &str, now: u64) -> Result<TokenView, TokenError> {
        self.change(now, |state| {
            let at = state
                .file
                .tokens
                .iter()
                .position(|r| r.name == name)
                .ok_or_else(|| TokenError::NotFound(name.to_owned()))?;
            state.hashes.remove(at);
            Ok(view_of(&state.file.tokens.remove(at), now))
        })
    }

    /// Checks a presented token and notes its use.
    pub fn verify(&self, token: &str, now: u64) -> Result<Verified, Rejected> {
        let id = parse(token).ok_or(Rejected::Malformed)?;
        let presented = sha256(token);
        let mut state = self.lock();
        let at = state
            .file
            .tokens
            .iter()
            .position(|r| r.id == id)
            .ok_or(Rejected::Unknown)?;
        // The ID is public; the secret is compared through its hash, in
        // constant time.
        if !bool::from(state.hashes[at].ct_eq(&presented)) {
            return Err(Rejected::Unknown);
        }
        let record = &mut state.file.tokens[at];
        if record.expires_unix_secs.is_some_and(|e| now >= e) {
            return Err(Rejected::Expired(record.name.clone()));
        }
        record.last_used_unix_secs = Some(now);
        let verified = Verified {
            name: record.name.clone(),
            id: record.id.clone(),
            scope: record.scope,
            save_due: false,
        };
        state.dirty = true;
        let save_due = now.saturating_sub(state.saved_at) >= LAST_USED_SAVE_SECS;
        Ok(Verified {
            save_due,
            ..verified
        })
    }

    /// Saves the tokens' last uses, if any is new.
    pub fn save(&self, now: u64) -> Result<(), TokenError> {
        let mut state = self.lock();
        if !state.dirty {
            return Ok(());
        }
        self.write(&state.file)?;
        state.dirty = false;
        state.saved_at = now;
        Ok(())
    }
}

fn parse_file(bytes: &[u8]) -> Result<File, String> {
    let file: File = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!(
            "version {}; this build reads version {VERSION}",
            file.version
        ));
    }
    if file.tokens.len() > MAX_TOKENS {
        return Err(format!("more than {MAX_TOKENS} tokens"));
    }
    Ok(file)
}

fn view_of(r: &Record, now: u64) -> TokenView {
    TokenView {
        name: r.name.clone(),
        id: r.id.clone(),
        scope: r.scope,
        created_unix_secs: r.created_unix_secs,
        expires_unix_secs: r.expires_unix_secs,
        expired: r.expires_unix_secs.is_some_and(|e| now >= e),
        last_used_unix_secs: r.last_used_unix_secs,
    }
}

/// Token names: 1 to 64 letters, digits, `.`, `_`, `-`, starting with a
/// letter or digit (they appear in URLs, logs and tables as they are).
fn check_name(name: &str) -> Result<(), TokenError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::InvalidName(format!(
            "invalid token name {name:?}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-', \
             starting with a letter or digit"
        )))
    }
}

/// A new token and its ID, from the operating system's CSPRNG.
fn new_token() -> (String, String) {
    let mut id = [0u8; ID_BYTES];
    let mut secret = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut id);
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let id = hex(&id);
    let token = format!("{PREFIX}{id}_{}", hex(&secret));
    (id, token)
}

fn sha256(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn store() -> (tempfile::TempDir, TokenStore, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        let store = TokenStore::open(&path).unwrap();
        (dir, store, path)
    }

    #[test]
    fn a_token_verifies_and_the_file_keeps_only_its_hash() {
        let (_dir, store, path) = store();
        let (view, token) = store.create("ci", Scope::Read, None, NOW).unwrap();
        assert!(well_formed(&token), "{token}");
        assert_eq!(token.len(), PREFIX.len() + 16 + 1 + 64);
        assert!(token.contains(&view.id));
        let verified = store.verify(&token, NOW + 1).unwrap();
        assert_eq!(
            (verified.name.as_str(), verified.scope),
            ("ci", Scope::Read)
        );

        let text = std::fs::read_to_string(&path).unwrap();
        let secret = token.rsplit('_').next().unwrap();
        assert!(!text.contains(secret), "the secret is not stored: {text}");
        assert!(text.contains(&hex(&sha256(&token))), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        // A reopened store knows the token.
        let again = TokenStore::open(&path).unwrap();
        assert_eq!(again.verify(&token, NOW + 2).unwrap().name, "ci");
        assert_eq!(again.list(NOW).len(), 1);
    }

    #[test]
    fn wrong_secrets_unknown_ids_and_malformed_tokens_are_refused() {
        let (_dir, store, _) = store();
        let (_, token) = store.create("ci", Scope::Admin, None, NOW).unwrap();
        // One hex digit of the secret changed.
        let mut wrong = token.clone().into_bytes();
        let last = wrong.len() - 1;
        wrong[last] = if wrong[last] == b'0' { b'1' } else { b'0' };
        let wrong = String::from_utf8(wrong).unwrap();
        assert_eq!(store.verify(&wrong, NOW), Err(Rejected::Unknown));
        let (_, other) = new_token();
        assert_eq!(store.verify(&other, NOW), Err(Rejected::Unknown));
        for bad in [
            "",
            "arbor_",
            "hello",
            &token[..token.len() - 1],
            &format!("{token}0"),
            &token.to_uppercase(),
            &token.replacen("arbor_", "arbor-", 1),
            &format!(" {token}"),
        ] {
            assert_eq!(store.verify(bad, NOW), Err(Rejected::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn tokens_expire_and_revoked_tokens_stop_at_once() {
        let (_dir, store, path) = store();
        let (view, short) = store.create("short", Scope::Admin, Some(60), NOW).unwrap();
        assert_eq!(view.expires_unix_secs, Some(NOW + 60));
        assert!(store.verify(&short, NOW + 59).is_ok());
        assert_eq!(
            store.verify(&short, NOW + 60),
            Err(Rejected::Expired("short".into()))
        );
        assert!(store.list(NOW + 60)[0].expired);

        let (_, long) = store.create("long", Scope::Admin, None, NOW).unwrap();
        store.revoke("long", NOW).unwrap();
        assert_eq!(store.verify(&long, NOW), Err(Rejected::Unknown));
        assert_eq!(
            TokenStore::open(&path).unwrap().verify(&long, NOW),
            Err(Rejected::Unknown)
        );
        assert!(matches!(
            store.revoke("long", NOW),
            Err(TokenError::NotFound(_))
        ));
        // The name is free again, for a new secret.
        let (_, again) = store.create("long", Scope::Read, None, NOW).unwrap();
        assert_ne!(again, long);
    }

    #[test]
    fn names_expiries_duplicates_and_the_limit_are_checked() {
        let (_dir, store, _) = store();
        for bad in ["", "-x", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(
                matches!(
                    store.create(bad, Scope::Read, None, NOW),
                    Err(TokenError::InvalidName(_))
                ),
                "{bad:?}"
            );
        }
        store
            .create(&"x".repeat(64), Scope::Read, None, NOW)
            .unwrap();
        assert!(matches!(
            store.create("t", Scope::Read, Some(0), NOW),
            Err(TokenError::InvalidArgument(_))
        ));
        assert!(matches!(
            store.create("t", Scope::Read, Some(MAX_EXPIRY_SECS + 1), NOW),
            Err(TokenError::InvalidArgument(_))
        ));
        store.create("t", Scope::Read, None, NOW).unwrap();
        assert!(matches!(
            store.create("t", Scope::Admin, None, NOW),
            Err(TokenError::AlreadyExists(_))
        ));
        for i in store.list(NOW).len()..MAX_TOKENS {
            store
                .create(&format!("n{i}"), Scope::Read, None, NOW)
                .unwrap();
        }
        assert!(matches!(
            store.create("one-more", Scope::Read, None, NOW),
            Err(TokenError::Full)
        ));
    }

    #[test]
    fn a_full_store_fits_the_file_bound_and_damage_stops_the_load() {
        let (dir, store, path) = store();
        let ids: Vec<String> = (0..MAX_TOKENS)
            .map(|i| format!("{}-{i}", "n".repeat(MAX_NAME - 6)))
            .collect();
        for name in &ids {
            store
                .create(name, Scope::Admin, Some(MAX_EXPIRY_SECS), NOW)
                .unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() < MAX_FILE_BYTES);
        assert_eq!(TokenStore::open(&path).unwrap().list(NOW).len(), MAX_TOKENS);

        let damaged = dir.path().join("damaged.json");
        for (text, expected) in [
            ("{\"version\": 1, \"tokens\": [", "damaged"),
            ("{\"version\": 2, \"tokens\": []}", "version 2"),
            (
                "{\"version\": 1, \"tokens\": [{\"name\": \"a\", \"id\": \"00\", \
                 \"sha256\": \"zz\", \"scope\": \"read\", \"created_unix_secs\": 1}]}",
                "64 hex digits",
            ),
            (
                "{\"version\": 1, \"tokens\": [{\"name\": \"a\", \"id\": \"00\", \
                 \"sha256\": \"00\", \"scope\": \"root\", \"created_unix_secs\": 1}]}",
                "unknown variant",
            ),
        ] {
            std::fs::write(&damaged, text).unwrap();
            let err = TokenStore::open(&damaged).err().expect("refused");
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
        let mut big = b"{\"version\": 1, \"tokens\": []}".to_vec();
        big.resize(MAX_FILE_BYTES as usize + 1, b' ');
        std::fs::write(&damaged, big).unwrap();
        let err = TokenStore::open(&damaged).err().expect("refused");
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let (dir, store, path) = store();
        let (_, kept) = store.create("kept", Scope::Admin, None, NOW).unwrap();
        // The temporary file's name is taken by a directory: writes fail.
        std::fs::create_dir(dir.path().join("tokens.json.tmp")).unwrap();
        assert!(matches!(
            store.create("new", Scope::Admin, None, NOW),
            Err(TokenError::Io { .. })
        ));
        assert!(matches!(
            store.revoke("kept", NOW),
            Err(TokenError::Io { .. })
        ));
        assert_eq!(store.list(NOW).len(), 1);
        assert!(store.verify(&kept, NOW).is_ok(), "not revoked in memory");
        assert!(TokenStore::open(&path).unwrap().verify(&kept, NOW).is_ok());
    }

    #[test]
    fn last_use_is_saved_at_most_hourly() {
        let (_dir, store, path) = store();
        let (_, token) = store.create("ci", Scope::Read, None, NOW).unwrap();
        // Just written (by the create): no save due for an hour.
        assert!(!store.verify(&token, NOW + 10).unwrap().save_due);
        assert_eq!(store.list(NOW)[0].last_used_unix_secs, Some(NOW + 10));
        let later = NOW + LAST_USED_SAVE_SECS;
        assert!(store.verify(&token, later).unwrap().save_due);
        store.save(later).unwrap();
        assert!(!store.verify(&token, later + 1).unwrap().save_due);
        let reopened = TokenStore::open(&path).unwrap();
        assert_eq!(reopened.list(NOW)[0].last_used_unix_secs, Some(later));
    }

    #[test]
    fn hex_round_trips() {
        let hash = sha256("x");
        assert_eq!(decode_hash(&hex(&hash)), Some(hash));
        assert_eq!(
            hex(&sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(decode_hash("é".repeat(32).as_str()), None);
    }
}
