//! The service manager's protocol (systemd's `Type=notify`, through
//! `sd-notify`): the daemon says it is ready once the pool is open and
//! every listener is bound, pings the watchdog while the pool answers, and
//! says it is stopping when it begins to. Outside systemd (no
//! `NOTIFY_SOCKET`) each of these does nothing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use arbor_engine::Pool;
use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Tells the service manager the daemon is ready (pool open, listeners
/// bound), with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager a reload has begun (`RELOADING=1`, with the
/// monotonic time systemd asks for).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// Tells the service manager the reload is over, with a status line.
pub fn reloaded(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager the daemon is stopping.
pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("closing the pool"),
    ]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!(error = %e, "cannot notify the service manager");
    }
}

/// Pings the service manager's watchdog (`WatchdogSec=` in the unit) at
/// half its interval for as long as the pool answers: each ping first
/// takes the pool's metadata lock (its statistics), so a daemon whose
/// pool is stuck stops pinging and is restarted. Without a watchdog it
/// only waits for the daemon to stop (a daemon task ending early is an
/// error).
pub async fn watchdog(pool: Arc<Pool>, stop: CancellationToken) -> Result<()> {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        stop.cancelled().await;
        return Ok(());
    };
    let every = (interval / 2).max(Duration::from_millis(100));
    debug!(?interval, "pinging the service manager's watchdog");
    loop {
        let pool = Arc::clone(&pool);
        let answered = tokio::task::spawn_blocking(move || pool.pool_stats().is_ok())
            .await
            .unwrap_or(false);
        if answered {
            send(&[NotifyState::Watchdog]);
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}
