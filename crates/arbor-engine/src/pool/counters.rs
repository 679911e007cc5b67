//! The data path's counters since the pool was opened, for statistics:
//! units that ran in pieces, [`ChunkWrites`] (`pool/write.rs`), and reads
//! and writes of volumes (how background work such as a scrub tells that
//! the pool is serving).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{ChunkWrite, ChunkWrites};

#[derive(Default)]
pub(super) struct WriteCounters {
    /// Units that did not fit an empty transaction's journal and ran in
    /// pieces.
    split_units: AtomicU64,
    /// [`ChunkWrites`], in its field order.
    chunk_writes: [AtomicU64; ChunkWrites::KINDS],
    /// Reads, writes and write-zeroes of volumes.
    requests: AtomicU64,
    /// Records appended to the intent log.
    intent_log_records: AtomicU64,
    /// Snapshots made durable by a snapshot record of the intent log
    /// instead of a commit.
    logged_snapshots: AtomicU64,
}

impl WriteCounters {
    /// A unit ran in pieces.
    pub(super) fn split(&self) {
        self.split_units.fetch_add(1, Ordering::Relaxed);
    }

    /// A chunk was written as `kind` says.
    pub(super) fn chunk_write(&self, kind: ChunkWrite) {
        self.chunk_writes[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` records were appended to the intent log.
    pub(super) fn intent_log_records_added(&self, n: u64) {
        self.intent_log_records.fetch_add(n, Ordering::Relaxed);
    }

    /// A snapshot record listing `n` snapshots was appended to the log.
    pub(super) fn snapshots_logged(&self, n: u64) {
        self.intent_log_records.fetch_add(1, Ordering::Relaxed);
        self.logged_snapshots.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn logged_snapshots(&self) -> u64 {
        self.logged_snapshots.load(Ordering::Relaxed)
    }

    pub(super) fn intent_log_records(&self) -> u64 {
        self.intent_log_records.load(Ordering::Relaxed)
    }

    /// A volume was read or written.
    pub(super) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub(super) fn split_units(&self) -> u64 {
        self.split_units.load(Ordering::Relaxed)
    }

    pub(super) fn chunk_writes(&self) -> ChunkWrites {
        ChunkWrites::from_counts(
            self.chunk_writes
                .each_ref()
                .map(|c| c.load(Ordering::Relaxed)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_counts_in_its_own_field() {
        let c = WriteCounters::default();
        c.split();
        c.chunk_write(ChunkWrite::InPlace);
        c.chunk_write(ChunkWrite::PartialOver);
        c.chunk_write(ChunkWrite::PartialOver);
        assert_eq!(c.split_units(), 1);
        assert_eq!(
            c.chunk_writes(),
            ChunkWrites {
                in_place: 1,
                partial_over: 2,
                ..ChunkWrites::default()
            }
        );
    }
}
