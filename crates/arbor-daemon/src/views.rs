//! The API model's views of engine values and the engine's options from
//! API requests (the model knows nothing of the engine).

use arbor_api::model::{
    CheckView, DamageReaderView, DamageView, DamagedBlockView, Durability, GrowRequest, GrowView,
    LostDataView,
};

/// What a check found, as the API says it.
pub fn check_view(report: arbor_engine::CheckReport) -> CheckView {
    CheckView {
        // Known lost data and damaged data blocks are damage too, though
        // the structure is sound.
        clean: report.is_clean() && report.lost.is_empty() && report.damaged.is_empty(),
        problems: report.problems,
        warnings: report.warnings,
        unlisted: report.unlisted,
        volumes: report.volumes,
        nodes: report.nodes,
        data_chunks_referenced: report.data_chunks_referenced,
        repaired: None,
        lost: report
            .lost
            .into_iter()
            .map(|l| LostDataView {
                volume: l.volume,
                origin: l.origin,
                bytes: l.bytes,
                from: l.from,
            })
            .collect(),
        damaged: damage_view(report.damaged, 0),
    }
}

/// The pool's damaged data blocks, as the API says them; `found`: reads
/// that found damage since the daemon started.
pub fn damage_view(report: arbor_engine::DamageReport, found: u64) -> DamageView {
    DamageView {
        blocks: report
            .blocks
            .into_iter()
            .map(|d| DamagedBlockView {
                device_offset: d.device_offset,
                chunk: d.pchunk,
                block: d.block,
                stored_crc: d.stored,
                read_crc: d.computed,
                found_unix_secs: d.found_unix,
                last_found_unix_secs: d.last_unix,
                readers: d
                    .readers
                    .into_iter()
                    .map(|(volume, offset)| DamageReaderView { volume, offset })
                    .collect(),
                readers_count: d.reader_count,
            })
            .collect(),
        unlisted: report.unlisted,
        found_since_start: found,
    }
}

/// What a growth added, as the API says it.
pub fn grow_view(report: arbor_engine::GrowReport) -> GrowView {
    GrowView {
        old_pool_bytes: report.old_pool_bytes,
        new_pool_bytes: report.new_pool_bytes,
        data_bytes_added: report.data_bytes_added,
        metadata_bytes_added: report.metadata_bytes_added,
    }
}

/// The engine's durability for a request's.
pub fn durability(d: Durability) -> arbor_engine::Durability {
    match d {
        Durability::Committed => arbor_engine::Durability::Committed,
        Durability::Deferred => arbor_engine::Durability::Deferred,
    }
}

/// The engine's growth options for a request.
pub fn grow_options(request: &GrowRequest) -> arbor_engine::GrowOptions {
    arbor_engine::GrowOptions {
        size: request.size.map(|s| s.0),
        metadata_bytes: request.metadata_bytes.map(|s| s.0),
    }
}
