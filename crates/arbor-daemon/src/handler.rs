//! What the API's handlers share: running engine work off the async
//! workers ([`blocking`]), name suggestions for a name not found, and the
//! read-only rule for replicas ([`not_replica`]).

use arbor_engine::Pool;

use super::api_error::{engine_task_failed, ApiError, ApiResult};
use std::sync::Arc;

use crate::control::PoolControl;
use crate::error::DaemonError;
use crate::monitor::Monitor;
use crate::origins::Origins;
use crate::replication::Replication;

/// A service the API runs engine work on: a name its errors say was not
/// found gets the nearest name in its pool suggested.
pub(super) trait OnPool: Send + 'static {
    fn pool(&self) -> &Pool;
}

/// Runs a blocking engine operation without holding up the async
/// workers' other tasks: on the daemon's multi-threaded runtime, on this
/// thread, which hands its other tasks to another worker meanwhile
/// (`block_in_place`: no hand-off to a blocking thread and back, two
/// wake-ups a call saves under load, PERFORMANCE.md §11); else on the
/// blocking pool. A panic fails the request either way.
pub(super) async fn blocking<S: OnPool, T: Send + 'static>(
    service: S,
    operation: impl FnOnce(&S) -> crate::error::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let run = move || operation(&service).map_err(|e| explain(service.pool(), e));
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        return tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
        })
        .unwrap_or_else(|_| {
            Err(ApiError::from(DaemonError::Internal(anyhow::anyhow!(
                "engine task failed: it panicked"
            ))))
        });
    }
    tokio::task::spawn_blocking(run)
        .await
        .map_err(engine_task_failed)?
}

/// The API error for `err`, with the nearest existing name suggested when
/// a name was not found.
fn explain(pool: &Pool, err: DaemonError) -> ApiError {
    let missing = match err.engine() {
        Some(arbor_engine::Error::Refused(arbor_engine::Refusal::NotFound(name))) => {
            Some(name.clone())
        }
        _ => None,
    };
    let suggestion = missing.and_then(|name| nearest_name(pool, &name));
    let api = ApiError::from(err);
    match suggestion {
        Some(near) => api.with_hint(format!("; did you mean {near:?}?")),
        None => api,
    }
}

/// The existing name in `pool` closest to `name`, if one is close enough
/// to be a likely typo.
fn nearest_name(pool: &Pool, name: &str) -> Option<String> {
    let names = pool.list().ok()?.into_iter().map(|v| v.name);
    let limit = (name.chars().count() / 3).max(2);
    names
        .map(|candidate| (strsim::levenshtein(name, &candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min()
        .map(|(_, candidate)| candidate)
}

/// A replica changes only by replication: its snapshots and contents are
/// its source's. `name`: the volume, or one of its snapshots.
pub(super) fn not_replica(replication: &Replication, name: &str) -> ApiResult<()> {
    let volume = name.split_once('@').map_or(name, |(v, _)| v);
    if replication.is_replica(volume) {
        return Err(DaemonError::ReadOnly(format!(
            "{volume} is a replica: it changes only by replication \
             (`arbor replica promote {volume}` makes it the writable master)"
        ))
        .into());
    }
    Ok(())
}

impl OnPool for PoolControl {
    fn pool(&self) -> &Pool {
        PoolControl::pool(self)
    }
}

impl OnPool for Arc<Monitor> {
    fn pool(&self) -> &Pool {
        Monitor::pool(self)
    }
}

impl OnPool for Origins {
    fn pool(&self) -> &Pool {
        Origins::pool(self)
    }
}
