//! What management commands return, in the shapes that both `--json` output
//! and the daemon's HTTP API use, plus the API's request bodies.

use serde::{Deserialize, Serialize};

use crate::error_code::ErrorCode;
use crate::size::ByteSize;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolView {
    pub path: String,
    /// On-disk format version (1 cannot grow until upgraded).
    pub format_version: u16,
    pub pool_bytes: u64,
    pub chunk_size: u64,
    pub data_bytes: u64,
    pub data_used_bytes: u64,
    pub metadata_bytes: u64,
    pub metadata_used_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
    pub reclaim_pending: bool,
    /// Last committed transaction.
    pub txn: u64,
    /// Space use past the configured warning thresholds, one sentence each.
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    Volume,
    Snapshot,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeView {
    pub name: String,
    pub id: u64,
    pub kind: VolumeKind,
    pub size: u64,
    pub mapped_bytes: u64,
    /// The volume a snapshot was taken of, or the snapshot a clone came
    /// from; `None` when there is none or it has been deleted.
    pub parent: Option<String>,
    pub created_unix_secs: u64,
    pub created_txn: u64,
    /// Open NBD connections to it.
    #[serde(default)]
    pub nbd_connections: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsView {
    pub name: String,
    pub logical_bytes: u64,
    pub mapped_bytes: u64,
    /// What deleting the volume would free.
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
}

/// A byte range where two volumes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckView {
    pub clean: bool,
    pub problems: Vec<String>,
    /// Conditions a power cut also leaves behind, harmless now.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Problems found beyond those listed.
    pub unlisted: usize,
    pub volumes: usize,
    pub nodes: u64,
    pub data_chunks_referenced: u64,
    /// What `--repair` changed before the check; absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<Vec<String>>,
}

impl From<arbor_engine::CheckReport> for CheckView {
    fn from(report: arbor_engine::CheckReport) -> Self {
        Self {
            clean: report.is_clean(),
            problems: report.problems,
            warnings: report.warnings,
            unlisted: report.unlisted,
            volumes: report.volumes,
            nodes: report.nodes,
            data_chunks_referenced: report.data_chunks_referenced,
            repaired: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReclaimView {
    /// Metadata nodes processed.
    pub processed: u64,
}

/// What a pool growth added.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrowView {
    pub old_pool_bytes: u64,
    pub new_pool_bytes: u64,
    pub data_bytes_added: u64,
    pub metadata_bytes_added: u64,
}

impl From<arbor_engine::GrowReport> for GrowView {
    fn from(report: arbor_engine::GrowReport) -> Self {
        Self {
            old_pool_bytes: report.old_pool_bytes,
            new_pool_bytes: report.new_pool_bytes,
            data_bytes_added: report.data_bytes_added,
            metadata_bytes_added: report.metadata_bytes_added,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpgradeView {
    /// False when the pool already was the newest version.
    pub upgraded: bool,
    pub format_version: u16,
}

/// The body of every API error response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable kind, such as `not_found`.
    pub code: ErrorCode,
    pub message: String,
}

// ---- API request bodies ------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    pub name: String,
    pub size: ByteSize,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub name: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub snapshot: String,
    pub name: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub snapshot: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    pub size: ByteSize,
}

/// Both optional: `{}` grows the pool onto its device's current size.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrowRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_bytes: Option<ByteSize>,
}

impl GrowRequest {
    pub fn options(&self) -> arbor_engine::GrowOptions {
        arbor_engine::GrowOptions {
            size: self.size.map(|s| s.0),
            metadata_bytes: self.metadata_bytes.map(|s| s.0),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub to: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyQuery {
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsQuery {
    pub volume: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    pub a: String,
    pub b: String,
}
