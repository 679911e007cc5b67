//! What the API's handlers share: running engine work off the async
//! workers ([`blocking`]), name suggestions for a name not found, and the
//! read-only rule for replicas ([`not_replica`]).

use arbor_api::error_code::ErrorCode;

use super::api_error::{ApiError, ApiResult};
use super::control::PoolControl;

/// Runs a blocking engine operation without holding up the async
/// workers' other tasks: on the daemon's multi-threaded runtime, on this
/// thread, which hands its other tasks to another worker meanwhile
/// (`block_in_place`: no hand-off to a blocking thread and back, two
/// wake-ups a call saves under load, PERFORMANCE.md §11); else on the
/// blocking pool. A panic fails the request either way.
pub(super) async fn blocking<T: Send + 'static>(
    control: PoolControl,
    operation: impl FnOnce(&PoolControl) -> anyhow::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let run = move || operation(&control).map_err(|e| explain(&control, e));
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        return tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
        })
        .unwrap_or_else(|_| {
            Err(ApiError::from(anyhow::anyhow!(
                "engine task failed: it panicked"
            )))
        });
    }
    tokio::task::spawn_blocking(run)
        .await
        .map_err(|e| ApiError::from(anyhow::Error::new(e).context("engine task failed")))?
}

/// The API error for `err`, with the nearest existing name suggested when
/// a name was not found.
fn explain(control: &PoolControl, err: anyhow::Error) -> ApiError {
    let missing = match err.downcast_ref::<arbor_engine::Error>() {
        Some(arbor_engine::Error::NotFound(name)) => Some(name.clone()),
        _ => None,
    };
    let suggestion = missing.and_then(|name| control.nearest_name(&name));
    let api = ApiError::from(err);
    match suggestion {
        Some(near) => api.with_hint(format!("; did you mean {near:?}?")),
        None => api,
    }
}

/// A replica changes only by replication: its snapshots and contents are
/// its source's. `name`: the volume, or one of its snapshots.
pub(super) fn not_replica(c: &PoolControl, name: &str) -> ApiResult<()> {
    let volume = name.split_once('@').map_or(name, |(v, _)| v);
    if c.replication.is_replica(volume) {
        return Err(ApiError::new(
            ErrorCode::ReadOnly,
            format!(
                "{volume} is a replica: it changes only by replication \
                 (`arbor replica promote {volume}` makes it the writable master)"
            ),
        ));
    }
    Ok(())
}
