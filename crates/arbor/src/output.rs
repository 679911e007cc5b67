//! Rendering command results: aligned tables for people, JSON for programs.
//!
//! Text is built in memory and written in one go through a fallible write,
//! so a closed pipe (`arbor list | head -1`) is an error to handle, not a
//! panic inside `println!`.

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Result;
use serde::Serialize;

use crate::model::{CheckView, PoolView, Range, StatsView, VolumeKind, VolumeView};
use crate::size::ByteSize;

pub fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes `value` as JSON if `json`, else the text `human` renders.
pub fn emit_as<T: Serialize>(
    value: &T,
    json: bool,
    human: impl FnOnce(&T) -> String,
) -> Result<()> {
    if json {
        emit(&(serde_json::to_string_pretty(value)? + "\n"))
    } else {
        emit(&human(value))
    }
}

fn size(bytes: u64) -> String {
    ByteSize(bytes).to_string()
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// Left-aligned columns separated by two spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `label: value` lines with the values aligned.
fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(label, _)| label.len())
        .max()
        .unwrap_or(0)
        + 1;
    pairs
        .iter()
        .map(|(label, value)| format!("{:<width$} {value}\n", format!("{label}:")))
        .collect()
}

pub fn pool(p: &PoolView) -> String {
    fields(&[
        ("pool", p.path.clone()),
        ("size", size(p.pool_bytes)),
        ("chunk size", size(p.chunk_size)),
        (
            "data",
            format!(
                "{} of {} used ({})",
                size(p.data_used_bytes),
                size(p.data_bytes),
                percent(p.data_used_bytes, p.data_bytes)
            ),
        ),
        (
            "metadata",
            format!(
                "{} of {} used ({})",
                size(p.metadata_used_bytes),
                size(p.metadata_bytes),
                percent(p.metadata_used_bytes, p.metadata_bytes)
            ),
        ),
        ("volumes", p.volumes.to_string()),
        ("snapshots", p.snapshots.to_string()),
        (
            "reclaim",
            if p.reclaim_pending { "pending" } else { "idle" }.to_owned(),
        ),
        ("transaction", p.txn.to_string()),
    ])
}

fn timestamp(unix_secs: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_secs(unix_secs);
    humantime::format_rfc3339_seconds(time).to_string()
}

pub fn volumes(list: &[VolumeView]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                match v.kind {
                    VolumeKind::Volume => "volume",
                    VolumeKind::Snapshot => "snapshot",
                }
                .to_owned(),
                size(v.size),
                size(v.mapped_bytes),
                v.parent.clone().unwrap_or_else(|| "-".to_owned()),
                timestamp(v.created_unix_secs),
            ]
        })
        .collect();
    table(
        &["NAME", "TYPE", "SIZE", "MAPPED", "PARENT", "CREATED"],
        &rows,
    )
}

pub fn volume_line(action: &str, v: &VolumeView) -> String {
    format!("{action} {} ({})\n", v.name, size(v.size))
}

pub fn stats(s: &StatsView) -> String {
    fields(&[
        ("name", s.name.clone()),
        ("logical", size(s.logical_bytes)),
        ("mapped", size(s.mapped_bytes)),
        ("exclusive", size(s.exclusive_bytes)),
        ("shared", size(s.shared_bytes)),
    ])
}

pub fn diff(ranges: &[Range]) -> String {
    if ranges.is_empty() {
        return "no differences\n".to_owned();
    }
    let rows: Vec<Vec<String>> = ranges
        .iter()
        .map(|r| vec![r.offset.to_string(), r.len.to_string(), size(r.len)])
        .collect();
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    table(&["OFFSET", "LENGTH", "SIZE"], &rows)
        + &format!("{} ranges, {} differ\n", ranges.len(), size(total))
}

pub fn check(c: &CheckView) -> String {
    let mut out: String = c
        .problems
        .iter()
        .map(|p| format!("problem: {p}\n"))
        .collect();
    if c.unlisted > 0 {
        out += &format!("... and {} more problems\n", c.unlisted);
    }
    let verdict = if c.clean { "clean" } else { "DAMAGED" };
    out += &format!(
        "pool is {verdict}: {} volumes, {} metadata nodes, {} data chunks referenced\n",
        c.volumes, c.nodes, c.data_chunks_referenced
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["vm1".to_owned(), "1 GiB".to_owned()],
            vec!["database".to_owned(), "512 B".to_owned()],
        ];
        assert_eq!(
            table(&["NAME", "SIZE"], &rows),
            "NAME      SIZE\nvm1       1 GiB\ndatabase  512 B\n"
        );
    }

    #[test]
    fn fields_align_values() {
        assert_eq!(
            fields(&[("a", "1".into()), ("long", "2".into())]),
            "a:    1\nlong: 2\n"
        );
    }
}
