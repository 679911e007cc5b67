//! The command line.
//!
//! Management commands name their pool first (`arbor create POOL VOLUME`).
//! With the global `--daemon SOCKET` they go to a running daemon instead,
//! and the pool is left out (`arbor --daemon SOCKET create VOLUME`): the
//! commands are generic over that first argument, [`PoolPath`] or
//! [`ViaDaemon`], and `main` picks one before parsing.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::size::ByteSize;

#[derive(Debug, Parser)]
#[command(
    name = "arbor",
    version,
    about = "Thin volumes with O(1) snapshots and clones, served over NBD"
)]
pub struct Cli<T: Args> {
    /// Manage the pool through the daemon whose API is at this Unix socket
    /// or IP:PORT (leave out POOL)
    #[arg(long, global = true, value_name = "ADDRESS")]
    pub daemon: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command<T>,
}

/// Whether the command line asks for daemon mode; decides how to parse it.
pub fn wants_daemon(args: &[OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .filter_map(|a| a.to_str())
        .any(|a| a == "--daemon" || a.starts_with("--daemon="))
}

/// The pool argument of a command run in this process.
#[derive(Debug, Args)]
pub struct PoolPath {
    /// Pool file or block device
    #[arg(value_name = "POOL")]
    pub pool: PathBuf,
}

/// No pool argument: the daemon named by `--daemon` has the pool.
#[derive(Debug, Args)]
pub struct ViaDaemon {}

#[derive(Debug, Subcommand)]
pub enum Command<T: Args> {
    /// Create a pool or show its state
    Pool {
        #[command(subcommand)]
        command: PoolCommand<T>,
    },
    #[command(flatten)]
    Manage(ManageCommand<T>),
    /// Run the daemon: hold the pool open, serve the control API and NBD
    Serve(ServeArgs),
}

/// Commands that act on a pool through a [`Control`](crate::control::Control) session.
#[derive(Debug, Subcommand)]
pub enum ManageCommand<T: Args> {
    /// Verify the whole pool; exits with status 1 if any problem is found
    Check {
        #[command(flatten)]
        target: T,
        #[arg(long)]
        json: bool,
    },
    /// Reclaim all space of deleted volumes now
    Reclaim {
        #[command(flatten)]
        target: T,
    },
    /// Create an empty thin volume
    Create {
        #[command(flatten)]
        target: T,
        volume: String,
        /// Size, e.g. 10G (a multiple of 512 bytes)
        #[arg(long)]
        size: ByteSize,
    },
    /// Take a read-only snapshot VOLUME@SNAP of a volume
    Snapshot {
        #[command(flatten)]
        target: T,
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
    },
    /// Create a writable volume from a snapshot
    Clone {
        #[command(flatten)]
        target: T,
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
        #[arg(value_name = "NEW")]
        name: String,
    },
    /// Delete a volume or snapshot; its space is reclaimed in the background
    Delete {
        #[command(flatten)]
        target: T,
        name: String,
    },
    /// Make a volume read exactly as one of its snapshots
    Rollback {
        #[command(flatten)]
        target: T,
        volume: String,
        #[arg(value_name = "VOLUME@SNAP")]
        snapshot: String,
    },
    /// Grow or shrink a volume (shrinking discards the data past the new end)
    Resize {
        #[command(flatten)]
        target: T,
        volume: String,
        size: ByteSize,
    },
    /// Rename a volume (its snapshots follow) or a snapshot
    Rename {
        #[command(flatten)]
        target: T,
        from: String,
        to: String,
    },
    /// List volumes and snapshots
    List {
        #[command(flatten)]
        target: T,
        #[arg(long)]
        json: bool,
    },
    /// Space used by a volume or snapshot
    Stats {
        #[command(flatten)]
        target: T,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Byte ranges where two volumes or snapshots differ
    Diff {
        #[command(flatten)]
        target: T,
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Copy a raw image into a volume, creating it if missing; all-zero chunks are skipped
    Import {
        #[command(flatten)]
        target: T,
        volume: String,
        file: PathBuf,
    },
    /// Write a volume or snapshot to a raw image; unmapped ranges stay holes
    Export {
        #[command(flatten)]
        target: T,
        name: String,
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand<T: Args> {
    /// Format a file or block device as an empty pool
    Create(PoolCreateArgs),
    /// Pool size, space use and counts
    Info {
        #[command(flatten)]
        target: T,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PoolCreateArgs {
    /// File (created sparse if missing) or block device
    #[arg(value_name = "POOL")]
    pub pool: PathBuf,
    /// Pool size for a file, e.g. 100G; a device is used whole
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Data chunk size: the unit of allocation and copy-on-write (4K to 1M)
    /// [default: the engine's, 16K]
    #[arg(long)]
    pub chunk_size: Option<ByteSize>,
    /// Space for metadata [default: 1/64 of the pool, at least 64 MiB]
    #[arg(long)]
    pub metadata_size: Option<ByteSize>,
    /// Overwrite an existing pool or other data
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Pool file or block device
    #[arg(value_name = "POOL")]
    pub pool: PathBuf,
    /// Serve the control API on this Unix socket (mode 0600)
    #[arg(long, value_name = "PATH", conflicts_with = "api")]
    pub api_socket: Option<PathBuf>,
    /// Serve the control API on this loopback address, e.g. 127.0.0.1:7070
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,
    /// Serve every volume and snapshot over NBD on this Unix socket (mode 0600)
    #[arg(long, value_name = "PATH")]
    pub nbd_socket: Option<PathBuf>,
    /// Serve NBD on this TCP address, e.g. 127.0.0.1:10809 (no authentication!)
    #[arg(long, value_name = "ADDR")]
    pub nbd_tcp: Option<SocketAddr>,
    /// Background reclaim pace in metadata nodes per second (0 turns it off)
    #[arg(long, default_value_t = 2000, value_name = "NODES")]
    pub reclaim_rate: u32,
    /// Commit at least this often, bounding what a crash can lose
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub commit_interval: humantime::Duration,
    /// Memory for cached metadata
    #[arg(long, default_value = "64M", value_name = "SIZE")]
    pub cache_size: ByteSize,
}

impl<T: Args> Command<T> {
    /// Commands that work on a pool path even in daemon mode, which they
    /// cannot use.
    pub fn is_local_only(&self) -> Option<&'static str> {
        match self {
            Command::Pool {
                command: PoolCommand::Create(_),
            } => Some("pool create"),
            Command::Serve(_) => Some("serve"),
            _ => None,
        }
    }
}

impl<T: Args> ManageCommand<T> {
    pub fn target(&self) -> &T {
        match self {
            Self::Check { target, .. }
            | Self::Reclaim { target }
            | Self::Create { target, .. }
            | Self::Snapshot { target, .. }
            | Self::Clone { target, .. }
            | Self::Delete { target, .. }
            | Self::Rollback { target, .. }
            | Self::Resize { target, .. }
            | Self::Rename { target, .. }
            | Self::List { target, .. }
            | Self::Stats { target, .. }
            | Self::Diff { target, .. }
            | Self::Import { target, .. }
            | Self::Export { target, .. } => target,
        }
    }
}
