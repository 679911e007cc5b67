//! The command line (see docs/CLI.md).
//!
//! `arbor serve` runs the daemon. Every other command but `pool create`,
//! `tls init` and those given a pool PATH (`check`, `pool grow`, `pool
//! upgrade`) is a client of a running daemon's API, found through the data
//! directory (`--data-dir` or `ARBOR_DATA_DIR`), or over TCP (`--api`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use arbor_api::model::QosSetting;
use arbor_api::size::ByteSize;

/// The data directory when neither `--data-dir` nor the config names one.
pub const DEFAULT_DATA_DIR: &str = "arbor-data";

#[derive(Debug, Parser)]
#[command(
    name = "arbor",
    version,
    about = "Thin volumes with O(1) snapshots and clones, served over NBD",
    after_help = "Start the daemon with `arbor serve`; the other commands talk to it.\n\
                  See docs/CLI.md for every command and exit status."
)]
pub struct Cli {
    /// The daemon's data directory: pool file, NBD and API sockets
    /// [default: ./arbor-data]
    #[arg(long, global = true, env = "ARBOR_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Print results as JSON (the API's objects) instead of tables
    #[arg(long, global = true)]
    pub json: bool,

    /// Talk to a daemon's API over TCP instead of DATA_DIR/api.sock:
    /// https://HOST[:PORT] (port 10810 by default), or http:// on loopback
    #[arg(long, global = true, env = "ARBOR_API", value_name = "URL")]
    pub api: Option<String>,

    /// A file holding the API token to send with --api (ARBOR_TOKEN may
    /// hold the token itself)
    #[arg(long, global = true, env = "ARBOR_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// With --api https://: the CA bundle (PEM) that signed the daemon's
    /// certificate
    #[arg(long, global = true, env = "ARBOR_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With --api https://: this client's certificate (PEM), for a daemon
    /// that lists its identity in api_clients
    #[arg(
        long,
        global = true,
        env = "ARBOR_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert
    #[arg(
        long,
        global = true,
        env = "ARBOR_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The data directory client commands look for the daemon in.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// Where client commands find the daemon: `--api` and its credentials.
    pub fn remote(&self) -> arbor_api::client::Remote {
        arbor_api::client::Remote {
            api: self.api.clone().filter(|a| !a.is_empty()),
            token_file: self.token_file.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: open (or create) the pool, serve NBD and the API
    Serve(ServeArgs),
    /// Create, list, resize volumes; show their space use
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Take and list read-only snapshots
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Snapshot a raw disk or image file in place: attach it as a volume
    /// whose data stays where it is
    #[command(subcommand)]
    Origin(OriginCommand),
    /// Create a writable volume from a snapshot, in O(1)
    Clone {
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
        #[arg(value_name = "NEW_VOLUME")]
        name: String,
        /// Return before the clone is durable: the pool's next commit makes
        /// it so (a client's flush, any other command that commits, the
        /// commit interval); a power cut before then loses it whole
        #[arg(long, conflicts_with_all = ["new_key_file", "new_passphrase_file"])]
        deferred: bool,
        /// A clone of an encrypted snapshot: the snapshot's key, with
        /// --new-key-file or --new-passphrase-file to give the clone a key of
        /// its own
        #[command(flatten)]
        key: KeyArgs,
        /// The clone's own key: it opens the clone, the snapshot's does not
        #[command(flatten)]
        new_key: NewKeyArgs,
    },
    /// Destroy a volume or snapshot; its space is reclaimed in the background
    Destroy {
        /// Volume or VOLUME@SNAP
        name: String,
        /// Destroy it even while NBD clients have it open (their I/O then fails)
        #[arg(long)]
        force: bool,
    },
    /// Make a volume read exactly as one of its snapshots (any, not only the newest)
    Rollback {
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
    },
    /// Rename a volume (its snapshots follow) or a snapshot
    Rename { from: String, to: String },
    /// Byte ranges where two volumes or snapshots differ
    Diff { a: String, b: String },
    /// Hold a snapshot: it cannot be destroyed without --force until every
    /// hold is released (backup and replication tools hold their bases)
    Hold {
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
        /// Who holds it: letters, digits and . _ : -
        tag: String,
    },
    /// Release a hold on a snapshot
    Release {
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
        tag: String,
    },
    /// Write a snapshot as a stream (docs/STREAM.md): whole, or what
    /// differs from a base snapshot; `arbor receive` applies it
    Send(SendArgs),
    /// Apply a stream from `arbor send` to a volume: atomic (nothing shows
    /// until the whole stream has arrived and verified) and resumable
    Receive(ReceiveArgs),
    /// Replicate volumes to other hosts' daemons, and manage the replicas
    /// held here
    #[command(subcommand)]
    Replica(ReplicaCommand),
    /// Back snapshots up into a repository in object storage (S3) or a
    /// directory: incremental, deduplicated, compressed and encrypted on
    /// this host (docs/BACKUP.md)
    #[command(subcommand)]
    Backup(BackupCommand),
    /// Snapshot schedules and retention, kept in the pool (docs/MONITOR.md)
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Destroy the snapshots policies no longer keep, now; --dry-run lists
    /// exactly what would go and what each frees
    Prune {
        /// Only this volume's policy [default: every policy]
        volume: Option<String>,
        /// Destroy nothing; list what a prune now would destroy
        #[arg(long)]
        dry_run: bool,
    },
    /// Create, grow or upgrade a pool, show its state, reclaim space now
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Read every live data block once and verify it against its
    /// checksum, then every metadata block, in the background
    #[command(subcommand)]
    Scrub(ScrubCommand),
    /// Keys of encrypted volumes: load (unlock), unload (lock), change the
    /// user's key, make a key file (docs/SECURITY.md)
    #[command(subcommand)]
    Key(KeyCommand),
    /// Verify a pool: offline with PATH, else through the daemon; exit status 8 if damaged
    Check {
        /// Pool file or device not held by a daemon
        path: Option<PathBuf>,
        /// Rebuild what can be rebuilt from the trees (space maps, superblock
        /// copies, the reclaim queue) before checking; needs PATH
        #[arg(long, requires = "path")]
        repair: bool,
    },
    /// Make TLS certificates (offline): a CA, a server and clients; revoke
    /// them
    #[command(subcommand)]
    Tls(crate::tls_init::TlsCommand),
    /// The running daemon's configuration
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Bearer tokens for the API over TCP (managed on the daemon's Unix
    /// socket, or with an admin credential)
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print a shell completion script, e.g. `arbor completions bash > /etc/bash_completion.d/arbor`
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (roff) for arbor and each of its commands into DIR:
    /// arbor.1, arbor-volume.1, arbor-volume-create.1, ... (what the Debian
    /// package installs)
    Manpages {
        /// Created if missing; existing pages of the same names are replaced
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Have the daemon read its configuration again (as SIGHUP and
    /// `systemctl reload arbor` do) and apply what changes live:
    /// certificates and revocation lists, nbd_tls, nbd_access,
    /// api_clients, replication_allow, reclaim_rate, scrub_busy_rate, the
    /// token file. NBD sessions no longer granted are closed; an invalid
    /// configuration changes nothing and says why
    Reload,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it: the one time it is shown (the daemon
    /// keeps only its hash)
    Create {
        /// 1 to 64 letters, digits, '.', '_' or '-'
        name: String,
        /// read: GET requests only (listing, status, metrics, the
        /// dashboard, sends); admin: everything
        #[arg(long, value_enum)]
        scope: arbor_api::model::Scope,
        /// Stop working after this long, e.g. 90d or 12h [default: never]
        #[arg(long, value_name = "DURATION")]
        expires: Option<humantime::Duration>,
    },
    /// Tokens: name, scope, when made, expiry, last use (never a secret)
    #[command(alias = "ls")]
    List,
    /// Revoke a token: it stops working at once
    Revoke { name: String },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Snapshot VOLUME (and the --with volumes, together) on a schedule and
    /// keep what the retention says; replaces the policy VOLUME had
    Set {
        volume: String,
        /// Another volume snapshotted with it, in the same commit (repeat)
        #[arg(long, value_name = "VOLUME")]
        with: Vec<String>,
        /// When, in UTC: `every 15m`, `hourly`, `hourly at :30`, `daily at
        /// 23:59`, `weekly on mon at 02:00`, `monthly on 1 at 00:00`
        #[arg(long, value_name = "SCHEDULE")]
        schedule: String,
        /// What to keep: counts per class, `hourly=24,daily=7,weekly=4,monthly=6`
        /// (also frequent=, yearly=), or a grid `1x1h(keep=all) | 24x1h | 14x1d`
        #[arg(long, value_name = "RETENTION")]
        keep: String,
        /// Snapshot names are PREFIX-YYYY-MM-DDTHH:MM:SSZ
        #[arg(long, default_value = "auto")]
        prefix: String,
        /// Warn when the newest scheduled snapshot is older [default: 2 periods]
        #[arg(long, value_name = "DURATION")]
        warn_age: Option<humantime::Duration>,
        /// Critical alert when it is older [default: 4 periods]
        #[arg(long, value_name = "DURATION")]
        crit_age: Option<humantime::Duration>,
        /// While the pool's data space is fuller than PERCENT (50-99), prune
        /// the oldest scheduled snapshots beyond retention
        #[arg(long, value_name = "PERCENT")]
        space_prune: Option<u8>,
    },
    /// Policies with their last and next run and how their prunes went
    #[command(alias = "list")]
    Show { volume: Option<String> },
    /// Remove the policy VOLUME is in (for all its volumes); the snapshots
    /// it made stay
    Clear { volume: String },
}

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Make a repository key file (offline): 32 random bytes as hex, mode
    /// 0600, never over an existing file. Keep a copy off this host: the
    /// backups cannot be read without it
    #[command(name = "new-key")]
    NewKey {
        /// Where to write it
        file: PathBuf,
    },
    /// Make a new, empty repository (offline: this talks to the store, not
    /// to the daemon)
    Init(BackupInitArgs),
    /// The repositories the daemon is configured with (backup_repositories)
    Repositories,
    /// Back up a snapshot into a repository the daemon is configured
    /// with: what changed since the last backup of an older snapshot of
    /// the volume, or everything the first time; answered when complete
    Create {
        /// The repository's name in backup_repositories
        repository: String,
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
    },
    /// The backups in a repository, oldest first
    List { repository: String },
    /// The backups, restores, verifies and prunes under way, with how far
    /// each is
    Jobs,
    /// Read a repository back and check it: every backup's map, and the
    /// packs (all, or a random sample) read whole and every blob in them
    /// authenticated and hashed back to its name; exit status 8 if
    /// anything is wrong
    Verify {
        repository: String,
        /// Percent of the packs to read, chosen at random each time
        #[arg(long, value_name = "PERCENT", default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100))]
        sample: u8,
    },
    /// Forget the backups a retention rule does not keep, and delete what
    /// no backup needs (packs partly used are repacked, small ones
    /// combined). Holds the
    /// repository's only lock: it waits for no backup and no backup starts
    /// while it runs
    Prune {
        repository: String,
        /// Which backups to keep, per volume and host: classes
        /// (`daily=7,weekly=4,monthly=12`) or a grid (`24x1h | 30x1d`);
        /// the newest of each is always kept. Without it no backup is
        /// forgotten
        #[arg(long, value_name = "RULE")]
        keep: Option<String>,
        /// List exactly what would be forgotten and deleted; change nothing
        #[arg(long)]
        dry_run: bool,
        /// Repack a pack when at least this percent of it is unused
        #[arg(long, value_name = "PERCENT", default_value_t = 25, value_parser = clap::value_parser!(u8).range(1..=100))]
        repack_unused: u8,
    },
    /// Restore a backup into a new volume, every block verified
    Restore {
        repository: String,
        /// The backup's id, or 8 or more of its first digits
        backup: String,
        /// The new volume
        volume: String,
        /// Serve the volume at once: reads fetch what has not arrived yet,
        /// and the restore goes on in the background (`arbor volume list`
        /// shows how far)
        #[arg(long)]
        instant: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct BackupInitArgs {
    /// s3://BUCKET[/PREFIX] or a directory
    pub url: String,
    /// The key file (`arbor backup new-key`)
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "passphrase_file",
        conflicts_with = "passphrase_file"
    )]
    pub key_file: Option<PathBuf>,
    /// A file whose first line is the passphrase (Argon2id derives the key)
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    /// Bytes per block: a power of two from 4K to 1M
    #[arg(long, value_name = "SIZE", default_value = "64K")]
    pub block_size: ByteSize,
    /// An S3 gateway that is not AWS: http(s)://HOST:PORT
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    #[arg(long)]
    pub region: Option<String>,
    /// TOML with access_key_id and secret_access_key [default: the AWS
    /// environment variables]
    #[arg(long, value_name = "FILE")]
    pub credentials_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ReplicaCommand {
    /// Replicate VOLUME to a target daemon's replication listener: a cycle
    /// at once, then every interval (snapshot, send what the target lacks,
    /// move the holds, prune)
    Add {
        volume: String,
        /// HOST:PORT[/REMOTE_VOLUME] of the target (default remote name: VOLUME)
        #[arg(long, value_name = "HOST:PORT[/VOLUME]")]
        target: String,
        /// Bytes per second at most, e.g. 50M
        #[arg(long, value_name = "RATE")]
        rate_limit: Option<ByteSize>,
        /// Time between cycles
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        interval: humantime::Duration,
        /// Replication snapshots kept here (the newest; held ones always stay)
        #[arg(long, value_name = "N")]
        keep: Option<u32>,
        /// The identity the target's certificate must carry [default: HOST]
        #[arg(long, value_name = "NAME")]
        identity: Option<String>,
        /// The target was seeded by hand (`arbor send` here, `arbor
        /// receive` there): never start over with a full stream
        #[arg(long)]
        seeded: bool,
    },
    /// Stop replicating VOLUME (to one target); its holds are released
    Remove {
        volume: String,
        #[arg(long, value_name = "HOST:PORT")]
        target: Option<String>,
    },
    /// Pairs and replicas: state, recovery point, bytes, progress, next run
    #[command(alias = "list")]
    Status,
    /// Run a cycle of VOLUME's pairs now and wait for it
    Run {
        volume: String,
        #[arg(long, value_name = "HOST:PORT")]
        target: Option<String>,
    },
    /// Roll a diverged target back to the newest common snapshot (deleting
    /// its own snapshots and writes since), then replicate
    Resync {
        volume: String,
        #[arg(long, value_name = "HOST:PORT")]
        target: Option<String>,
        /// Required: the target's divergent changes are lost
        #[arg(long)]
        force: bool,
    },
    /// Make a replica here the writable master (failover)
    Promote { volume: String },
    /// Make VOLUME here a read-only replica, waiting for a source (failback:
    /// the old master becomes a target of the new one)
    Demote {
        volume: String,
        /// Only list what a forced resync could discard once it is a
        /// replica; change nothing
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The snapshot to send
    #[arg(value_name = "VOLUME@SNAP", required_unless_present = "resume")]
    pub snapshot: Option<String>,
    /// Send only what differs from this snapshot (an ancestor, a sibling
    /// or a clone's origin); the receiver must have it
    #[arg(long, value_name = "VOLUME@SNAP", conflicts_with = "resume")]
    pub from: Option<String>,
    /// Where to write the stream: a file, or `-` for stdout
    #[arg(short, long, value_name = "FILE", default_value = "-")]
    pub output: PathBuf,
    /// Continue an interrupted stream: the token `arbor receive --status`
    /// prints on the receiving side
    #[arg(long, value_name = "TOKEN", conflicts_with = "snapshot")]
    pub resume: Option<String>,
    /// Print what the stream would carry, from the metadata, and send nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Data record encoding: none, zstd, or best (the smallest of raw, zstd
    /// and zstd against the base's data)
    #[arg(long, value_enum, default_value = "zstd")]
    pub compression: CompressionArg,
    /// zstd level, 1 to 19
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: i32,
    /// Stream format: arbor's own, or Ceph's `rbd diff` v1 for `rbd
    /// import-diff` (snapshot names instead of identities, raw data, no
    /// resume)
    #[arg(long, value_enum, default_value = "arbor")]
    pub format: FormatArg,
    /// Send an encrypted volume raw: its ciphertext and wrapped key, with
    /// no key loaded; the receiver stores it encrypted and cannot read it
    /// until the key is loaded there (data is not compressed)
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    Arbor,
    RbdDiff,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CompressionArg {
    None,
    Zstd,
    Best,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// The volume to receive into: created by a full stream, rolled forward
    /// to the new snapshot by an incremental one
    pub volume: String,
    /// Where to read the stream: a file, or `-` for stdin
    #[arg(short, long, value_name = "FILE", default_value = "-")]
    pub input: PathBuf,
    /// Roll the volume forward even if it was written since the stream's
    /// base (those writes are lost) or NBD clients have it open
    #[arg(long)]
    pub force: bool,
    /// Print the receive in progress into VOLUME and its resume token
    #[arg(long, conflicts_with_all = ["abort", "force"])]
    pub status: bool,
    /// Abandon the receive in progress into VOLUME
    #[arg(long, conflicts_with = "force")]
    pub abort: bool,
    /// Receive nothing: use the stream, of a snapshot of VOLUME this pool
    /// holds (the same identity), only to heal that snapshot's damaged
    /// blocks (those `arbor pool damage` lists); like `zfs receive -c`
    #[arg(long, conflicts_with_all = ["status", "abort", "force"])]
    pub heal: bool,
    /// Stream format: arbor's own, or Ceph's `rbd diff` (v1 or v2, from
    /// `rbd export-diff`): like `rbd import-diff`, VOLUME@FROM must exist
    /// and VOLUME@TO must not
    #[arg(long, value_enum, default_value = "arbor")]
    pub format: FormatArg,
}

/// Where the user's key comes from: a key file (32 bytes, or 64 hex
/// digits: `arbor key new FILE` makes one) or a passphrase, the first line
/// of a file (8 to 512 bytes; `-` reads it from standard input). A file
/// others than its owner may read is refused, as a backup key's is.
#[derive(Debug, clap::Args)]
#[group(id = "user_key", multiple = false)]
pub struct KeyArgs {
    /// The key: a file of 32 bytes or 64 hex digits (`-`: standard input,
    /// for a key service's tool piped in)
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// The key is a passphrase, read from FILE (`-`: standard input)
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
}

/// A new user's key (`key change`, a clone's own key): a key file or a
/// passphrase file, read as [`KeyArgs`] are.
#[derive(Debug, clap::Args)]
#[group(id = "new_user_key", multiple = false)]
pub struct NewKeyArgs {
    /// The new key: a file of 32 bytes or 64 hex digits (`-`: standard input)
    #[arg(long, value_name = "FILE")]
    pub new_key_file: Option<PathBuf>,
    /// The new key is a passphrase, read from FILE
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: Option<PathBuf>,
}

impl NewKeyArgs {
    /// Whether a new key was given.
    pub fn given(&self) -> bool {
        self.new_key_file.is_some() || self.new_passphrase_file.is_some()
    }

    /// The new key, to read as any key is.
    pub fn as_key(&self) -> KeyArgs {
        KeyArgs {
            key_file: self.new_key_file.clone(),
            passphrase_file: self.new_passphrase_file.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Load an encrypted volume's key: it, and every snapshot and clone
    /// that shares its key, are served again
    Load {
        /// The volume (or one of its snapshots or clones)
        name: String,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Unload an encrypted volume's key: it, and every snapshot and clone
    /// sharing it, stop serving (listed, locked) until it is loaded again
    Unload { name: String },
    /// Wrap the volume's data key with a new key (O(1): no data is
    /// rewritten); every snapshot and clone sharing it takes the new key
    Change {
        name: String,
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        new_key: NewKeyArgs,
    },
    /// Write a new random key (64 hex digits) to FILE, readable by its
    /// owner only; never overwrites
    New { file: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create an empty volume
    Create {
        name: String,
        /// Size, e.g. 20G or 1.5T (a multiple of 512 bytes)
        #[arg(long)]
        size: ByteSize,
        /// row: thin, space taken as written, snapshots share it
        /// (redirect-on-write); cow: the whole size allocated now in one
        /// contiguous run and written in place, snapshots take copies of
        /// what it overwrites (copy-on-write)
        #[arg(long, value_enum, default_value_t = arbor_api::model::CreateLayout::Row)]
        layout: arbor_api::model::CreateLayout,
        #[command(flatten)]
        qos: QosArgs,
        /// Encrypt its data (AES-256-XTS) with a new key of its own, wrapped
        /// by the key that --key-file or --passphrase-file gives; its
        /// snapshots and clones share it. Locked after every restart until
        /// `arbor key load`
        #[arg(long, requires = "user_key")]
        encrypt: bool,
        #[command(flatten)]
        key: KeyArgs,
        /// Bytes per encrypted unit: 4096 (the default; its NBD export
        /// advertises it as the minimum block size) or 512 (for clients that
        /// write 512-byte sectors without asking; 1 MiB requests cost more)
        #[arg(long, requires = "encrypt", value_parser = ["512", "4096"])]
        encryption_unit: Option<String>,
    },
    /// Change a volume's or snapshot's rate limits, live: every NBD
    /// connection to it is held to them from its next request; kept in
    /// the pool
    Set {
        /// A volume, or a snapshot VOLUME@SNAP
        name: String,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// List volumes, snapshots and clones with their space use
    List {
        /// Show the family tree: snapshots under their volume, clones under their snapshot
        #[arg(long)]
        tree: bool,
    },
    /// Grow or shrink a volume (shrinking discards the data past the new end)
    Resize { name: String, size: ByteSize },
    /// Space of one volume or snapshot: mapped, exclusive (what destroying frees), shared
    Stats { name: String },
}

/// Rate limits (per volume, over all its NBD connections): a positive
/// number, or `none` to remove the limit; a limit of 0 is refused.
#[derive(Debug, Clone, Default, Args)]
pub struct QosArgs {
    /// Operations per second, reads and writes together
    #[arg(long, value_name = "N|none", value_parser = parse_iops)]
    pub max_iops: Option<QosSetting>,
    /// Read operations per second
    #[arg(long, value_name = "N|none", value_parser = parse_iops)]
    pub max_read_iops: Option<QosSetting>,
    /// Write operations per second (write-zeroes and trims count as one)
    #[arg(long, value_name = "N|none", value_parser = parse_iops)]
    pub max_write_iops: Option<QosSetting>,
    /// Bytes per second, reads and writes together, e.g. 100M
    #[arg(long, value_name = "SIZE|none", value_parser = parse_bandwidth)]
    pub max_bandwidth: Option<QosSetting>,
    /// Bytes read per second, e.g. 100M
    #[arg(long, value_name = "SIZE|none", value_parser = parse_bandwidth)]
    pub max_read_bandwidth: Option<QosSetting>,
    /// Bytes written per second, e.g. 100M
    #[arg(long, value_name = "SIZE|none", value_parser = parse_bandwidth)]
    pub max_write_bandwidth: Option<QosSetting>,
    /// How long a burst above the limits may last after an idle spell, in
    /// seconds of each rate (0.001 to 60) [default: 1]
    #[arg(long, value_name = "SECONDS", value_parser = parse_burst)]
    pub burst: Option<u32>,
}

impl QosArgs {
    /// The change these flags ask for.
    pub fn request(&self) -> arbor_api::model::QosRequest {
        arbor_api::model::QosRequest {
            iops: self.max_iops.clone(),
            read_iops: self.max_read_iops.clone(),
            write_iops: self.max_write_iops.clone(),
            bandwidth: self.max_bandwidth.clone(),
            read_bandwidth: self.max_read_bandwidth.clone(),
            write_bandwidth: self.max_write_bandwidth.clone(),
            burst_ms: self.burst,
        }
    }
}

fn parse_limit(s: &str, parse: impl Fn(&str) -> Result<u64, String>) -> Result<QosSetting, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(QosSetting::Word("none".to_owned()));
    }
    match parse(s)? {
        0 => Err(
            "a limit of 0 would stop all I/O: give a positive rate, or none to remove the limit"
                .to_owned(),
        ),
        n => Ok(QosSetting::Limit(n)),
    }
}

fn parse_iops(s: &str) -> Result<QosSetting, String> {
    parse_limit(s, |s| {
        s.parse::<u64>()
            .map_err(|_| format!("{s:?} is not a whole number of operations per second, or none"))
    })
}

fn parse_bandwidth(s: &str) -> Result<QosSetting, String> {
    parse_limit(s, |s| {
        s.parse::<ByteSize>()
            .map(|b| b.0)
            .map_err(|e| format!("{s:?}: {e} (bytes per second, e.g. 100M, or none)"))
    })
}

fn parse_burst(s: &str) -> Result<u32, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    let ms = (secs * 1000.0).round();
    if !(1.0..=f64::from(arbor_format::MAX_BURST_MS)).contains(&ms) {
        return Err(format!("{s} s: give 0.001 to 60 seconds"));
    }
    Ok(ms as u32)
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take a read-only snapshot of a volume, in O(1); several names take
    /// them together, in one commit (a consistency group)
    Create {
        #[arg(value_name = "VOLUME@SNAP", required = true)]
        names: Vec<String>,
        /// Return before the snapshot is durable, without waiting for the
        /// device: the pool's next commit makes it so (a client's flush,
        /// any other command that commits, the commit interval); a power
        /// cut before then loses it whole, never part of it. A snapshot of
        /// a copy-on-write volume is always committed
        #[arg(long)]
        deferred: bool,
    },
    /// List snapshots, of one volume or of all
    List { volume: Option<String> },
}

#[derive(Debug, Subcommand)]
pub enum OriginCommand {
    /// Make a raw disk image file or block device the volume NAME, its
    /// data left in place: reads and writes go to it, snapshots and clones
    /// of it are ordinary arbor ones (copies of what they need are kept in
    /// the pool). Also attaches an origin's device again after a start
    /// that could not open it
    Attach {
        name: String,
        /// The file or block device (opened read-write and locked; the
        /// daemon opens it from here again at each start)
        path: PathBuf,
        /// Attach again an origin whose device shrank (it failed, and
        /// serves no I/O until then): accept that what it held past the
        /// size it shrank to is lost. Recorded; its snapshots taken before
        /// still fail reads of the lost bytes
        #[arg(long)]
        accept_damage: bool,
    },
    /// Remove origin NAME from the pool, leaving its file or device a
    /// plain raw disk with the volume's current content; refused while
    /// snapshots or clones of it exist
    Detach {
        name: String,
        /// Detach it even while NBD clients have it open (their I/O then fails)
        #[arg(long, conflicts_with = "copy_to_pool")]
        force: bool,
        /// Copy its data into the pool first (its whole size, in one free
        /// run), so that it stays a pool volume (layout cow) with its
        /// snapshots and clones, served on; the file or device is detached
        /// all the same
        #[arg(long)]
        copy_to_pool: bool,
    },
    /// Origins: path, size, attached or not, bytes copied for snapshots
    #[command(alias = "ls")]
    List,
}

#[derive(Debug, Subcommand)]
pub enum ScrubCommand {
    /// Start a scrub (or go on with a stopped one, from where it stopped);
    /// it runs in the daemon, at full speed while the pool serves no I/O
    /// and at `scrub_busy_rate` while it does, and goes on after a restart
    Start {
        /// Wait for it to finish, showing its progress; exit status 8 if it
        /// found damage
        #[arg(long)]
        wait: bool,
    },
    /// Where the scrub stands: progress, rate, time left, what it found
    Status,
    /// Stop the running scrub where it is (`scrub start` goes on from there)
    Stop,
    /// Scrub on a schedule kept in the pool, in the monitor's grammar
    /// (`every 1d`, `daily at 03:00`, `weekly on sun at 02:00`, `monthly on
    /// 1`): a new scrub starts when one is due and none runs
    #[command(arg_required_else_help = true)]
    Schedule {
        /// When, e.g. `weekly on sun at 02:00` (quoted or as separate words)
        #[arg(value_name = "SPEC", num_args = 1.., conflicts_with = "clear", required_unless_present = "clear")]
        spec: Vec<String>,
        /// Remove the schedule (a running scrub goes on)
        #[arg(long)]
        clear: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Format a file or block device as an empty pool (offline)
    Create(PoolCreateArgs),
    /// Size, space use, counts and warnings of the daemon's pool
    Status,
    /// Data blocks that do not match their checksums (reads of them fail
    /// with EIO), each with the volumes and snapshots that read it, and
    /// where; exit status 8 when there are any
    Damage,
    /// Reclaim all space of destroyed volumes now, instead of in the background
    Reclaim,
    /// Commit the pool now: every completed write, and every snapshot and
    /// clone taken with --deferred, is durable when it returns
    Flush,
    /// Grow the pool online onto more space: a pool file is enlarged to
    /// --size; a block device must be enlarged with its own tools first
    Grow(PoolGrowArgs),
    /// Convert a pool of an older format version to the newest (version 2
    /// grows, 3 sends, receives and holds, 4 keeps policies, 5 attaches
    /// origins); older arbor releases cannot open it afterwards
    Upgrade {
        /// Pool file or device not held by a daemon [default: the daemon's pool]
        path: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct PoolGrowArgs {
    /// Pool file or device not held by a daemon [default: the daemon's pool]
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// The pool's new size, e.g. 40G: a pool file is enlarged to it [default:
    /// the size of the file or device now]
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Metadata space among the added space [default: 1/64 of it, at least
    /// 128 bytes per added chunk]; give it to cure a full metadata space
    #[arg(long)]
    pub metadata_size: Option<ByteSize>,
}

#[derive(Debug, Args)]
pub struct PoolCreateArgs {
    /// File (created sparse if missing) or block device
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// Pool size for a file, e.g. 100G; a device is used whole
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Data chunk size: the unit of allocation and copy-on-write (4K to 1M)
    /// [default: 16K]
    #[arg(long)]
    pub chunk_size: Option<ByteSize>,
    /// Space for metadata [default: 1/64 of the pool, at least 64 MiB]
    #[arg(long)]
    pub metadata_size: Option<ByteSize>,
    /// On-disk format version: 1 only for a pool that older arbor releases
    /// must open (it cannot grow until `arbor pool upgrade`)
    #[arg(
        long,
        value_name = "VERSION",
        default_value_t = arbor_format::FORMAT_VERSION,
        value_parser = clap::value_parser!(u16)
            .range(i64::from(arbor_format::OLDEST_FORMAT_VERSION)..=i64::from(arbor_format::FORMAT_VERSION))
    )]
    pub format_version: u16,
    /// Overwrite an existing pool or other data
    #[arg(long)]
    pub force: bool,
}

/// `arbor serve` flags; each overrides the config file key of the same
/// name (with `_` for `-`), which overrides the built-in default.
#[derive(Debug, Clone, Args, Default)]
pub struct ServeArgs {
    /// TOML config file (`arbor serve --print-config` shows every key)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit
    #[arg(long)]
    pub print_config: bool,
    /// Pool file or block device [default: DATA_DIR/pool]
    #[arg(long, value_name = "PATH")]
    pub pool: Option<PathBuf>,
    /// Size of a pool file created on first start [default: 20G]
    #[arg(long, value_name = "SIZE")]
    pub pool_size: Option<ByteSize>,
    /// Chunk size of a pool created on first start [default: 16K]
    #[arg(long, value_name = "SIZE")]
    pub chunk_size: Option<ByteSize>,
    /// NBD on TCP: an address, or `none` [default: 127.0.0.1:10809]
    #[arg(long, value_name = "ADDR")]
    pub nbd_listen: Option<String>,
    /// The HTTP API on TCP: an address (beyond loopback only with TLS), or
    /// `none` [default: 127.0.0.1:10810]
    #[arg(long, value_name = "ADDR")]
    pub api_listen: Option<String>,
    /// Replication listener on TCP: an address, or `none` [default: none]
    #[arg(long, value_name = "ADDR")]
    pub replication_listen: Option<String>,
    /// Volume created with a new pool, or `none` [default: disk0]
    #[arg(long, value_name = "NAME")]
    pub initial_volume: Option<String>,
    /// Size of that volume [default: 10G]
    #[arg(long, value_name = "SIZE")]
    pub initial_volume_size: Option<ByteSize>,
    /// Background reclaim pace in metadata nodes per second; 0 turns it off [default: 2000]
    #[arg(long, value_name = "NODES")]
    pub reclaim_rate: Option<u32>,
    /// Commit at least this often, bounding what a crash can lose [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub commit_interval: Option<humantime::Duration>,
    /// Memory for cached metadata [default: 64M]
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<ByteSize>,
    /// How the pool's device is reached: `direct` (O_DIRECT, no host page
    /// cache), `buffered`, or `auto` (direct on a block device, buffered on
    /// a file) [default: auto]
    #[arg(long, value_name = "MODE", value_parser = ["auto", "direct", "buffered"])]
    pub io: Option<String>,
}

impl ServeArgs {
    /// What these flags set over the daemon's config file.
    pub fn overrides(&self) -> arbor_daemon::config::Overrides {
        arbor_daemon::config::Overrides {
            config: self.config.clone(),
            pool: self.pool.clone(),
            pool_size: self.pool_size,
            chunk_size: self.chunk_size,
            nbd_listen: self.nbd_listen.clone(),
            api_listen: self.api_listen.clone(),
            replication_listen: self.replication_listen.clone(),
            initial_volume: self.initial_volume.clone(),
            initial_volume_size: self.initial_volume_size,
            reclaim_rate: self.reclaim_rate,
            commit_interval: self.commit_interval.map(Into::into),
            cache_size: self.cache_size,
            io: self.io.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
