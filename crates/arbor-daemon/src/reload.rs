//! Changing the configuration while the daemon runs (`arbor config
//! reload`, `POST /v1/config/reload`, SIGHUP, `systemctl reload arbor`;
//! docs/SERVICE.md, "Reload").
//!
//! A reload reads the configuration as the daemon started with it (the
//! same file, the same command-line flags over it) and first checks all
//! of it: the file, every key, the certificate files and the revocation
//! lists, the token file. Anything wrong refuses the reload and changes
//! nothing. Then it puts in force what can change live, each in one
//! assignment:
//!
//! - the certificates (tls_ca, tls_cert, tls_key, tls_crl), for the next
//!   connection of every TLS listener and of replication out;
//! - `nbd_tls` and `nbd_access`: NBD sessions the new grants no longer
//!   cover (or whose certificate the new CA bundle or revocation list
//!   refuses) are closed (`arbor_nbd::LiveSecurity`);
//! - `api_clients`, from each connection's next request;
//! - `replication_allow`, from the next session;
//! - `reclaim_rate` and `scrub_busy_rate`, from the next step;
//! - the API tokens' file, read again.
//!
//! Keys that need a restart (listen addresses, sizes, the pool, whether a
//! listener has TLS at all, this host's replication identity) keep their
//! running values; the answer names each one that differs, with its old
//! and new value, until the daemon restarts. Reloads run one at a time.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use anyhow::Context;
use arbor_api::model::{ClosedSessionView, ReloadView};
use arbor_tls::Tls;
use tracing::{info, warn};

use crate::auth::Auth;
use crate::config::{self, Overrides, ServeConfig};
use crate::error::{DaemonError, Result};
use crate::replication::Replication;
use crate::scrub::Scrub;

/// A value a reload replaces, read by each use.
pub struct Shared<T: Clone>(RwLock<T>);

impl<T: Clone> Shared<T> {
    pub fn new(value: T) -> Arc<Self> {
        Arc::new(Self(RwLock::new(value)))
    }

    pub fn get(&self) -> T {
        // Replaced whole: a poisoned lock still holds a whole value.
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = value;
    }
}

/// Where the configuration comes from: what `arbor serve` was given.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub data_dir: Option<PathBuf>,
    pub overrides: Overrides,
}

/// The parts of the running daemon a reload changes.
pub struct Live {
    /// The NBD TCP listener's security (none: no TCP listener).
    pub nbd: Option<Arc<arbor_nbd::LiveSecurity>>,
    /// The API TCP listener's certificates (none: no HTTPS listener).
    pub api_tls: Option<Arc<Shared<Tls>>>,
    pub auth: Arc<Auth>,
    pub replication: Arc<Replication>,
    pub scrub: Arc<Scrub>,
    pub reclaim_rate: Arc<AtomicU32>,
    pub backups: Arc<crate::backups::Backups>,
    /// Encrypted volumes' keys: the configured ones still locked load.
    pub keys: Arc<crate::keys::Keys>,
}

/// Reloads the configuration into the running daemon.
pub struct Reloader {
    source: Source,
    /// As the daemon started: what restart-only keys are compared with.
    started: ServeConfig,
    /// As last put in force; held across a reload, so reloads run one at
    /// a time.
    applied: Mutex<ServeConfig>,
    live: Live,
}

/// The keys only a restart changes, with their values (Debug text).
fn restart_keys(c: &ServeConfig) -> Vec<(&'static str, String)> {
    fn v(value: &impl Debug) -> String {
        format!("{value:?}")
    }
    vec![
        ("data_dir", v(&c.data_dir)),
        ("pool", v(&c.pool)),
        ("pool_size", v(&c.pool_size)),
        ("chunk_size", v(&c.chunk_size)),
        ("initial_volume", v(&c.initial_volume)),
        ("nbd_listen", v(&c.nbd_listen)),
        ("nbd_max_connections", v(&c.nbd_max_connections)),
        ("nbd_memory_limit", v(&c.nbd_memory_limit)),
        ("nbd_stall_timeout", v(&c.nbd_stall_timeout)),
        ("nbd_poll", v(&c.nbd_poll)),
        ("api_listen", v(&c.api.listen)),
        ("api_max_connections", v(&c.api.max_connections)),
        ("commit_interval", v(&c.commit_interval)),
        ("history_interval", v(&c.history_interval)),
        ("cache_size", v(&c.cache_bytes)),
        ("io", v(&c.io)),
        ("space_warning_percent", v(&c.space_warning_percent)),
        ("replication_listen", v(&c.replication.listen)),
        ("replication_identity", v(&c.replication.identity)),
        ("replication_timeout", v(&c.replication.timeout)),
        // Whether TLS is on at all (its files' contents are live).
        ("tls (on or off)", v(&c.tls.is_some())),
    ]
}

/// The keys a reload puts in force, with their values (Debug text).
fn live_keys(c: &ServeConfig) -> Vec<(&'static str, String)> {
    fn v(value: &impl Debug) -> String {
        format!("{value:?}")
    }
    vec![
        ("tls_ca", v(&c.tls.as_ref().map(|t| &t.ca))),
        ("tls_cert", v(&c.tls.as_ref().map(|t| &t.cert))),
        ("tls_key", v(&c.tls.as_ref().map(|t| &t.key))),
        ("tls_crl", v(&c.tls.as_ref().map(|t| &t.crl))),
        ("nbd_tls", v(&c.nbd_tcp_security.mode)),
        ("nbd_access", v(&c.nbd_tcp_security.access)),
        ("api_clients", v(&c.api.clients)),
        ("replication_allow", v(&c.replication.allow)),
        ("reclaim_rate", v(&c.reclaim_rate)),
        ("scrub_busy_rate", v(&c.scrub_busy_rate)),
        (
            "backup_repositories",
            v(&(&c.backup_repositories, &c.backup_schedules)),
        ),
        ("volume_keys", v(&c.volume_keys)),
    ]
}

/// The names of the keys whose values differ between `old` and `new`, by
/// `keys`, with both values when `values`.
fn differing(
    keys: fn(&ServeConfig) -> Vec<(&'static str, String)>,
    old: &ServeConfig,
    new: &ServeConfig,
    values: bool,
) -> Vec<String> {
    keys(old)
        .into_iter()
        .zip(keys(new))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, a), (_, b))| {
            if values {
                format!("{name}: {a} -> {b}")
            } else {
                name.to_owned()
            }
        })
        .collect()
}

/// The NBD TCP listener's security from `config`, with `tls` loaded from
/// its files.
pub fn nbd_security(config: &ServeConfig, tls: Option<Tls>) -> anyhow::Result<arbor_nbd::Security> {
    let security = &config.nbd_tcp_security;
    let certificates = match security.mode {
        arbor_nbd::TlsMode::Off => None,
        _ => tls,
    };
    arbor_nbd::Security::new(security.mode, certificates, security.access.clone())
        .context("NBD TLS")
}

fn refused(e: impl std::fmt::Display) -> DaemonError {
    DaemonError::Invalid(format!(
        "the configuration was not reloaded, nothing changed: {e}"
    ))
}

impl Reloader {
    pub fn new(source: Source, started: ServeConfig, live: Live) -> Arc<Self> {
        Arc::new(Self {
            source,
            applied: Mutex::new(started.clone()),
            started,
            live,
        })
    }

    /// Reads the configuration again and puts in force what can change
    /// live; an invalid one changes nothing and says why.
    pub fn reload(&self) -> Result<ReloadView> {
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        // Everything is read and checked before anything changes.
        let (new, _) = config::load(self.source.data_dir.clone(), &self.source.overrides)
            .map_err(|e| refused(format!("{e:#}")))?;
        let tls = match &new.tls {
            Some(files) => Some(Tls::load(files).map_err(refused)?),
            None => None,
        };
        let mut restart_needed = differing(restart_keys, &self.started, &new, true);
        let nbd = match &self.live.nbd {
            Some(_) => {
                Some(nbd_security(&new, tls.clone()).map_err(|e| refused(format!("{e:#}")))?)
            }
            None => None,
        };
        self.live
            .auth
            .tokens
            .check()
            .map_err(|e| refused(format!("{e:#}")))?;
        // Replication keeps its certificates unless the new ones have this
        // host's identity (peers know it by that name).
        let replication_tls = match (&tls, self.live.replication.has_tls()) {
            (Some(tls), true) if tls.identity() == self.live.replication.identity() => {
                Some(tls.clone())
            }
            (Some(tls), true) => {
                restart_needed.push(format!(
                    "tls_cert (this host's replication identity): {:?} -> {:?}; replication \
                     keeps the running certificates",
                    self.live.replication.identity(),
                    tls.identity()
                ));
                None
            }
            _ => None,
        };

        // Put in force.
        let closed = match (&self.live.nbd, nbd) {
            (Some(live), Some(security)) => live.replace(security),
            _ => Vec::new(),
        };
        if let (Some(api), Some(tls)) = (&self.live.api_tls, &tls) {
            api.set(tls.clone());
        }
        self.live.auth.set_clients(&new.api.clients);
        let withdrawn = self
            .live
            .replication
            .reload(replication_tls, new.replication.allow.clone());
        self.live
            .reclaim_rate
            .store(new.reclaim_rate, Ordering::Relaxed);
        self.live.scrub.set_busy_rate(new.scrub_busy_rate);
        self.live
            .backups
            .set(&new.backup_repositories, new.backup_schedules.clone());
        let tokens = match self.live.auth.tokens.reread() {
            Ok(n) => n,
            Err(e) => {
                // Checked above: changed meanwhile; the loaded ones stay.
                warn!(
                    error = format!("{e:#}"),
                    "the API tokens' file changed during the reload: the tokens loaded before stay"
                );
                self.live.auth.tokens.count()
            }
        };
        // Configured keys of volumes locked now (keys configured since,
        // volumes received since): each loads or is logged and left.
        let (keys_loaded, keys_failed) = self.live.keys.load_configured(&new.volume_keys);
        let changed = differing(live_keys, &applied, &new, false);
        let view = ReloadView {
            keys_loaded,
            keys_failed: keys_failed
                .into_iter()
                .map(|(volume, reason)| format!("{volume}: {reason}"))
                .collect(),
            changed,
            restart_needed,
            tls_reloaded: tls.is_some(),
            revoked_certificates: tls.as_ref().map_or(0, Tls::revoked_certificates),
            closed_sessions: closed
                .into_iter()
                .map(|c| ClosedSessionView {
                    identity: c.identity,
                    volume: c.export,
                    reason: c.why,
                })
                .collect(),
            withdrawn_replications: withdrawn
                .into_iter()
                .map(|w| ClosedSessionView {
                    identity: Some(w.peer),
                    volume: w.volume,
                    reason: w.reason,
                })
                .collect(),
            tokens,
        };
        *applied = new;
        info!(
            changed = ?view.changed,
            closed_sessions = view.closed_sessions.len(),
            withdrawn_replications = view.withdrawn_replications.len(),
            revoked_certificates = view.revoked_certificates,
            "configuration reloaded"
        );
        if !view.restart_needed.is_empty() {
            warn!(keys = ?view.restart_needed, "configuration reloaded: these changes take effect at the next restart");
        }
        Ok(view)
    }
}
