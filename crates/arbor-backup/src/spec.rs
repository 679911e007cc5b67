//! A repository as a user names it (a daemon's `backup_repositories`
//! entry, or `arbor backup init`'s arguments): where it is, how to reach
//! it, and the file holding its key. Reading the key and credential files
//! is here, so both sides refuse the same mistakes.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::format::config::KeySource;
use crate::repo::{BackupError, Repository, Result};
use crate::store::{Location, S3Options};

/// Most bytes of a key, passphrase or credentials file read.
const MAX_SECRET_FILE: u64 = 64 << 10;

/// The file that holds a repository's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFile {
    /// A key file (`arbor backup key new`).
    Key(PathBuf),
    /// A file whose first line is a passphrase.
    Passphrase(PathBuf),
}

/// A repository as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoSpec {
    /// `s3://BUCKET[/PREFIX]` or a directory.
    pub url: String,
    /// An S3 gateway's `http(s)://host:port` (not AWS).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// A TOML file with `access_key_id` and `secret_access_key`; without
    /// one, the AWS environment variables.
    pub credentials_file: Option<PathBuf>,
    pub key: KeyFile,
    /// Bytes per second of uploads at most (none: unlimited).
    pub upload_rate: Option<u64>,
}

/// Reads a file that holds a secret: bounded, and refused if others than
/// its owner may read it (as ssh refuses such keys). Also the CLI's reader
/// of encrypted volumes' key files.
pub fn read_secret(path: &Path, what: &str) -> Result<Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| {
        BackupError::Refused(format!("cannot read the {what} {}: {e}", path.display()))
    })?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(BackupError::Refused(format!(
            "the {what} {} may be read by others than its owner (mode {:o}): `chmod 600` it",
            path.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    if meta.len() > MAX_SECRET_FILE {
        return Err(BackupError::Refused(format!(
            "the {what} {} is larger than {MAX_SECRET_FILE} bytes",
            path.display()
        )));
    }
    std::fs::read(path).map(Zeroizing::new).map_err(|e| {
        BackupError::Refused(format!("cannot read the {what} {}: {e}", path.display()))
    })
}

/// The secret a key file holds: its contents without surrounding
/// whitespace, at least 32 bytes.
fn key_file_contents(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let raw = read_secret(path, "key file")?;
    let trimmed = Zeroizing::new(raw.trim_ascii().to_vec());
    if trimmed.len() < 32 {
        return Err(BackupError::Refused(format!(
            "the key file {} holds {} bytes: a key file holds at least 32 (make one with `arbor \
             backup key new`)",
            path.display(),
            trimmed.len()
        )));
    }
    Ok(trimmed)
}

/// The passphrase a passphrase file holds: its first line, not empty
/// (read as [`read_secret`] reads).
pub fn passphrase_contents(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let raw = read_secret(path, "passphrase file")?;
    let line = raw.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = Zeroizing::new(line.strip_suffix(b"\r").unwrap_or(line).to_vec());
    if line.is_empty() {
        return Err(BackupError::Refused(format!(
            "the passphrase file {} is empty",
            path.display()
        )));
    }
    Ok(line)
}

/// Writes a new key file: 32 random bytes as 64 hex digits, mode 0600,
/// never over an existing file.
pub fn new_key_file(path: &Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = crate::crypto::Secret::random();
    let mut text = Zeroizing::new(hex::encode(key.expose()).into_bytes());
    text.push(b'\n');
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            BackupError::Refused(format!("cannot make the key file {}: {e}", path.display()))
        })?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(|e| {
            BackupError::Refused(format!("cannot write the key file {}: {e}", path.display()))
        })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    access_key_id: String,
    secret_access_key: String,
}

impl RepoSpec {
    fn location(&self) -> Result<Location> {
        let mut options = S3Options {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            ..S3Options::default()
        };
        if let Some(path) = &self.credentials_file {
            let bytes = read_secret(path, "credentials file")?;
            let text = std::str::from_utf8(&bytes).map_err(|_| {
                BackupError::Refused(format!(
                    "the credentials file {} is not text",
                    path.display()
                ))
            })?;
            let c: Credentials = toml::from_str(text).map_err(|e| {
                BackupError::Refused(format!(
                    "the credentials file {}: {} (it holds access_key_id and secret_access_key)",
                    path.display(),
                    e.message()
                ))
            })?;
            options.access_key_id = Some(c.access_key_id);
            options.secret_access_key = Some(c.secret_access_key);
        }
        Ok(Location::parse(&self.url, options)?)
    }

    /// Checks what can be checked without reading a file or the store:
    /// the location's form.
    pub fn check(&self) -> Result<()> {
        Location::parse(&self.url, S3Options::default()).map(drop)?;
        Ok(())
    }

    /// The secret the key file holds.
    fn secret(&self) -> Result<Zeroizing<Vec<u8>>> {
        match &self.key {
            KeyFile::Key(path) => key_file_contents(path),
            KeyFile::Passphrase(path) => passphrase_contents(path),
        }
    }

    fn source<'a>(&self, secret: &'a [u8]) -> KeySource<'a> {
        match &self.key {
            KeyFile::Key(_) => KeySource::KeyFile(secret),
            KeyFile::Passphrase(_) => KeySource::Passphrase(secret),
        }
    }

    /// Opens the repository.
    pub async fn open(&self) -> Result<Repository> {
        let location = self.location()?;
        let secret = self.secret()?;
        Ok(Repository::open(&location, &self.source(&secret))
            .await?
            .with_upload_rate(self.upload_rate))
    }

    /// Makes the repository.
    pub async fn init(&self, block_size: u32) -> Result<Repository> {
        let location = self.location()?;
        let secret = self.secret()?;
        Repository::init(&location, block_size, &self.source(&secret)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn keys_are_made_read_and_refused_when_exposed() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        new_key_file(&key).unwrap();
        assert!(new_key_file(&key).is_err(), "a key file was overwritten");
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let spec = RepoSpec {
            url: dir.path().join("repo").display().to_string(),
            endpoint: None,
            region: None,
            credentials_file: None,
            key: KeyFile::Key(key.clone()),
            upload_rate: None,
        };
        let made = spec.init(65536).await.unwrap();
        let opened = spec.open().await.unwrap();
        assert_eq!(made.id(), opened.id());

        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = spec.open().await.unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");

        let short = dir.path().join("short");
        std::fs::write(&short, "abc").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = RepoSpec {
            key: KeyFile::Key(short),
            ..spec.clone()
        }
        .open()
        .await
        .unwrap_err();
        assert!(e.to_string().contains("at least 32"), "{e}");
    }
}
