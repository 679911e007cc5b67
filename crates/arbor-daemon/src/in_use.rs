//! What keeps a volume from being taken away (destroyed, detached,
//! received into): NBD connections to it, sends reading it, and the
//! volumes that read through it. Destroy, detach, receive and the
//! monitor's prunes ask here.

use std::sync::Arc;

use crate::error::Result;
use arbor_engine::{VolumeId, VolumeInfo, VolumeLayout};
use arbor_stream::busy::Pins;

use crate::error::DaemonError;
use crate::nbd_export::OpenExports;

/// How long a destroy, detach or receive waits for NBD connections to its
/// volume that are closing: a client that disconnected and exited may not
/// have been read to its end yet (`OpenExports::settled`). Only a refusal
/// pays it.
const CLOSING_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The volumes and snapshots in `all` that read through copy-on-write
/// volume `id` (an origin, or `--layout cow`): while any is left, it
/// cannot be destroyed or detached, forced or not.
pub fn readers_through(all: &[VolumeInfo], id: VolumeId) -> Vec<&VolumeInfo> {
    all.iter()
        .filter(|v| matches!(v.layout, VolumeLayout::ReadsThrough { origin, .. } if origin == id))
        .collect()
}

/// The volumes NBD clients have open and the snapshots sends read; cheap
/// to clone.
#[derive(Clone)]
pub struct InUse {
    open: Arc<OpenExports>,
    /// Snapshots a send is reading: destroying one needs force.
    sending: Arc<Pins>,
}

impl InUse {
    pub fn new(open: Arc<OpenExports>, sending: Arc<Pins>) -> Self {
        Self { open, sending }
    }

    /// The NBD connections to volume `id` now.
    pub fn connections(&self, id: VolumeId) -> usize {
        self.open.count(id)
    }

    /// The NBD connections to volume `id` once those closing have closed
    /// (waiting up to [`CLOSING_GRACE`] while any is open).
    pub fn settled_connections(&self, id: VolumeId) -> usize {
        self.open.settled(id, CLOSING_GRACE)
    }

    /// The sends reading snapshot `id`.
    pub fn sends(&self, id: VolumeId) -> usize {
        self.sending.count(id)
    }

    /// What a send pins its snapshots in.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.sending
    }

    /// What keeps snapshot `id` from being destroyed besides its holds:
    /// NBD clients or a send.
    pub fn reason(&self, id: VolumeId) -> Option<String> {
        if self.connections(id) > 0 {
            Some("open over NBD".to_owned())
        } else if self.sends(id) > 0 {
            Some("being sent".to_owned())
        } else {
            None
        }
    }

    /// Refuses, unless `force`, to take volume `name` (`id`) away from NBD
    /// clients that have it open or a send that reads it.
    pub fn refuse(&self, name: &str, id: VolumeId, force: bool) -> Result<()> {
        let connections = if force {
            0
        } else {
            self.settled_connections(id)
        };
        if connections > 0 {
            let plural = if connections == 1 { "" } else { "s" };
            return Err(DaemonError::Busy(format!(
                "{name} is open by {connections} NBD connection{plural}; disconnect \
                     {} first, or destroy it anyway with --force (their I/O will fail)",
                if connections == 1 { "it" } else { "them" }
            )));
        }
        let sends = self.sending.count(id);
        if sends > 0 && !force {
            return Err(DaemonError::Busy(format!(
                "{name} is being sent ({sends} send{}); wait for it, or destroy it anyway \
                     with --force (the send then fails)",
                if sends == 1 { "" } else { "s" }
            )));
        }
        Ok(())
    }
}
