//! `arbor serve` configuration: built-in defaults (`default-config.toml`,
//! the one place they are written down), overridden by a TOML file,
//! overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::DaemonError;
use arbor_api::model::Scope;
use arbor_api::size::ByteSize;

/// The documented defaults; `--print-config` starts from this text.
pub const DEFAULT_CONFIG: &str = include_str!("default-config.toml");

/// The smallest NBD memory limit: one maximal request must fit.
const MIN_NBD_MEMORY: u32 = 32 << 20;

/// The longest `nbd_poll`: polling keeps a CPU busy.
const MAX_NBD_POLL: Duration = Duration::from_millis(1);

/// Most bytes of config file read: it is a handful of keys.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The config file's keys, as written in TOML.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    data_dir: PathBuf,
    pool: PathBuf,
    pool_size: ByteSize,
    chunk_size: ByteSize,
    initial_volume: String,
    initial_volume_size: ByteSize,
    nbd_listen: String,
    nbd_max_connections: u32,
    nbd_memory_limit: ByteSize,
    nbd_stall_timeout: String,
    nbd_poll: String,
    nbd_tls: String,
    nbd_access: Vec<NbdAccessEntry>,
    api_listen: String,
    api_clients: Vec<ApiClientEntry>,
    api_max_connections: u32,
    reclaim_rate: u32,
    scrub_busy_rate: ByteSize,
    commit_interval: String,
    history_interval: String,
    cache_size: ByteSize,
    io: String,
    space_warning_percent: Vec<u8>,
    replication_listen: String,
    tls_ca: PathBuf,
    tls_cert: PathBuf,
    tls_key: PathBuf,
    tls_crl: PathBuf,
    replication_identity: String,
    replication_timeout: String,
    replication_allow: Vec<AllowEntry>,
    backup_repositories: Vec<BackupRepositoryEntry>,
    volume_keys: Vec<VolumeKeyEntry>,
}

/// Where the key of an encrypted volume comes from at start and reload.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct VolumeKeyEntry {
    volume: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    passphrase_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_command: Option<Vec<String>>,
    /// What the command prints: "key" (a raw key, 64 hex digits) or
    /// "passphrase" (its first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_command_prints: Option<String>,
}

/// One backup repository (docs/BACKUP.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct BackupRepositoryEntry {
    name: String,
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    passphrase_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credentials_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upload_rate: Option<ByteSize>,
    /// Scheduled backups (docs/BACKUP.md, "Scheduled backups"): when, of
    /// which volumes, and which backups a prune keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keep: Option<String>,
}

/// One source a replication target accepts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct AllowEntry {
    source: String,
    #[serde(default = "any_volume")]
    volumes: Vec<String>,
    #[serde(default)]
    keep: u32,
}

/// One grant of NBD access on TCP.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NbdAccessEntry {
    /// A certificate identity, `*` (any certificate from the CA) or
    /// `anonymous` (clients without a certificate).
    identity: String,
    #[serde(default = "any_volume")]
    volumes: Vec<String>,
    /// `list`, `read` or `write`.
    access: String,
}

/// A client certificate identity the API accepts, and its scope.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ApiClientEntry {
    identity: String,
    scope: Scope,
}

fn any_volume() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Everything the daemon runs with, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub pool: PathBuf,
    pub pool_size: u64,
    pub chunk_size: u32,
    /// Name and size of the volume created with a new pool.
    pub initial_volume: Option<(String, u64)>,
    pub nbd_listen: Option<SocketAddr>,
    pub nbd_max_connections: usize,
    /// Request bytes held at once across all NBD connections.
    pub nbd_memory_limit: u32,
    pub nbd_stall_timeout: Duration,
    /// Longest a connection polls for its next request before sleeping;
    /// zero: never.
    pub nbd_poll: Duration,
    /// TLS mode and grants of the NBD TCP listener (the Unix socket is the
    /// owner's alone, without TLS, with every volume).
    pub nbd_tcp_security: NbdSecurity,
    /// Certificates shared by the listeners that use TLS.
    pub tls: Option<arbor_tls::TlsFiles>,
    pub api: ApiConfig,
    /// Reclaim pace in metadata nodes per second; 0 turns background reclaim off.
    pub reclaim_rate: u32,
    /// The scrub's pace in bytes per second while the pool serves I/O
    /// (full speed when it serves none); 0: it waits meanwhile.
    pub scrub_busy_rate: u64,
    pub commit_interval: Duration,
    /// How often the dashboard's history samples I/O and space.
    pub history_interval: Duration,
    pub cache_bytes: usize,
    /// How the pool's device is reached (direct or buffered I/O).
    pub io: crate::pool_file::IoMode,
    /// Increasing percentages of space use that raise a warning.
    pub space_warning_percent: Vec<u8>,
    pub replication: ReplicationConfig,
    /// Backup repositories by name.
    pub backup_repositories: Vec<(String, arbor_backup::spec::RepoSpec)>,
    /// Their schedules, for those that have one.
    pub backup_schedules: Vec<crate::backup_schedule::BackupPolicy>,
    /// Encrypted volumes' keys loaded at start and reload.
    pub volume_keys: Vec<crate::keys::ConfiguredKey>,
}

/// What the NBD TCP listener asks of clients.
#[derive(Debug, Clone)]
pub struct NbdSecurity {
    pub mode: arbor_nbd::TlsMode,
    pub access: arbor_nbd::AccessList,
}

/// The API on TCP (docs/SECURITY.md): where, with which TLS, and who may
/// use it by certificate.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub listen: Option<SocketAddr>,
    /// HTTPS only when given.
    pub tls: Option<arbor_tls::TlsFiles>,
    /// Certificate identities and what they may do.
    pub clients: Vec<(String, Scope)>,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
}

/// How this host replicates (`arbor replica`).
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// The listener for replicas sent here.
    pub listen: Option<SocketAddr>,
    /// Mutual TLS for replication, both ways.
    pub tls: Option<arbor_tls::TlsFiles>,
    /// This host's identity without TLS.
    pub identity: String,
    pub timeout: Duration,
    pub allow: Vec<arbor_replica::target::Allow>,
}

impl ServeConfig {
    pub fn nbd_socket(&self) -> PathBuf {
        self.data_dir.join("nbd.sock")
    }

    pub fn api_socket(&self) -> PathBuf {
        self.data_dir.join("api.sock")
    }
}

fn usage(message: String) -> anyhow::Error {
    DaemonError::Invalid(message).into()
}

fn parse_table(text: &str, origin: &str) -> Result<toml::Table> {
    text.parse::<toml::Table>()
        .map_err(|e| usage(format!("{origin} is not valid TOML: {e}")))
}

fn read_config_file(path: &Path) -> Result<toml::Table> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        bail!(usage(format!(
            "config file {} is larger than 1 MiB",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    parse_table(&text, &format!("config file {}", path.display()))
}

/// The defaults with `file`'s keys laid over them; unknown keys are errors
/// (a typo must not silently fall back to a default).
fn merged_file(file: Option<&Path>) -> Result<ConfigFile> {
    let mut merged = parse_table(DEFAULT_CONFIG, "the built-in configuration")?;
    if let Some(path) = file {
        for (key, value) in read_config_file(path)? {
            if !merged.contains_key(&key) {
                let known: Vec<&str> = merged.keys().map(String::as_str).collect();
                bail!(usage(format!(
                    "unknown key {key:?} in config file {}; known keys: {}",
                    path.display(),
                    known.join(", ")
                )));
            }
            merged.insert(key, value);
        }
    }
    let origin = file.map_or("the built-in configuration".to_owned(), |p| {
        format!("config file {}", p.display())
    });
    toml::Value::Table(merged)
        .try_into()
        .map_err(|e| usage(format!("{origin}: {e}")))
}

/// What the caller (the command line's flags) sets over the config file;
/// `None` keeps the file's value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// The TOML config file to read over the built-in defaults.
    pub config: Option<PathBuf>,
    pub pool: Option<PathBuf>,
    pub pool_size: Option<ByteSize>,
    pub chunk_size: Option<ByteSize>,
    /// An address, or `none`.
    pub nbd_listen: Option<String>,
    pub api_listen: Option<String>,
    pub replication_listen: Option<String>,
    /// A name, or `none`.
    pub initial_volume: Option<String>,
    pub initial_volume_size: Option<ByteSize>,
    pub reclaim_rate: Option<u32>,
    pub commit_interval: Option<Duration>,
    pub cache_size: Option<ByteSize>,
    /// `auto`, `direct` or `buffered`.
    pub io: Option<String>,
}

/// Overrides win over the file.
fn apply_flags(file: &mut ConfigFile, data_dir: Option<PathBuf>, args: &Overrides) {
    fn set<T: Clone>(target: &mut T, flag: &Option<T>) {
        if let Some(value) = flag {
            *target = value.clone();
        }
    }
    set(&mut file.data_dir, &data_dir);
    set(&mut file.pool, &args.pool);
    set(&mut file.pool_size, &args.pool_size);
    set(&mut file.chunk_size, &args.chunk_size);
    set(&mut file.initial_volume, &args.initial_volume);
    set(&mut file.initial_volume_size, &args.initial_volume_size);
    set(&mut file.nbd_listen, &args.nbd_listen);
    set(&mut file.api_listen, &args.api_listen);
    set(&mut file.replication_listen, &args.replication_listen);
    set(&mut file.reclaim_rate, &args.reclaim_rate);
    if let Some(interval) = args.commit_interval {
        file.commit_interval = humantime::format_duration(interval).to_string();
    }
    set(&mut file.cache_size, &args.cache_size);
    set(&mut file.io, &args.io);
}

/// `none` or an IP:PORT.
fn listen_address(key: &str, text: &str) -> Result<Option<SocketAddr>> {
    if text.eq_ignore_ascii_case("none") || text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        usage(format!(
            "{key} = {text:?} is not an address like 127.0.0.1:10809, or \"none\""
        ))
    })
}

fn positive_duration(key: &str, text: &str) -> Result<Duration> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| usage(format!("{key} = {text:?}: {e} (use e.g. 5s or 500ms)")))?;
    if duration.is_zero() {
        bail!(usage(format!("{key} must be greater than zero")));
    }
    Ok(duration)
}

fn resolve(file: ConfigFile) -> Result<ServeConfig> {
    let chunk_size = u32::try_from(file.chunk_size.0)
        .map_err(|_| usage(format!("chunk_size {} is too large", file.chunk_size)))?;
    let commit_interval = positive_duration("commit_interval", &file.commit_interval)?;
    let history_interval = positive_duration("history_interval", &file.history_interval)?;
    if history_interval < Duration::from_secs(1) {
        return Err(usage(format!(
            "history_interval {}: at least 1s",
            file.history_interval
        )));
    }
    let nbd_stall_timeout = positive_duration("nbd_stall_timeout", &file.nbd_stall_timeout)?;
    let nbd_poll = humantime::parse_duration(&file.nbd_poll).map_err(|e| {
        usage(format!(
            "nbd_poll = {:?}: {e} (use e.g. 128us, or 0s for none)",
            file.nbd_poll
        ))
    })?;
    if nbd_poll > MAX_NBD_POLL {
        bail!(usage(format!(
            "nbd_poll = {:?}: at most 1ms (a connection polls its CPU busy for that long)",
            file.nbd_poll
        )));
    }
    let warnings = &file.space_warning_percent;
    if warnings.iter().any(|&p| p == 0 || p > 100) || !warnings.is_sorted() {
        bail!(usage(format!(
            "space_warning_percent = {warnings:?}: expected increasing percentages from 1 to 100"
        )));
    }
    let pool = if file.pool.as_os_str().is_empty() {
        file.data_dir.join("pool")
    } else {
        file.pool.clone()
    };
    let nbd_memory_limit = u32::try_from(file.nbd_memory_limit.0)
        .ok()
        .filter(|&limit| limit >= MIN_NBD_MEMORY)
        .ok_or_else(|| {
            usage(format!(
                "nbd_memory_limit = {}: must be from 32 MiB (one maximal request) to 4 GiB",
                file.nbd_memory_limit
            ))
        })?;
    let tls = tls_files(&file)?;
    let nbd_listen = listen_address("nbd_listen", &file.nbd_listen)?;
    let nbd_tcp_security = nbd_security(&file, nbd_listen, tls.is_some())?;
    let api = api(&file, tls.clone())?;
    let replication = replication(&file, tls.clone())?;
    let backup_repositories = backup_repositories(&file)?;
    let backup_schedules = backup_schedules(&file)?;
    let volume_keys = volume_keys(&file)?;
    if file.nbd_max_connections == 0 {
        bail!(usage("nbd_max_connections must be at least 1".into()));
    }
    Ok(ServeConfig {
        pool,
        nbd_memory_limit,
        nbd_stall_timeout,
        nbd_poll,
        nbd_max_connections: file.nbd_max_connections as usize,
        pool_size: file.pool_size.0,
        chunk_size,
        initial_volume: (!file.initial_volume.is_empty() && file.initial_volume != "none")
            .then(|| (file.initial_volume.clone(), file.initial_volume_size.0)),
        nbd_listen,
        nbd_tcp_security,
        tls,
        api,
        reclaim_rate: file.reclaim_rate,
        scrub_busy_rate: file.scrub_busy_rate.0,
        commit_interval,
        history_interval,
        cache_bytes: usize::try_from(file.cache_size.0)
            .map_err(|_| usage("cache_size is too large".into()))?,
        io: crate::pool_file::IoMode::parse(&file.io).ok_or_else(|| {
            usage(format!(
                "io = {:?}: expected \"auto\", \"direct\" or \"buffered\"",
                file.io
            ))
        })?,
        space_warning_percent: file.space_warning_percent.clone(),
        replication,
        backup_repositories,
        backup_schedules,
        volume_keys,
        data_dir: file.data_dir,
    })
}

/// The configured sources of encrypted volumes' keys: one per volume,
/// exactly one source each.
fn volume_keys(file: &ConfigFile) -> Result<Vec<crate::keys::ConfiguredKey>> {
    use crate::keys::{ConfiguredKey, KeySource};
    let mut out: Vec<ConfiguredKey> = Vec::new();
    for entry in &file.volume_keys {
        let volume = &entry.volume;
        if arbor_engine::check_volume_name(volume).is_err() {
            bail!(usage(format!(
                "volume_keys: {volume:?} is not a volume name"
            )));
        }
        if out.iter().any(|k| &k.volume == volume) {
            bail!(usage(format!("volume_keys: {volume} is named twice")));
        }
        let prints = entry.key_command_prints.as_deref();
        let source = match (&entry.key_file, &entry.passphrase_file, &entry.key_command) {
            (Some(f), None, None) if prints.is_none() => KeySource::KeyFile(f.clone()),
            (None, Some(f), None) if prints.is_none() => KeySource::PassphraseFile(f.clone()),
            (None, None, Some(argv)) => {
                if argv.is_empty() || argv[0].is_empty() {
                    bail!(usage(format!(
                        "volume_keys: {volume}: key_command is empty"
                    )));
                }
                let passphrase = match prints {
                    None | Some("key") => false,
                    Some("passphrase") => true,
                    Some(other) => bail!(usage(format!(
                        "volume_keys: {volume}: key_command_prints = {other:?}: expected \
                         \"key\" or \"passphrase\""
                    ))),
                };
                KeySource::Command {
                    argv: argv.clone(),
                    passphrase,
                }
            }
            _ => bail!(usage(format!(
                "volume_keys: {volume} needs exactly one of key_file, passphrase_file and \
                 key_command (key_command_prints goes with key_command)"
            ))),
        };
        out.push(ConfiguredKey {
            volume: volume.clone(),
            source,
        });
    }
    Ok(out)
}

/// The certificates every TLS listener shares: all three files, or none;
/// and the revocation lists, with them.
fn tls_files(file: &ConfigFile) -> Result<Option<arbor_tls::TlsFiles>> {
    let paths = [&file.tls_ca, &file.tls_cert, &file.tls_key];
    let given = paths.iter().filter(|p| !p.as_os_str().is_empty()).count();
    let crl = (!file.tls_crl.as_os_str().is_empty()).then(|| file.tls_crl.clone());
    match given {
        0 if crl.is_some() => bail!(usage(
            "tls_crl needs tls_ca, tls_cert and tls_key (the lists revoke certificates their CA issued)"
                .into()
        )),
        0 => Ok(None),
        3 => Ok(Some(arbor_tls::TlsFiles {
            ca: file.tls_ca.clone(),
            cert: file.tls_cert.clone(),
            key: file.tls_key.clone(),
            crl,
        })),
        _ => bail!(usage(
            "tls_ca, tls_cert and tls_key go together: give all three, or none".into()
        )),
    }
}

/// The NBD TCP listener's TLS mode and grants. `nbd_tls = "auto"`: require
/// off loopback, offer on loopback when certificates are configured, else
/// off. No `nbd_access`: every client may write every volume on loopback;
/// off loopback, every client with a certificate from the CA.
fn nbd_security(
    file: &ConfigFile,
    listen: Option<SocketAddr>,
    certificates: bool,
) -> Result<NbdSecurity> {
    use arbor_nbd::{Access, AccessList, Pattern, Principal, Rule, TlsMode};
    let loopback = listen.is_none_or(|addr| addr.ip().is_loopback());
    let mode = match file.nbd_tls.to_ascii_lowercase().as_str() {
        "off" => TlsMode::Off,
        "on" => TlsMode::On,
        "require" => TlsMode::Require,
        "auto" | "" if !loopback => TlsMode::Require,
        "auto" | "" if certificates => TlsMode::On,
        "auto" | "" => TlsMode::Off,
        other => bail!(usage(format!(
            "nbd_tls = {other:?}: expected \"off\", \"on\", \"require\" or \"auto\""
        ))),
    };
    if let Some(addr) = listen {
        if mode != TlsMode::Off && !certificates {
            bail!(usage(format!(
                "nbd_listen = {addr} with TLS ({}): give tls_ca, tls_cert and tls_key \
                 (`arbor tls init DIR` makes a set), or set nbd_tls = \"off\" on loopback",
                if loopback {
                    "nbd_tls"
                } else {
                    "required off loopback"
                }
            )));
        }
        if !loopback && mode != TlsMode::Require {
            bail!(usage(format!(
                "nbd_listen = {addr}: off loopback NBD requires TLS; nbd_tls must be \"require\" or \"auto\""
            )));
        }
    }
    let mut rules = Vec::new();
    for entry in &file.nbd_access {
        let principal = match entry.identity.as_str() {
            "" => bail!(usage(
                "nbd_access: every entry needs an identity (a certificate identity, \"*\" or \"anonymous\")".into()
            )),
            "*" => Principal::AnyCertificate,
            "anonymous" => Principal::Anonymous,
            identity => Principal::Identity(identity.to_owned()),
        };
        let access = match entry.access.to_ascii_lowercase().as_str() {
            "list" => Access::List,
            "read" => Access::Read,
            "write" => Access::Write,
            other => bail!(usage(format!(
                "nbd_access: access = {other:?} for {:?}: expected \"list\", \"read\" or \"write\"",
                entry.identity
            ))),
        };
        if entry.volumes.is_empty() {
            bail!(usage(format!(
                "nbd_access: the entry for {:?} names no volumes (\"*\": all)",
                entry.identity
            )));
        }
        rules.push(Rule {
            principal,
            exports: entry
                .volumes
                .iter()
                .map(|v| Pattern::new(v.as_str()))
                .collect(),
            access,
        });
    }
    let access = if !rules.is_empty() {
        AccessList::new(rules)
    } else if loopback {
        AccessList::unrestricted()
    } else {
        AccessList::new(vec![Rule {
            principal: Principal::AnyCertificate,
            exports: vec![Pattern::new("*")],
            access: Access::Write,
        }])
    };
    Ok(NbdSecurity { mode, access })
}

/// The API on TCP: anywhere but loopback only with TLS; client
/// certificates only with TLS.
fn api(file: &ConfigFile, tls: Option<arbor_tls::TlsFiles>) -> Result<ApiConfig> {
    let listen = listen_address("api_listen", &file.api_listen)?;
    if let Some(addr) = listen {
        if !addr.ip().is_loopback() && tls.is_none() {
            bail!(usage(format!(
                "api_listen = {addr}: beyond loopback the API needs TLS (tls_ca, tls_cert, \
                 tls_key), so that tokens and data never cross the network in clear"
            )));
        }
    }
    let mut clients: Vec<(String, Scope)> = Vec::new();
    for entry in &file.api_clients {
        if entry.identity.is_empty() {
            bail!(usage(
                "api_clients: every entry needs an identity (a certificate's first DNS name, \
                 IP address or common name)"
                    .into()
            ));
        }
        if clients
            .iter()
            .any(|(identity, _)| *identity == entry.identity)
        {
            bail!(usage(format!(
                "api_clients: {:?} is listed twice",
                entry.identity
            )));
        }
        clients.push((entry.identity.clone(), entry.scope));
    }
    if !clients.is_empty() && tls.is_none() {
        bail!(usage(
            "api_clients names client certificates, which need TLS: set tls_ca, tls_cert and \
             tls_key"
                .into()
        ));
    }
    if file.api_max_connections == 0 {
        bail!(usage("api_max_connections must be at least 1".into()));
    }
    Ok(ApiConfig {
        listen,
        tls,
        clients,
        max_connections: file.api_max_connections as usize,
    })
}

fn backup_repositories(file: &ConfigFile) -> Result<Vec<(String, arbor_backup::spec::RepoSpec)>> {
    use arbor_backup::spec::{KeyFile, RepoSpec};
    let mut out: Vec<(String, RepoSpec)> = Vec::new();
    for entry in &file.backup_repositories {
        let name = &entry.name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !valid {
            bail!(usage(format!(
                "backup_repositories: the name {name:?} is not 1-64 letters, digits, '-', '_' or '.'"
            )));
        }
        if out.iter().any(|(n, _)| n == name) {
            bail!(usage(format!("backup_repositories: {name} is named twice")));
        }
        let key = match (&entry.key_file, &entry.passphrase_file) {
            (Some(k), None) => KeyFile::Key(k.clone()),
            (None, Some(p)) => KeyFile::Passphrase(p.clone()),
            _ => bail!(usage(format!(
                "backup_repositories: {name} needs one of key_file and passphrase_file"
            ))),
        };
        let spec = RepoSpec {
            url: entry.url.clone(),
            endpoint: entry.endpoint.clone(),
            region: entry.region.clone(),
            credentials_file: entry.credentials_file.clone(),
            key,
            upload_rate: match entry.upload_rate {
                Some(ByteSize(0)) => bail!(usage(format!(
                    "backup_repositories: {name}: an upload_rate must be above zero (leave it out \
                     for none)"
                ))),
                other => other.map(|r| r.0),
            },
        };
        spec.check()
            .map_err(|e| usage(format!("backup_repositories: {name}: {e}")))?;
        out.push((name.clone(), spec));
    }
    Ok(out)
}

/// The schedules of the repositories that have one: a schedule as a
/// snapshot policy's, at least one volume, and optionally a retention.
fn backup_schedules(file: &ConfigFile) -> Result<Vec<crate::backup_schedule::BackupPolicy>> {
    let mut out = Vec::new();
    for entry in &file.backup_repositories {
        let name = &entry.name;
        let Some(schedule) = &entry.schedule else {
            if !entry.volumes.is_empty() || entry.keep.is_some() {
                bail!(usage(format!(
                    "backup_repositories: {name}: volumes and keep go with a schedule"
                )));
            }
            continue;
        };
        let schedule: arbor_monitor::Schedule = schedule
            .parse()
            .map_err(|e| usage(format!("backup_repositories: {name}: schedule: {e}")))?;
        if entry.volumes.is_empty() {
            bail!(usage(format!(
                "backup_repositories: {name}: a schedule needs the volumes it backs up"
            )));
        }
        for v in &entry.volumes {
            arbor_engine::check_volume_name(v)
                .map_err(|e| usage(format!("backup_repositories: {name}: volumes: {v:?}: {e}")))?;
        }
        let keep = entry
            .keep
            .as_deref()
            .map(str::parse::<arbor_monitor::Retention>)
            .transpose()
            .map_err(|e| usage(format!("backup_repositories: {name}: keep: {e}")))?;
        out.push(crate::backup_schedule::BackupPolicy {
            repository: name.clone(),
            volumes: entry.volumes.clone(),
            schedule,
            keep,
        });
    }
    Ok(out)
}

fn replication(file: &ConfigFile, tls: Option<arbor_tls::TlsFiles>) -> Result<ReplicationConfig> {
    let listen = listen_address("replication_listen", &file.replication_listen)?;
    if let Some(addr) = listen {
        if !addr.ip().is_loopback() && tls.is_none() {
            bail!(usage(format!(
                "replication_listen = {addr}: beyond loopback replication needs TLS \
                 (tls_ca, tls_cert, tls_key), so that sources are known by certificate"
            )));
        }
    }
    let mut allow = Vec::new();
    for entry in &file.replication_allow {
        if entry.source.is_empty() || entry.volumes.is_empty() {
            bail!(usage(
                "replication_allow: every entry needs a source and at least one volume (or \"*\")"
                    .into()
            ));
        }
        allow.push(arbor_replica::target::Allow {
            source: entry.source.clone(),
            volumes: entry.volumes.clone(),
            keep: (entry.keep > 0).then_some(entry.keep),
        });
    }
    let identity = if file.replication_identity.is_empty() {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned())
    } else {
        file.replication_identity.clone()
    };
    Ok(ReplicationConfig {
        listen,
        tls,
        identity,
        timeout: positive_duration("replication_timeout", &file.replication_timeout)?,
        allow,
    })
}

/// The configuration `arbor serve` runs with, and its TOML text for
/// `--print-config`.
pub fn load(data_dir: Option<PathBuf>, args: &Overrides) -> Result<(ServeConfig, String)> {
    let mut file = merged_file(args.config.as_deref())?;
    apply_flags(&mut file, data_dir, args);
    let text = toml::to_string(&file).context("cannot print the configuration")?;
    Ok((resolve(file)?, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str, args: &Overrides) -> Result<ServeConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("arbor.toml");
        std::fs::write(&path, text).unwrap();
        let args = Overrides {
            config: Some(path),
            ..args.clone()
        };
        load(None, &args).map(|(config, _)| config)
    }

    #[test]
    fn built_in_defaults_are_the_documented_ones() {
        let (config, _) = load(None, &Overrides::default()).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("arbor-data"));
        assert_eq!(config.pool, PathBuf::from("arbor-data/pool"));
        assert_eq!(config.pool_size, 20 << 30);
        assert_eq!(config.chunk_size, arbor_engine::DEFAULT_CHUNK_SIZE);
        assert_eq!(config.initial_volume, Some(("disk0".into(), 10 << 30)));
        assert_eq!(config.nbd_listen, Some("127.0.0.1:10809".parse().unwrap()));
        assert_eq!(config.api.listen, Some("127.0.0.1:10810".parse().unwrap()));
        assert!(config.api.tls.is_none() && config.api.clients.is_empty());
        assert_eq!(config.commit_interval, Duration::from_secs(5));
        assert_eq!(config.space_warning_percent, [80, 90]);
        assert_eq!(config.nbd_poll, Duration::from_micros(128));
        assert_eq!(config.nbd_socket(), PathBuf::from("arbor-data/nbd.sock"));
    }

    #[test]
    fn the_file_overrides_defaults_and_flags_override_the_file() {
        let args = Overrides {
            pool_size: Some(ByteSize(1 << 30)),
            ..Overrides::default()
        };
        let config = load_text(
            "pool_size = \"5G\"\nnbd_listen = \"none\"\ninitial_volume = \"\"\npool = \"/dev/sdz\"\n",
            &args,
        )
        .unwrap();
        assert_eq!(config.pool_size, 1 << 30);
        assert_eq!(config.nbd_listen, None);
        let off = load_text("nbd_poll = \"0s\"", &args).unwrap();
        assert_eq!(off.nbd_poll, Duration::ZERO);
        assert_eq!(config.initial_volume, None);
        assert_eq!(config.pool, PathBuf::from("/dev/sdz"));
        assert_eq!(config.api.listen, Some("127.0.0.1:10810".parse().unwrap()));
    }

    #[test]
    fn mistakes_are_reported_with_the_key() {
        let none = Overrides::default();
        let cases = [
            ("pool_sise = \"5G\"", "unknown key \"pool_sise\""),
            ("pool_size = \"5Q\"", "unknown unit"),
            ("nbd_listen = \"localhost\"", "nbd_listen"),
            (
                "api_listen = \"0.0.0.0:1\"",
                "beyond loopback the API needs TLS",
            ),
            (
                "api_listen = \"[::]:1\"",
                "beyond loopback the API needs TLS",
            ),
            (
                "api_clients = [{ identity = \"ops\", scope = \"admin\" }]",
                "need TLS",
            ),
            (
                "api_clients = [{ identity = \"ops\", scope = \"root\" }]",
                "unknown variant",
            ),
            ("api_clients = [{ identity = \"ops\" }]", "missing field"),
            ("api_max_connections = 0", "at least 1"),
            ("commit_interval = \"0s\"", "greater than zero"),
            ("commit_interval = \"soon\"", "commit_interval"),
            ("space_warning_percent = [90, 80]", "increasing"),
            ("reclaim_rate = -1", "reclaim_rate"),
            ("nbd_memory_limit = \"1M\"", "nbd_memory_limit"),
            ("nbd_max_connections = 0", "at least 1"),
            ("nbd_poll = \"2ms\"", "at most 1ms"),
            ("nbd_poll = \"quick\"", "nbd_poll"),
            ("replication_listen = \"10.0.0.1:7400\"", "needs TLS"),
            ("tls_ca = \"ca.pem\"", "go together"),
            ("nbd_tls = \"maybe\"", "expected \"off\""),
            ("nbd_tls = \"require\"", "give tls_ca"),
            ("nbd_listen = \"10.0.0.1:10809\"", "required off loopback"),
            (
                "nbd_listen = \"10.0.0.1:10809\"\nnbd_tls = \"on\"\ntls_ca = \"a\"\ntls_cert = \"b\"\ntls_key = \"c\"",
                "requires TLS",
            ),
            ("nbd_access = [{ identity = \"ci\", access = \"all\" }]", "expected \"list\""),
            ("nbd_access = [{ identity = \"\", access = \"read\" }]", "needs an identity"),
            ("nbd_access = [{ identity = \"ci\", volumes = [], access = \"read\" }]", "names no volumes"),
            ("replication_allow = [{ source = \"\" }]", "needs a source"),
            ("replication_allow = [{ sauce = \"a\" }]", "unknown field"),
            ("this is not toml", "not valid TOML"),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", load_text(text, &none).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn nbd_tls_defaults_follow_the_listener_and_the_certificates() {
        use arbor_nbd::{Access, Client, TlsMode};
        let none = Overrides::default();
        let plain = load_text("", &none).unwrap();
        assert_eq!(plain.nbd_tcp_security.mode, TlsMode::Off);
        let anyone = Client::anonymous();
        assert_eq!(
            plain.nbd_tcp_security.access.access(&anyone, "vm"),
            Some(Access::Write)
        );
        let files = "tls_ca = \"a\"\ntls_cert = \"b\"\ntls_key = \"c\"\n";
        let offered = load_text(files, &none).unwrap();
        assert_eq!(offered.nbd_tcp_security.mode, TlsMode::On);
        let remote =
            load_text(&format!("{files}nbd_listen = \"10.0.0.1:10809\"\n"), &none).unwrap();
        assert_eq!(remote.nbd_tcp_security.mode, TlsMode::Require);
        // Off loopback, only certificate holders by default.
        let access = &remote.nbd_tcp_security.access;
        assert_eq!(access.access(&anyone, "vm"), None);
        let holder = Client {
            tls: true,
            identity: Some("ci".into()),
        };
        assert_eq!(access.access(&holder, "vm"), Some(Access::Write));
        let granted = load_text(
            &format!(
                "{files}nbd_access = [{{ identity = \"ci\", volumes = [\"ci-*\"], access = \"write\" }}, \
                 {{ identity = \"anonymous\", volumes = [\"golden\"], access = \"read\" }}]\n"
            ),
            &none,
        )
        .unwrap();
        let access = &granted.nbd_tcp_security.access;
        assert_eq!(access.access(&holder, "ci-7"), Some(Access::Write));
        assert_eq!(access.access(&holder, "vm"), None);
        assert_eq!(access.access(&anyone, "golden"), Some(Access::Read));
        assert_eq!(access.access(&anyone, "ci-7"), None);
    }

    #[test]
    fn the_api_beyond_loopback_needs_tls_and_takes_client_identities() {
        let tls = "tls_ca = \"ca.pem\"\ntls_cert = \"host.pem\"\ntls_key = \"host-key.pem\"\n";
        let config = load_text(
            &format!(
                "{tls}api_listen = \"0.0.0.0:10810\"\napi_max_connections = 8\n\
                 api_clients = [{{ identity = \"ops.example\", scope = \"admin\" }}, \
                 {{ identity = \"monitor\", scope = \"read\" }}]\n"
            ),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(config.api.listen, Some("0.0.0.0:10810".parse().unwrap()));
        assert_eq!(config.api.tls.unwrap().cert, PathBuf::from("host.pem"));
        assert_eq!(
            config.api.clients,
            [
                ("ops.example".to_owned(), Scope::Admin),
                ("monitor".to_owned(), Scope::Read)
            ]
        );
        assert_eq!(config.api.max_connections, 8);
        let twice = format!(
            "{tls}api_clients = [{{ identity = \"a\", scope = \"admin\" }}, \
             {{ identity = \"a\", scope = \"read\" }}]\n"
        );
        let err = format!(
            "{:#}",
            load_text(&twice, &Overrides::default()).unwrap_err()
        );
        assert!(err.contains("listed twice"), "{err}");
        // The flag is checked the same way.
        let args = Overrides {
            api_listen: Some("10.1.2.3:10810".into()),
            ..Overrides::default()
        };
        let err = format!("{:#}", load(None, &args).unwrap_err());
        assert!(err.contains("needs TLS"), "{err}");
    }

    #[test]
    fn printed_config_loads_back_to_the_same() {
        let (config, text) = load(None, &Overrides::default()).unwrap();
        let again = load_text(&text, &Overrides::default()).unwrap();
        assert_eq!(format!("{config:?}"), format!("{again:?}"));
    }
}
