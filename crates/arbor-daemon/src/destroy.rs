//! Destroying a volume or snapshot, as `arbor destroy` and the monitor's
//! prunes do it: refused while it is in use unless forced; an origin's
//! volume is detached instead (its data is its device's).

use std::sync::Arc;

use crate::error::Result;
use arbor_engine::{Pool, VolumeLayout};

use crate::in_use::InUse;
use crate::metrics::Metrics;
use crate::origins::Origins;

/// What a destroy needs; cheap to clone.
#[derive(Clone)]
pub struct Destroyer {
    pool: Arc<Pool>,
    in_use: InUse,
    origins: Origins,
    metrics: Arc<Metrics>,
}

impl Destroyer {
    pub fn new(pool: Arc<Pool>, in_use: InUse, origins: Origins, metrics: Arc<Metrics>) -> Self {
        Self {
            pool,
            in_use,
            origins,
            metrics,
        }
    }

    /// Destroys a volume or snapshot. Refused while NBD clients have it
    /// open unless `force` (their requests then fail with ESHUTDOWN). A
    /// client connecting between the check and the destroy is treated as
    /// if it had connected after: its requests fail the same way.
    pub fn destroy(&self, name: &str, force: bool) -> Result<()> {
        let id = self.pool.lookup(name)?;
        if let VolumeLayout::CowExternal { .. } = self.pool.info(id)?.layout {
            // Its data is its device's: destroying it is detaching it.
            return self.origins.detach_origin(name, force);
        }
        self.in_use.refuse(name, id, force)?;
        self.pool.delete_forced(name, force)?;
        self.metrics.forget_volume(name);
        Ok(())
    }
}
