//! Where a repository's objects live: an S3 bucket (AWS, Ceph's RADOS
//! Gateway, MinIO, ...) or a local directory, through the `object_store`
//! crate (S3 signing, retries with backoff, timeouts). This module names
//! the objects (docs/BACKUP.md, "Layout") and classifies the store's
//! errors; it trusts no byte it reads (the repository checks them).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use crate::format::ObjectId;

/// Where a repository is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory (made by `init` if missing).
    Dir(PathBuf),
    /// `s3://BUCKET[/PREFIX]` with how to reach it.
    S3 {
        bucket: String,
        prefix: String,
        options: S3Options,
    },
}

/// How to reach an S3 store. Credentials left out come from the usual
/// AWS environment variables.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// `http://host:port` for a gateway that is not AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| ".."),
            )
            .finish()
    }
}

impl Location {
    /// `s3://BUCKET[/PREFIX]`, or a path.
    pub fn parse(url: &str, options: S3Options) -> Result<Location, StoreError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::config(format!("{url}: no bucket")));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
                options,
            });
        }
        if url.contains("://") {
            return Err(StoreError::config(format!(
                "{url}: a repository is s3://BUCKET[/PREFIX] or a local directory"
            )));
        }
        let path = url.strip_prefix("file:").unwrap_or(url);
        if path.is_empty() {
            return Err(StoreError::config("an empty repository path"));
        }
        Ok(Location::Dir(PathBuf::from(path)))
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Dir(p) => write!(f, "{}", p.display()),
            Location::S3 { bucket, prefix, .. } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Location::S3 { bucket, prefix, .. } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// What went wrong with the store, by what a caller does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The object is not there.
    NotFound,
    /// Refused: credentials, permissions, a quota.
    Refused,
    /// The network or the store failed (after the retries): try again.
    Unavailable,
    /// The repository's location or options are wrong.
    Config,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    message: String,
}

impl StoreError {
    fn config(message: impl Into<String>) -> Self {
        StoreError {
            kind: StoreErrorKind::Config,
            message: message.into(),
        }
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        StoreError {
            kind: StoreErrorKind::Unavailable,
            message: message.into(),
        }
    }

    fn from_store(op: &str, name: &str, e: object_store::Error) -> Self {
        use object_store::Error as E;
        let kind = match &e {
            E::NotFound { .. } => StoreErrorKind::NotFound,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreErrorKind::Refused,
            E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
                StoreErrorKind::Refused
            }
            _ => StoreErrorKind::Unavailable,
        };
        let message = format!("{op} {name}: {}", crate::error_chain(&e));
        StoreError { kind, message }
    }
}

/// The repository's object names (docs/BACKUP.md, "Layout").
pub mod names {
    use super::ObjectId;

    pub const CONFIG: &str = "config";
    pub const PACKS: &str = "packs";
    pub const INDEX: &str = "index";
    pub const SNAPSHOTS: &str = "snapshots";
    pub const LOCKS: &str = "locks";
    pub const CHECKPOINTS: &str = "checkpoints";

    /// `packs/ab/abcdef...` (256 directories, as a file system prefers).
    pub fn pack(id: &ObjectId) -> String {
        let hex = id.to_string();
        format!("{PACKS}/{}/{hex}", &hex[..2])
    }

    pub fn index(id: &ObjectId) -> String {
        format!("{INDEX}/{id}")
    }

    pub fn snapshot(id: &ObjectId) -> String {
        format!("{SNAPSHOTS}/{id}")
    }

    pub fn lock(id: &ObjectId) -> String {
        format!("{LOCKS}/{id}")
    }

    pub fn checkpoint(id: &ObjectId) -> String {
        format!("{CHECKPOINTS}/{id}")
    }
}

/// An object's name and size, from a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub size: u64,
    /// When the store last wrote it, in milliseconds since 1970 by the
    /// store's own clock (what lock ages are measured against).
    pub modified_ms: i64,
}

/// A repository's store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    location: Location,
    /// Fault injection: how many more writes and deletes succeed.
    writes_left: Option<Arc<AtomicU64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.location)
    }
}

/// Each request's timeout, and how often and how long a failed request
/// is retried (with jittered exponential backoff from 1 s to 30 s) before
/// the error reaches the caller: a gateway restarting or a link down for
/// a minute or two costs a backup nothing.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RETRIES: usize = 10;
const RETRY_TIMEOUT: Duration = Duration::from_secs(180);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Store {
    /// Opens the store at `location`; `create` makes a local directory.
    pub fn open(location: &Location, create: bool) -> Result<Store, StoreError> {
        let inner: Arc<dyn ObjectStore> = match location {
            Location::Dir(path) => {
                if create {
                    std::fs::create_dir_all(path).map_err(|e| {
                        StoreError::config(format!("cannot make {}: {e}", path.display()))
                    })?;
                }
                let fs = LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| StoreError::config(format!("{}: {e}", path.display())))?;
                Arc::new(fs)
            }
            Location::S3 {
                bucket,
                prefix,
                options,
            } => {
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(RetryConfig {
                        max_retries: MAX_RETRIES,
                        retry_timeout: RETRY_TIMEOUT,
                        backoff: BackoffConfig {
                            init_backoff: FIRST_BACKOFF,
                            max_backoff: MAX_BACKOFF,
                            base: 2.0,
                        },
                    })
                    .with_client_options(
                        ClientOptions::new()
                            .with_timeout(REQUEST_TIMEOUT)
                            .with_connect_timeout(CONNECT_TIMEOUT)
                            .with_allow_http(
                                options
                                    .endpoint
                                    .as_deref()
                                    .is_some_and(|e| e.starts_with("http://")),
                            ),
                    );
                if let Some(e) = &options.endpoint {
                    b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
                }
                b = b.with_region(options.region.as_deref().unwrap_or("us-east-1"));
                if let Some(k) = &options.access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(s) = &options.secret_access_key {
                    b = b.with_secret_access_key(s);
                }
                let s3 = b
                    .build()
                    .map_err(|e| StoreError::config(format!("{location}: {e}")))?;
                if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(PrefixStore::new(s3, prefix.as_str()))
                }
            }
        };
        Ok(Store {
            inner,
            location: location.clone(),
            writes_left: None,
        })
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Fault injection (tests): this store accepts `n` more writes and
    /// deletes, then fails each as a store that went away would.
    pub fn fail_writes_after(&mut self, n: u64) {
        self.writes_left = Some(Arc::new(AtomicU64::new(n)));
    }

    fn spend_write(&self, op: &str, name: &str) -> Result<(), StoreError> {
        let Some(left) = &self.writes_left else {
            return Ok(());
        };
        left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| {
                StoreError::unavailable(format!("{op} {name}: the store is gone (injected)"))
            })
    }

    fn path(name: &str) -> ObjectPath {
        ObjectPath::from(name)
    }

    /// A whole object; None if it is not there.
    pub async fn get(&self, name: &str) -> Result<Option<Bytes>, StoreError> {
        let got = match self.inner.get(&Self::path(name)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(StoreError::from_store("reading", name, e)),
        };
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| StoreError::from_store("reading", name, e))
    }

    /// Bytes `range` of an object.
    pub async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.inner
            .get_range(&Self::path(name), range)
            .await
            .map_err(|e| StoreError::from_store("reading", name, e))
    }

    /// An object's size; None if it is not there.
    pub async fn size(&self, name: &str) -> Result<Option<u64>, StoreError> {
        match self.inner.head(&Self::path(name)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError::from_store("looking up", name, e)),
        }
    }

    /// Writes an object (whole: a reader never sees part of it).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<(), StoreError> {
        self.spend_write("writing", name)?;
        self.inner
            .put(&Self::path(name), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|e| StoreError::from_store("writing", name, e))
    }

    /// Writes an object unless one of that name exists (false then), where
    /// the store can tell; a store that cannot (some S3 gateways) is asked
    /// first instead.
    pub async fn put_new(&self, name: &str, bytes: Bytes) -> Result<bool, StoreError> {
        self.spend_write("writing", name)?;
        let path = Self::path(name);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .inner
            .put_opts(&path, PutPayload::from_bytes(bytes.clone()), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(object_store::Error::NotImplemented { .. }) => {
                if self.size(name).await?.is_some() {
                    return Ok(false);
                }
                self.put(name, bytes).await.map(|()| true)
            }
            Err(e) => Err(StoreError::from_store("writing", name, e)),
        }
    }

    /// Every object under `dir`.
    pub async fn list(&self, dir: &str) -> Result<Vec<Listed>, StoreError> {
        let prefix = Self::path(dir);
        let prefix_len = prefix.as_ref().len() + 1;
        self.inner
            .list(Some(&prefix))
            .map_ok(|meta| Listed {
                name: meta.location.as_ref().to_owned(),
                size: meta.size,
                modified_ms: meta.last_modified.timestamp_millis(),
            })
            .try_collect::<Vec<_>>()
            .await
            .map(|mut v| {
                v.retain(|l| l.name.len() > prefix_len);
                v.sort_by(|a, b| a.name.cmp(&b.name));
                v
            })
            .map_err(|e| StoreError::from_store("listing", dir, e))
    }

    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.spend_write("deleting", name)?;
        match self.inner.delete(&Self::path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::from_store("deleting", name, e)),
        }
    }
}

/// The object id at the end of a listed name (`packs/ab/<id>`), if it is
/// one.
pub fn id_of(name: &str) -> Option<ObjectId> {
    ObjectId::parse(name.rsplit('/').next()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(
            Location::parse("s3://bkt/a/b/", S3Options::default()).unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: "a/b".into(),
                options: S3Options::default()
            }
        );
        assert_eq!(
            Location::parse("/srv/backups", S3Options::default()).unwrap(),
            Location::Dir("/srv/backups".into())
        );
        assert!(Location::parse("s3://", S3Options::default()).is_err());
        assert!(Location::parse("gs://x", S3Options::default()).is_err());
    }

    #[tokio::test]
    async fn a_directory_store_reads_writes_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Location::Dir(dir.path().join("repo")), true).unwrap();
        assert!(store.get("config").await.unwrap().is_none());
        assert!(store
            .put_new("config", Bytes::from_static(b"one"))
            .await
            .unwrap());
        assert!(!store
            .put_new("config", Bytes::from_static(b"two"))
            .await
            .unwrap());
        assert_eq!(store.get("config").await.unwrap().unwrap(), &b"one"[..]);
        let id = ObjectId::of(b"pack");
        store
            .put(&names::pack(&id), Bytes::from_static(b"pack"))
            .await
            .unwrap();
        let listed = store.list(names::PACKS).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(id_of(&listed[0].name), Some(id));
        assert_eq!(
            store.get_range(&names::pack(&id), 1..3).await.unwrap(),
            &b"ac"[..]
        );
        store.delete(&names::pack(&id)).await.unwrap();
        assert!(store.list(names::PACKS).await.unwrap().is_empty());
    }
}
