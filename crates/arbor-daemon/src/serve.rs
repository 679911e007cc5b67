//! `arbor serve`: one process owns the pool and serves it (control API,
//! metrics, NBD exports, housekeeping) until a signal.
//!
//! Startup binds every listener before serving anything, so a bad address
//! fails fast. Shutdown (SIGINT, SIGTERM, or a fatal background error) stops
//! accepting, lets in-flight requests finish, stops housekeeping, and closes
//! the pool with a final commit.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use anyhow::{Context, Result};
use arbor_engine::{CreateOptions, OpenOptions};
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::ServeConfig;
use crate::control::PoolControl;
use crate::destroy::Destroyer;
use crate::in_use::InUse;
use crate::listen::{ApiListeners, NbdListeners};
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::nbd_export::{OpenExports, PoolExports};
use crate::origins::Origins;
use crate::pool_file::OpenPool;
use crate::reload::{Live, Reloader, Source};
use crate::space::SpaceWatch;
use crate::stream::Streams;
use crate::{api, auth, background, replication};

/// Serves the pool as `config` says; `source` is where `config` came
/// from, read again by a reload (SIGHUP, `arbor config reload`).
pub fn serve(config: ServeConfig, source: Source) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(config, source))
}

/// Opens the pool, or creates it (with its initial volume) when its file
/// does not exist yet. An existing file or device is never formatted here.
fn open_or_create(config: &ServeConfig) -> Result<OpenPool> {
    let options = OpenOptions {
        cache_bytes: config.cache_bytes,
        ..OpenOptions::default()
    };
    if config.pool.exists() {
        return Ok(OpenPool::open(&config.pool, &options, config.io)?);
    }
    let create = CreateOptions {
        chunk_size: config.chunk_size,
        metadata_bytes: None,
        ..Default::default()
    };
    let open = OpenPool::create(
        &config.pool,
        Some(config.pool_size),
        &create,
        &options,
        config.io,
        false,
    )?;
    info!(pool = %config.pool.display(), size = config.pool_size, "created a new pool");
    if let Some((name, size)) = &config.initial_volume {
        open.pool
            .create_volume(name, *size)
            .with_context(|| format!("cannot create the initial volume {name}"))?;
        info!(volume = %name, size, "created the initial volume");
    }
    Ok(open)
}

fn prepare_data_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create data directory {}", dir.display()))
}

async fn run(config: ServeConfig, source: Source) -> Result<()> {
    prepare_data_dir(&config.data_dir)?;
    let setup = config.clone();
    let open = tokio::task::spawn_blocking(move || open_or_create(&setup))
        .await
        .context("opening the pool failed")??;
    // NBD first: once the API answers, NBD is bound too.
    let nbd_tls = match (&config.tls, config.nbd_tcp_security.mode) {
        (_, arbor_nbd::TlsMode::Off) | (None, _) => None,
        (Some(files), _) => Some(arbor_tls::Tls::load(files).context("NBD TLS")?),
    };
    let nbd = NbdListeners::bind(
        &config.nbd_socket(),
        config.nbd_listen,
        crate::reload::nbd_security(&config, nbd_tls)?,
    )
    .await?;
    let api = ApiListeners::bind(&config.api_socket(), &config.api).await?;
    let auth = auth::Auth::open(&config.data_dir, &config.api)?;

    let stop = CancellationToken::new();
    let sending = Arc::new(arbor_stream::busy::Pins::default());
    let receiving = Arc::new(arbor_stream::busy::Claims::default());
    let replication = replication::Replication::new(
        open.pool.clone(),
        &config.data_dir,
        &config.replication,
        sending.clone(),
        receiving.clone(),
        stop.clone(),
    )?;
    let replication_listener = replication.bind().await?;
    let metrics = Metrics::new();
    let observer = metrics.clone();
    open.pool
        .observe_commits(Box::new(move |took| observer.observe_commit(took)));
    let open_exports = Arc::new(OpenExports::default());
    let pins = Arc::clone(&sending);
    let in_use = InUse::new(Arc::clone(&open_exports), sending);
    let space = SpaceWatch::new(config.space_warning_percent.clone());
    let origins = Origins::new(
        Arc::clone(&open.pool),
        open.path.clone(),
        config.io,
        in_use.clone(),
        Arc::clone(&metrics),
    );
    let destroyer = Destroyer::new(
        Arc::clone(&open.pool),
        in_use.clone(),
        origins.clone(),
        Arc::clone(&metrics),
    );
    let restores = Arc::new(crate::restores::LiveRestores::default());
    let backups = crate::backups::Backups::new(
        &config.backup_repositories,
        config.backup_schedules.clone(),
        config.replication.identity.clone(),
        Arc::clone(&open.pool),
        pins,
        destroyer.clone(),
        Arc::clone(&restores),
    );
    backups.recover_restores()?;
    let qos = crate::qos::Qos::new(Arc::clone(&open.pool));
    let scrub = Arc::new(crate::scrub::Scrub::load(
        Arc::clone(&open.pool),
        config.scrub_busy_rate,
    ));
    let monitor = Arc::new(Monitor::new(
        Arc::clone(&open.pool),
        Arc::clone(&replication),
        space.clone(),
        in_use.clone(),
        destroyer.clone(),
        Arc::clone(&scrub),
        Arc::clone(&backups),
    ));
    let control = PoolControl::new(
        &open,
        in_use.clone(),
        destroyer,
        Arc::clone(&metrics),
        space.clone(),
        crate::control::Background {
            replication: Arc::clone(&replication),
            monitor: Arc::clone(&monitor),
            scrub: Arc::clone(&scrub),
            qos: Arc::clone(&qos),
            restores: Arc::clone(&restores),
        },
    );
    // Before anything is served: origins' devices from their recorded
    // paths (one that cannot be opened is logged and stays unattached).
    let reattach = origins.clone();
    tokio::task::spawn_blocking(move || reattach.attach_recorded_origins())
        .await
        .context("attaching origins failed")??;
    // Encrypted volumes whose keys are configured are served from the
    // start (a key that fails is logged; its volume stays locked).
    if !config.volume_keys.is_empty() {
        let (keys, configured) = (control.keys(), config.volume_keys.clone());
        let (loaded, failed) =
            tokio::task::spawn_blocking(move || keys.load_configured(&configured))
                .await
                .context("loading the configured keys failed")?;
        info!(loaded = ?loaded, failed = failed.len(), "configured keys of encrypted volumes");
    }
    let mut tasks = JoinSet::new();
    info!(pool = %open.path.display(), io = open.cache_mode.name(), api = %api, nbd = %nbd, "serving");
    println!("{}", connection_hints(&config, &control)?);
    let exports = PoolExports::new(
        open.pool.clone(),
        open_exports,
        metrics.clone(),
        replication.store.clone(),
        Arc::clone(&qos),
        open.cache_mode,
        restores,
    );
    let limits = arbor_nbd::ServerConfig {
        max_connections: config.nbd_max_connections,
        max_bytes_total: config.nbd_memory_limit,
        reply_stall_timeout: config.nbd_stall_timeout,
        poll: arbor_nbd::PollLimits::per_cpu(config.nbd_poll),
        ..arbor_nbd::ServerConfig::default()
    };
    let nbd_security = nbd.live_security();
    tasks.spawn(nbd.serve(exports, limits, stop.clone()));
    tasks.spawn(background::commit_periodically(
        open.pool.clone(),
        config.commit_interval,
        stop.clone(),
    ));
    tasks.spawn(background::watch_origins(open.pool.clone(), stop.clone()));
    tasks.spawn(background::watch_space(
        Arc::clone(&open.pool),
        space,
        config.commit_interval,
        stop.clone(),
    ));
    tasks.spawn(Arc::clone(&scrub).run(stop.clone()));
    tasks.spawn(Arc::clone(&backups).run_schedules(stop.clone()));
    let reclaim_rate = Arc::new(AtomicU32::new(config.reclaim_rate));
    tasks.spawn(background::reclaim_paced(
        Arc::clone(&open.pool),
        Arc::clone(&metrics),
        Arc::clone(&reclaim_rate),
        stop.clone(),
    ));
    let reloader = Reloader::new(
        source,
        config.clone(),
        Live {
            nbd: nbd_security,
            api_tls: api.live_tls(),
            auth: Arc::clone(&auth),
            replication: Arc::clone(&replication),
            scrub: Arc::clone(&scrub),
            reclaim_rate,
            backups: Arc::clone(&backups),
            keys: control.keys(),
        },
    );
    tasks.spawn(reload_on_hangup(Arc::clone(&reloader), stop.clone()));
    let history = crate::history::History::new(config.history_interval);
    tasks.spawn(Arc::clone(&history).run(
        Arc::clone(&open.pool),
        Arc::clone(&metrics),
        stop.clone(),
    ));
    let monitor_run = Arc::clone(&monitor).run(stop.clone());
    tasks.spawn(async move { Ok(monitor_run.await?) });
    let names = api.tls_names();
    let services = api::Services {
        control,
        origins,
        monitor,
        replication: Arc::clone(&replication),
        streams: Streams::new(
            Arc::clone(&open.pool),
            in_use,
            receiving,
            Arc::clone(&replication),
        ),
        pool: Arc::clone(&open.pool),
        history,
        reloader,
        backups: Arc::clone(&backups),
    };
    tasks.spawn(api.serve(api::router(services, auth, names), stop.clone()));
    if let Some(listener) = replication_listener {
        info!(listen = ?listener.local_addr().ok(), "replication listener");
        tasks.spawn(replication.clone().serve(listener));
    }
    replication.start_pairs();
    // Every listener is bound (before the tasks that accept on them). Ready
    // is said before the watchdog task exists: its first ping, on another
    // thread, came before READY=1 in a CI run.
    crate::systemd::ready(&format!("serving {}", open.path.display()));
    tasks.spawn(crate::systemd::watchdog(
        Arc::clone(&open.pool),
        stop.clone(),
    ));

    let served = supervise(&mut tasks, &stop, termination_signal()).await;
    crate::systemd::stopping();
    replication.stop_pairs().await;
    info!("closing the pool");
    let closed = tokio::task::spawn_blocking(move || open.close())
        .await
        .context("closing the pool failed")?;
    served.and(Ok(closed?))
}

/// Reloads the configuration at each SIGHUP (`systemctl reload arbor`),
/// telling the service manager while it does; a reload refused is logged
/// with why, and the daemon runs on as it was.
async fn reload_on_hangup(reloader: Arc<Reloader>, stop: CancellationToken) -> Result<()> {
    let mut hangup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            received = hangup.recv() => if received.is_none() {
                return Ok(());
            },
        }
        info!("SIGHUP: reloading the configuration");
        crate::systemd::reloading();
        let reload = Arc::clone(&reloader);
        match tokio::task::spawn_blocking(move || reload.reload()).await {
            Ok(Ok(_)) => crate::systemd::reloaded("configuration reloaded"),
            Ok(Err(e)) => {
                error!(
                    error = format!("{e:#}"),
                    "SIGHUP: the configuration was not reloaded"
                );
                crate::systemd::reloaded("the last reload was refused: see the log");
            }
            Err(e) => return Err(anyhow::Error::new(e).context("the reload task panicked")),
        }
    }
}

/// What to type to use the pool, printed once the daemon listens. The
/// socket paths are absolute so the lines work from any directory.
fn connection_hints(config: &ServeConfig, control: &PoolControl) -> Result<String> {
    let socket =
        std::path::absolute(config.nbd_socket()).context("cannot resolve the data directory")?;
    let socket = socket.display();
    let volumes = control.list()?;
    let first = volumes
        .iter()
        .find(|v| v.kind == arbor_api::model::VolumeKind::Volume)
        .map(|v| v.name.clone());
    let pool = control.pool_info()?;
    let plural = |n: u64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut text = format!(
        "arbor: serving pool {} ({}, {})\n",
        config.pool.display(),
        plural(pool.volumes, "volume"),
        plural(pool.snapshots, "snapshot")
    );
    let dir = config.data_dir.display();
    let Some(name) = first else {
        text +=
            &format!("  create a volume: arbor --data-dir {dir} volume create disk0 --size 10G\n");
        return Ok(text);
    };
    let unix_uri = format!("nbd+unix:///{name}?socket={socket}");
    text += &format!("  nbdinfo '{unix_uri}'\n");
    if let (Some(addr), Some(files)) = (config.nbd_listen, &config.tls) {
        if config.nbd_tcp_security.mode != arbor_nbd::TlsMode::Off {
            let dir = files
                .ca
                .parent()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            text += &format!(
                "  nbdinfo 'nbds://localhost:{}/{name}?tls-certificates={dir}'   # TLS (docs/SECURITY.md)\n",
                addr.port()
            );
        }
    }
    if let (Some(addr), arbor_nbd::TlsMode::Off | arbor_nbd::TlsMode::On) =
        (config.nbd_listen, config.nbd_tcp_security.mode)
    {
        text += &format!("  qemu-img info nbd://{addr}/{name}\n");
    } else {
        text += &format!("  qemu-img info '{unix_uri}'\n");
    }
    text += &format!(
        "  mkdir -p /tmp/{name} && nbdfuse /tmp/{name} '{unix_uri}' &   # /tmp/{name}/nbd is the disk\n"
    );
    text += &format!("  arbor --data-dir {dir} volume list --tree");
    if let Some(addr) = config.api.listen {
        let scheme = if config.api.tls.is_some() {
            "https"
        } else {
            "http"
        };
        text += &format!(
            "\n  dashboard: {scheme}://{addr}/ (token: arbor --data-dir {dir} token create NAME --scope read)"
        );
    }
    Ok(text)
}

/// Waits for `signal` or for any task to end, then stops and joins all
/// tasks. Returns the first task error: any task ending early is one.
async fn supervise(
    tasks: &mut JoinSet<Result<()>>,
    stop: &CancellationToken,
    signal: impl Future<Output = Result<&'static str>>,
) -> Result<()> {
    let mut first_error = None;
    tokio::select! {
        received = signal => match received {
            Ok(name) => info!(signal = name, "shutting down"),
            Err(e) => first_error = Some(e),
        },
        Some(ended) = tasks.join_next() => {
            first_error = Some(task_error(ended).unwrap_or_else(|| {
                anyhow::anyhow!("a daemon task stopped unexpectedly")
            }));
        }
    }
    stop.cancel();
    while let Some(ended) = tasks.join_next().await {
        if let Some(e) = task_error(ended) {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => {
            error!(error = format!("{e:#}"), "daemon stopping after an error");
            Err(e)
        }
        None => Ok(()),
    }
}

fn task_error(ended: Result<Result<()>, tokio::task::JoinError>) -> Option<anyhow::Error> {
    match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(e) => Some(anyhow::Error::new(e).context("a daemon task panicked")),
    }
}

async fn termination_signal() -> Result<&'static str> {
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        _ = interrupt.recv() => Ok("SIGINT"),
    }
}
