//! The repository's config object (docs/BACKUP.md, "The config object"):
//! plain JSON that says what the repository is (format, version, id, block
//! size), how its key-encryption key is derived, and its master key sealed
//! under that key, bound to everything else in the object.

use serde::{Deserialize, Serialize};

use crate::crypto::{self, CryptoError, Secret};
use crate::format::{invalid, FormatError, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, REPO_VERSION};

pub const FORMAT_NAME: &str = "arbor-backup";
/// The largest config object a reader accepts.
pub const MAX_CONFIG_BYTES: u64 = 64 << 10;

/// How the key-encryption key is derived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Kdf {
    /// HKDF-SHA256 of a key file's contents.
    KeyFile { salt: String },
    /// Argon2id of a passphrase.
    Argon2id {
        salt: String,
        memory_kib: u32,
        passes: u32,
        lanes: u32,
    },
}

/// Where the key-encryption key comes from.
pub enum KeySource<'a> {
    KeyFile(&'a [u8]),
    Passphrase(&'a [u8]),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    pub format: String,
    pub version: u32,
    /// 32 hex digits, random at init.
    pub id: String,
    pub block_size: u32,
    pub kdf: Kdf,
    /// The master key sealed under the key-encryption key (hex).
    pub master_key: String,
}

impl RepoConfig {
    /// A new repository's config with a new random id and master key.
    /// Returns the master key too.
    pub fn new(
        block_size: u32,
        source: &KeySource<'_>,
    ) -> Result<(RepoConfig, Secret), FormatError> {
        let id = hex::encode(&Secret::random().expose()[..16]);
        let salt = hex::encode(&Secret::random().expose()[..16]);
        let kdf = match source {
            KeySource::KeyFile(_) => Kdf::KeyFile { salt },
            KeySource::Passphrase(_) => Kdf::Argon2id {
                salt,
                memory_kib: crypto::ARGON2_MEMORY_KIB,
                passes: crypto::ARGON2_PASSES,
                lanes: crypto::ARGON2_LANES,
            },
        };
        let mut config = RepoConfig {
            format: FORMAT_NAME.into(),
            version: REPO_VERSION,
            id,
            block_size,
            kdf,
            master_key: String::new(),
        };
        config.validate()?;
        let master = Secret::random();
        let kek = config.kek(source)?;
        config.master_key = hex::encode(crypto::wrap(&kek, &master, &config.aad()));
        Ok((config, master))
    }

    /// What the master key's seal is bound to: every field but the sealed
    /// key itself.
    fn aad(&self) -> Vec<u8> {
        let bound = RepoConfig {
            master_key: String::new(),
            ..self.clone()
        };
        // Plain data with string keys.
        #[allow(clippy::expect_used)]
        let aad = serde_json::to_vec(&bound).expect("a config serializes");
        aad
    }

    fn kek(&self, source: &KeySource<'_>) -> Result<Secret, FormatError> {
        let wrong = || {
            FormatError::Crypto(CryptoError::Kdf(
                "this repository's key is a key file, not a passphrase (or the other way round)"
                    .into(),
            ))
        };
        match (&self.kdf, source) {
            (Kdf::KeyFile { salt }, KeySource::KeyFile(contents)) => {
                Ok(crypto::kek_from_key_file(contents, salt.as_bytes()))
            }
            (
                Kdf::Argon2id {
                    salt,
                    memory_kib,
                    passes,
                    lanes,
                },
                KeySource::Passphrase(p),
            ) => Ok(crypto::kek_from_passphrase(
                p,
                salt.as_bytes(),
                *memory_kib,
                *passes,
                *lanes,
            )?),
            _ => Err(wrong()),
        }
    }

    /// The master key, with the user's key.
    pub fn unlock(&self, source: &KeySource<'_>) -> Result<Secret, FormatError> {
        let wrapped = hex::decode(&self.master_key)
            .map_err(|_| invalid("the repository config", "its master_key is not hex"))?;
        let kek = self.kek(source)?;
        crypto::unwrap(&kek, &wrapped, &self.aad()).map_err(|_| {
            FormatError::Crypto(CryptoError::NotAuthentic(
                "the repository key (wrong key file or passphrase?)",
            ))
        })
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "the repository config";
        if self.format != FORMAT_NAME {
            return Err(invalid(
                WHAT,
                format!("format {:?}, not {FORMAT_NAME}", self.format),
            ));
        }
        if self.version != REPO_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: self.version,
            });
        }
        if self.id.len() != 32 || hex::decode(&self.id).is_err() {
            return Err(invalid(WHAT, format!("the id {:?}", self.id)));
        }
        if !self.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&self.block_size)
        {
            return Err(invalid(
                WHAT,
                format!(
                    "a block size of {} (a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE})",
                    self.block_size
                ),
            ));
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        // Plain data with string keys.
        #[allow(clippy::expect_used)]
        let mut out = serde_json::to_vec_pretty(self).expect("a config serializes");
        out.push(b'\n');
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<RepoConfig, FormatError> {
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(invalid(
                "the repository config",
                format!("{} bytes", bytes.len()),
            ));
        }
        let config: RepoConfig = serde_json::from_slice(bytes)
            .map_err(|e| invalid("the repository config", e.to_string()))?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_unlocks_with_its_key_only_and_binds_its_fields() {
        let (config, master) = RepoConfig::new(65536, &KeySource::KeyFile(b"k1")).unwrap();
        let read = RepoConfig::decode(&config.encode()).unwrap();
        assert_eq!(
            read.unlock(&KeySource::KeyFile(b"k1")).unwrap().expose(),
            master.expose()
        );
        assert!(read.unlock(&KeySource::KeyFile(b"k2")).is_err());
        assert!(read.unlock(&KeySource::Passphrase(b"k1")).is_err());
        // A block size changed in the object: the key no longer opens.
        let changed = RepoConfig {
            block_size: 4096,
            ..read.clone()
        };
        assert!(changed.unlock(&KeySource::KeyFile(b"k1")).is_err());
        assert!(RepoConfig::decode(b"{}").is_err());
        assert!(RepoConfig::new(1000, &KeySource::KeyFile(b"k")).is_err());
    }
}
