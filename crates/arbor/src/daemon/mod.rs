//! `arbor serve`: one process owns the pool and serves it (control API,
//! NBD exports, housekeeping) until a signal.
//!
//! Startup binds every listener before serving anything, so a bad address
//! fails fast. Shutdown (SIGINT, SIGTERM, or a fatal background error) stops
//! accepting, lets in-flight requests finish, stops housekeeping, and closes
//! the pool with a final commit.

mod api;
mod background;
mod listen;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use arbor_engine::OpenOptions;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::control::PoolControl;
use crate::nbd_export::PoolExports;
use crate::pool_file::OpenPool;
pub use listen::ApiAddress;
use listen::{ApiListener, NbdListeners};

/// Everything `arbor serve` is told on its command line.
pub struct ServeConfig {
    pub pool: PathBuf,
    pub api: Option<ApiAddress>,
    pub nbd_socket: Option<PathBuf>,
    pub nbd_tcp: Option<SocketAddr>,
    /// Reclaim pace in metadata nodes per second; 0 turns background reclaim off.
    pub reclaim_rate: u32,
    pub commit_interval: Duration,
    pub cache_bytes: usize,
}

pub fn serve(config: ServeConfig) -> Result<()> {
    if config.api.is_none() && config.nbd_socket.is_none() && config.nbd_tcp.is_none() {
        bail!("nothing to serve: give --api-socket or --api, and/or --nbd-socket or --nbd-tcp");
    }
    if config.commit_interval.is_zero() {
        bail!("--commit-interval must be greater than zero");
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(config))
}

async fn run(config: ServeConfig) -> Result<()> {
    let options = OpenOptions {
        cache_bytes: config.cache_bytes,
        ..OpenOptions::default()
    };
    let path = config.pool.clone();
    let open = tokio::task::spawn_blocking(move || OpenPool::open(&path, &options))
        .await
        .context("opening the pool failed")??;
    let api = match &config.api {
        Some(address) => Some(ApiListener::bind(address).await?),
        None => None,
    };
    let nbd = NbdListeners::bind(config.nbd_socket.as_deref(), config.nbd_tcp).await?;

    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    info!(pool = %open.path.display(), "serving");
    if let Some(api) = api {
        info!(address = %api, "control API listening");
        let control = PoolControl::new(open.pool.clone(), open.path.clone());
        tasks.spawn(api.serve(api::router(control), stop.clone()));
    }
    if let Some(nbd) = nbd {
        info!(address = %nbd, "NBD listening");
        tasks.spawn(nbd.serve(PoolExports::new(open.pool.clone()), stop.clone()));
    }
    tasks.spawn(background::commit_periodically(
        open.pool.clone(),
        config.commit_interval,
        stop.clone(),
    ));
    if config.reclaim_rate > 0 {
        tasks.spawn(background::reclaim_paced(
            open.pool.clone(),
            config.reclaim_rate,
            stop.clone(),
        ));
    }

    let served = supervise(&mut tasks, &stop, termination_signal()).await;
    info!("closing the pool");
    let closed = tokio::task::spawn_blocking(move || open.close())
        .await
        .context("closing the pool failed")?;
    served.and(closed)
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
