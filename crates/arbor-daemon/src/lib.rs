//! The arbor daemon as a library: `arbor serve` is [`serve`] with a
//! [`config::ServeConfig`]. One process owns a pool and serves it: the
//! HTTP API (`api`, its handlers, `auth`), NBD exports (`nbd_export`),
//! replication, the monitor, metrics, alerts and the dashboard, and the
//! background work (commits, reclaim, watches). `pool_file` opens and
//! formats pools for the offline commands too.
//!
//! The API's model and client are `arbor-api`'s; the command line is the
//! `arbor` binary's.

mod alerts;
mod api;
mod api_error;
mod auth;
mod background;
mod backup_jobs;
mod backup_schedule;
mod backups;
mod clock;
pub mod config;
mod control;
mod destroy;
mod devices;
pub mod error;
mod handler;
mod history;
mod in_use;
mod incoming;
pub mod keys;
mod listen;
mod metrics;
mod monitor;
mod monitor_api;
mod nbd_export;
mod origins;
pub mod pool_file;
mod qos;
mod reload;
mod replica_api;
mod replication;
mod restores;
mod scrub;
mod serve;
mod space;
mod stream;
mod systemd;
mod token_api;
mod tokens;
pub mod views;

pub use api_error::{code_of, code_of_engine};
pub use backups::code_of as backup_code_of;
pub use error::DaemonError;
pub use monitor::unix_now;
pub use reload::Source as ConfigSource;
pub use serve::serve;
