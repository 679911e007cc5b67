//! Rendering command results: aligned tables for people, JSON for programs.
//!
//! Text is built in memory and written in one go through a fallible write,
//! so a closed pipe (`arbor list | head -1`) is an error to handle, not a
//! panic inside `println!`.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Result;
use serde::Serialize;

use arbor_api::model::{
    CheckView, GrowView, HealedView, LayoutView, OriginView, PoolView, Range, ReceiveStatusView,
    ReceivedView, SendEstimateView, StatsView, UpgradeView, VolumeKind, VolumeView,
};
use arbor_api::size::ByteSize;

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

/// Left-aligned columns separated by two spaces (widths in characters, so
/// tree lines align too).
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| {
                let pad = width.saturating_sub(cell.chars().count());
                format!("{cell}{}", " ".repeat(pad))
            })
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
        ("format", format!("version {}", p.format_version)),
        (
            "i/o",
            if p.io.is_empty() {
                "-".to_owned()
            } else {
                p.io.clone()
            },
        ),
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
            match (p.reclaim_pending, p.fill_pending) {
                (true, _) => "pending",
                (false, true) => "filling partial extents",
                (false, false) => "idle",
            }
            .to_owned(),
        ),
        ("transaction", p.txn.to_string()),
    ]) + &if p.damaged_blocks > 0 {
        format!(
            "DAMAGED: {} data blocks do not match their checksums (arbor pool damage lists them)\n",
            p.damaged_blocks
        )
    } else {
        String::new()
    } + &p
        .warnings
        .iter()
        .map(|w| format!("WARNING: {w}\n"))
        .collect::<String>()
        + &alerts(&p.alerts)
}

/// The row for new homes whose blocks await their checksums, if any.
fn new_homes_unsummed(s: &arbor_api::model::ScrubView) -> Option<(&'static str, String)> {
    (s.new_home_bytes_unsummed > 0).then(|| {
        (
            "new homes",
            format!(
                "{} not yet checksummed (a pass gives them checksums while no scrub runs)",
                size(s.new_home_bytes_unsummed)
            ),
        )
    })
}

/// What a reload of the daemon's configuration did.
pub fn reload(r: &arbor_api::model::ReloadView) -> String {
    let mut text = if r.changed.is_empty() {
        "configuration reloaded: no live key changed".to_owned()
    } else {
        format!(
            "configuration reloaded: {} now in force",
            r.changed.join(", ")
        )
    };
    text.push('\n');
    if r.tls_reloaded {
        text += &format!(
            "certificates read again; {} revoked by tls_crl\n",
            r.revoked_certificates
        );
    }
    for c in &r.closed_sessions {
        text += &format!(
            "closed the NBD session of {} on {}: {}\n",
            c.identity
                .as_deref()
                .map_or_else(|| "an anonymous client".to_owned(), |i| format!("{i:?}")),
            c.volume,
            c.reason
        );
    }
    for w in &r.withdrawn_replications {
        text += &format!(
            "ended the replication of {} from {}: {}\n",
            w.volume,
            w.identity.as_deref().unwrap_or("?"),
            w.reason
        );
    }
    for key in &r.restart_needed {
        text += &format!("needs a restart to take effect: {key}\n");
    }
    for volume in &r.keys_loaded {
        text += &format!("unlocked {volume} with its configured key\n");
    }
    for failure in &r.keys_failed {
        text += &format!("a configured key did not load (the volume stays locked): {failure}\n");
    }
    text
}

/// Where the scrub stands.
pub fn scrub(s: &arbor_api::model::ScrubView) -> String {
    if s.state == "none" {
        // None recorded: never run, or its record is damaged (the error).
        let error = s.last_error.iter().map(|e| ("error", e.clone()));
        let rows: Vec<_> = error
            .chain(scrub_schedule(s))
            .chain(new_homes_unsummed(s))
            .collect();
        return "scrub: never run (arbor scrub start)\n".to_owned() + &fields(&rows);
    }
    let mut rows = vec![
        ("scrub", s.state.clone()),
        ("started", timestamp(s.started_unix_secs)),
        (
            "progress",
            if s.state == "running" {
                format!(
                    "{:.1}%: {} of {} live data read",
                    s.progress * 100.0,
                    size(s.bytes_read),
                    size(s.live_bytes)
                )
            } else {
                format!("{:.1}%: {} read", s.progress * 100.0, size(s.bytes_read))
            },
        ),
        (
            "verified",
            if s.sums_added > 0 {
                format!(
                    "{} blocks, {} damaged; {} without a checksum given one",
                    s.verified_blocks, s.damaged_blocks, s.sums_added
                )
            } else {
                format!("{} blocks, {} damaged", s.verified_blocks, s.damaged_blocks)
            },
        ),
    ];
    if s.state == "running" {
        rows.push((
            "rate",
            format!(
                "{}/s, about {} left",
                size(s.rate_bytes_per_sec),
                s.eta_secs
                    .map_or_else(|| "?".to_owned(), |e| format!("{e} s"))
            ),
        ));
    }
    if let Some(at) = s.finished_unix_secs {
        rows.push(("finished", timestamp(at)));
    }
    rows.extend(new_homes_unsummed(s));
    if let Some(n) = s.metadata_problems {
        rows.push(("metadata", format!("{n} problems (arbor check lists them)")));
    }
    if let Some(e) = &s.last_error {
        rows.push(("error", e.clone()));
    }
    rows.extend(scrub_schedule(s));
    fields(&rows)
}

/// The scrub schedule's rows: when, and the next run (none: no rows).
fn scrub_schedule(s: &arbor_api::model::ScrubView) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if let Some(schedule) = &s.schedule {
        rows.push(("schedule", format!("{schedule} (UTC)")));
        rows.push((
            "next run",
            s.next_run.map_or_else(|| "never".to_owned(), timestamp),
        ));
    }
    if let Some(e) = &s.schedule_error {
        rows.push((
            "schedule",
            format!("damaged, none runs (arbor scrub schedule sets it again): {e}"),
        ));
    }
    rows
}

/// The pool's damaged data blocks, one line each with who reads it.
pub fn damage(d: &arbor_api::model::DamageView) -> String {
    let mut out = String::new();
    for b in &d.blocks {
        let readers = b
            .readers
            .iter()
            .map(|r| format!("{} at byte {}", r.volume, r.offset))
            .collect::<Vec<_>>()
            .join(", ");
        let more = b.readers_count.saturating_sub(b.readers.len());
        out += &format!(
            "damaged: device byte {} (chunk {}, block {}): checksum {:08x}, read {:08x}, found {}; read by {}{}\n",
            b.device_offset,
            b.chunk,
            b.block,
            b.stored_crc,
            b.read_crc,
            timestamp(b.found_unix_secs),
            readers,
            if more > 0 { format!(" and {more} more") } else { String::new() }
        );
    }
    if d.unlisted > 0 {
        out += &format!(
            "... and {} more damaged blocks, not listed (the record is full)\n",
            d.unlisted
        );
    }
    if d.blocks.is_empty() && d.unlisted == 0 {
        out += "no damaged data blocks\n";
    }
    out
}

/// Active alerts, one line each (none: nothing).
pub fn alerts(list: &[arbor_api::model::AlertView]) -> String {
    use arbor_api::model::Severity;
    list.iter()
        .map(|a| {
            let level = match a.severity {
                Severity::Critical => "CRITICAL",
                Severity::Warning => "ALERT",
            };
            format!(
                "{level}: {} (since {})\n",
                a.message,
                timestamp(a.since_unix_secs)
            )
        })
        .collect()
}

/// `arbor policy show`: each policy, its volumes, schedule, retention,
/// last and next run, how its runs go.
pub fn policies(list: &[arbor_api::model::PolicyView], now: u64) -> String {
    if list.is_empty() {
        return "no policies: set one with arbor policy set VOLUME --schedule ... --keep ...\n"
            .to_owned();
    }
    let mut out = String::new();
    for p in list {
        let when = |t: Option<u64>, none: &str| match t {
            Some(t) if t <= now => format!("{} ({} ago)", timestamp(t), ago(now - t)),
            Some(t) => format!("{} (in {})", timestamp(t), ago(t - now)),
            None => none.to_owned(),
        };
        let mut rows = vec![
            ("volumes", p.volumes.join(", ")),
            ("schedule", format!("{} (UTC)", p.schedule)),
            ("retention", p.retention.clone()),
            ("names", format!("{}-YYYY-MM-DDTHH:MM:SSZ", p.prefix)),
            ("last run", when(p.last_run, "never")),
            ("next run", when(p.next_run, "never")),
            ("snapshots", p.snapshots.to_string()),
            (
                "age alerts",
                format!(
                    "warn {}, critical {}",
                    ago(p.warn_age_secs),
                    ago(p.crit_age_secs)
                ),
            ),
            (
                "space prune",
                p.space_prune_percent
                    .map_or("off".to_owned(), |t| format!("past {t}% data use")),
            ),
            (
                "last prune",
                match p.last_prune {
                    Some(t) => format!("{}: {} destroyed", when(Some(t), ""), p.last_pruned),
                    None => "not yet".to_owned(),
                },
            ),
        ];
        if let Some(e) = &p.last_error {
            rows.push(("error", format!("{e} ({} in a row)", p.failures)));
        }
        out += &format!("policy {}\n", p.id);
        out += &fields(&rows)
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>();
    }
    out
}

/// `arbor prune [--dry-run]`: per volume, what goes (and frees) and why
/// the rest stays.
pub fn prune(v: &arbor_api::model::PruneView) -> String {
    let mut out = String::new();
    if v.volumes.is_empty() {
        return "no policies: nothing to prune\n".to_owned();
    }
    for vol in &v.volumes {
        let verb = if v.dry_run {
            "would destroy"
        } else {
            "destroyed"
        };
        out += &format!(
            "{} (policy {}): {verb} {}, keeps {}\n",
            vol.volume,
            vol.policy,
            vol.destroy.len(),
            vol.keep.len()
        );
        let mut rows = Vec::new();
        for d in &vol.destroy {
            rows.push(vec![
                if v.dry_run { "destroy" } else { "destroyed" }.to_owned(),
                d.name.clone(),
                timestamp(d.created_unix_secs),
                size(d.frees_bytes),
                d.reason.clone(),
            ]);
        }
        for d in &vol.keep {
            rows.push(vec![
                "keep".to_owned(),
                d.name.clone(),
                timestamp(d.created_unix_secs),
                size(d.frees_bytes),
                d.reason.clone(),
            ]);
        }
        for f in &vol.failed {
            rows.push(vec![
                "FAILED".to_owned(),
                f.name.clone(),
                String::new(),
                String::new(),
                f.error.clone(),
            ]);
        }
        if !rows.is_empty() {
            out += &table(&["action", "snapshot", "created", "frees", "why"], &rows)
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>();
        }
    }
    out += &format!(
        "{} {}\n",
        if v.dry_run { "would free" } else { "freed" },
        size(v.frees_bytes)
    );
    out
}

pub fn grow(g: &GrowView) -> String {
    fields(&[
        (
            "pool size",
            format!("{} -> {}", size(g.old_pool_bytes), size(g.new_pool_bytes)),
        ),
        ("data added", size(g.data_bytes_added)),
        ("metadata added", size(g.metadata_bytes_added)),
    ])
}

pub fn send_estimate(e: &SendEstimateView) -> String {
    let mut rows = vec![("snapshot", e.snapshot.clone())];
    if let Some(from) = &e.from {
        rows.push(("from", from.clone()));
    }
    if e.resume_offset > 0 {
        rows.push(("resumes at", size(e.resume_offset)));
    }
    rows.push(("data", size(e.data_bytes)));
    rows.push(("zeroed or discarded", size(e.zero_bytes)));
    rows.push(("records", e.records.to_string()));
    rows.push(("stream, at most", size(e.stream_bytes_max)));
    fields(&rows)
}

pub fn received(r: &ReceivedView) -> String {
    let mut text = format!(
        "received {}: {} of data from a {} stream",
        r.snapshot,
        size(r.data_bytes),
        size(r.stream_bytes)
    );
    if r.resumed_from > 0 {
        text.push_str(&format!(", resumed at {}", size(r.resumed_from)));
    }
    text.push('\n');
    if let Some(note) = &r.discarded {
        text.push_str(&format!("note: {note}\n"));
    }
    text
}

pub fn healed(h: &HealedView) -> String {
    let mut text = if h.damaged == 0 {
        format!(
            "{} has no damaged blocks: nothing to heal (the {} stream verified)\n",
            h.snapshot,
            size(h.stream_bytes)
        )
    } else {
        format!(
            "healed {} of {} damaged blocks of {} from a {} stream\n",
            h.healed,
            h.damaged,
            h.snapshot,
            size(h.stream_bytes)
        )
    };
    if h.rejected > 0 {
        text.push_str(&format!(
            "{} blocks in the stream did not match their checksums: not used (is the stream's \
             copy damaged too?)\n",
            h.rejected
        ));
    }
    if h.remaining > 0 {
        text.push_str(&format!(
            "{} blocks still damaged: a stream carries only what it sends (an incremental one \
             what changed since its base): heal with a full stream of {}, or of the snapshot \
             it shares them with\n",
            h.remaining, h.snapshot
        ));
    }
    text
}

pub fn receive_status(s: &ReceiveStatusView) -> String {
    let mut rows = vec![
        ("volume", s.volume.clone()),
        ("snapshot identity", s.target.clone()),
    ];
    if let Some(base) = &s.base {
        rows.push(("base identity", base.clone()));
    }
    // `offset` is a position in the volume, not a count of stream bytes
    // (an incremental stream carries only what changed): no "X of Y".
    rows.push(("volume size", size(s.size)));
    rows.push((
        "applied up to",
        format!("{} into the volume (durable)", size(s.offset)),
    ));
    rows.push(("resume token", s.token.clone()));
    let mut text = fields(&rows);
    if s.stale {
        text.push_str(
            "its base snapshot no longer exists: it can never finish; the next receive \
             into this volume discards it (or: arbor receive --abort)\n",
        );
    } else {
        text.push_str(&format!(
            "continue with: arbor send --resume {} | arbor receive {}\n",
            s.token, s.volume
        ));
    }
    text
}

pub fn upgrade(u: &UpgradeView) -> String {
    if u.upgraded {
        format!(
            "upgraded the pool to format version {}: it can grow, send, receive and attach \
             origins now, and older arbor releases cannot open it\n",
            u.format_version
        )
    } else {
        format!(
            "the pool already is format version {}; nothing to do\n",
            u.format_version
        )
    }
}

fn timestamp(unix_secs: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_secs(unix_secs);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `volume`, `snapshot`, or `clone` for a volume made from a snapshot.
fn kind(v: &VolumeView) -> &'static str {
    match (v.kind, &v.parent) {
        (VolumeKind::Snapshot, _) => "snapshot",
        (VolumeKind::Volume, Some(_)) => "clone",
        (VolumeKind::Volume, None) => "volume",
    }
}

/// `row` (in the pool), `cow` (an origin: data in place on its device),
/// `row (reads ORIGIN)` (in the pool over an origin's point in time).
fn layout(v: &VolumeView) -> String {
    match &v.layout {
        LayoutView::Row => "row".to_owned(),
        LayoutView::Cow { attached: true, .. } => "cow".to_owned(),
        LayoutView::Cow {
            attached: false, ..
        } => "cow (not attached)".to_owned(),
        LayoutView::ReadsThrough { origin, .. } => {
            format!("row (reads {})", origin.as_deref().unwrap_or("?"))
        }
    }
}

const VOLUME_HEADERS: [&str; 9] = [
    "NAME", "TYPE", "LAYOUT", "SIZE", "MAPPED", "PARENT", "NBD", "CREATED", "LIMITS",
];

/// A volume's rate limits in a few words (`-`: none).
fn limits(q: Option<&arbor_api::model::QosView>) -> String {
    let Some(q) = q else {
        return "-".to_owned();
    };
    let iops = |what: &str, v: Option<u64>| v.map(|n| format!("{what}{n} IOPS"));
    let bytes = |what: &str, v: Option<u64>| v.map(|n| format!("{what}{}/s", size(n)));
    let parts: Vec<String> = [
        iops("", q.iops),
        iops("read ", q.read_iops),
        iops("write ", q.write_iops),
        bytes("", q.bandwidth),
        bytes("read ", q.read_bandwidth),
        bytes("write ", q.write_bandwidth),
    ]
    .into_iter()
    .flatten()
    .collect();
    parts.join(", ")
}

/// What `volume set` did.
pub fn qos_line(v: &VolumeView) -> String {
    match &v.qos {
        None => format!("{}: no rate limits\n", v.name),
        Some(q) => format!(
            "{}: {} (bursts of {} s)\n",
            v.name,
            limits(Some(q)),
            f64::from(q.burst_ms) / 1000.0
        ),
    }
}

/// A volume's type, whether it is encrypted (and locked), and how far an
/// instant restore into it has come.
fn kind_and_restore(v: &VolumeView) -> String {
    let kind = |v: &VolumeView| match &v.encryption {
        None => kind(v).to_owned(),
        Some(e) if e.locked => format!("{} (encrypted, locked)", kind(v)),
        Some(_) => format!("{} (encrypted)", kind(v)),
    };
    let Some(r) = &v.restoring else {
        return kind(v);
    };
    let percent = (r.done_bytes as f64 * 100.0 / r.size.max(1) as f64).floor();
    match r.state.as_str() {
        "failed" => format!("{} (restore: {} blocks failed)", kind(v), r.failed_blocks),
        "resuming" => format!("{} (restore resuming)", kind(v)),
        "waiting" => format!("{} (restoring {percent}%, store failing)", kind(v)),
        _ => format!("{} (restoring {percent}%)", kind(v)),
    }
}

fn volume_row(name: String, v: &VolumeView) -> Vec<String> {
    vec![
        name,
        kind_and_restore(v),
        layout(v),
        size(v.size),
        size(v.mapped_bytes),
        v.parent.clone().unwrap_or_else(|| "-".to_owned()),
        v.nbd_connections.to_string(),
        timestamp(v.created_unix_secs),
        limits(v.qos.as_ref()),
    ]
}

pub fn volumes(list: &[VolumeView]) -> String {
    let rows: Vec<Vec<String>> = list.iter().map(|v| volume_row(v.name.clone(), v)).collect();
    table(&VOLUME_HEADERS, &rows)
}

/// The family tree: snapshots under the volume they were taken of, clones
/// under the snapshot they came from. A snapshot or clone whose parent was
/// destroyed is a root of its own.
pub fn volume_tree(list: &[VolumeView]) -> String {
    let mut children: HashMap<&str, Vec<&VolumeView>> = HashMap::new();
    let mut roots = Vec::new();
    let names: std::collections::HashSet<&str> = list.iter().map(|v| v.name.as_str()).collect();
    for v in list {
        match v.parent.as_deref().filter(|p| names.contains(p)) {
            Some(parent) => children.entry(parent).or_default().push(v),
            None => roots.push(v),
        }
    }
    let mut rows = Vec::new();
    for root in roots {
        tree_rows(root, "", None, &children, &mut rows);
    }
    table(&VOLUME_HEADERS, &rows)
}

/// Rows of `v` and its descendants; `last` is whether `v` is its parent's
/// last child (`None` for a root).
fn tree_rows(
    v: &VolumeView,
    indent: &str,
    last: Option<bool>,
    children: &HashMap<&str, Vec<&VolumeView>>,
    rows: &mut Vec<Vec<String>>,
) {
    let (branch, child_indent) = match last {
        None => (String::new(), String::new()),
        Some(true) => (format!("{indent}└─ "), format!("{indent}   ")),
        Some(false) => (format!("{indent}├─ "), format!("{indent}│  ")),
    };
    rows.push(volume_row(format!("{branch}{}", v.name), v));
    let kids = children.get(v.name.as_str()).map_or(&[][..], Vec::as_slice);
    for (i, child) in kids.iter().enumerate() {
        tree_rows(
            child,
            &child_indent,
            Some(i + 1 == kids.len()),
            children,
            rows,
        );
    }
}

pub fn volume_line(action: &str, v: &VolumeView) -> String {
    volume_line_as(action, v, true)
}

/// [`volume_line`] of a snapshot asked for committed (`deferred` false):
/// one the pool made durable by a record of its intent log instead of a
/// commit is durable already, only not yet exact (docs/ARCHITECTURE.md,
/// "Logged snapshots").
pub fn snapshot_line(v: &VolumeView, deferred: bool) -> String {
    volume_line_as("created", v, deferred)
}

fn volume_line_as(action: &str, v: &VolumeView, deferred: bool) -> String {
    let pending = match (v.durable, deferred) {
        (true, _) => "",
        (false, true) => ", durable at the pool's next commit",
        (false, false) => {
            ", logged: a power cut keeps it with every write flushed before it, \
             and the pool's next commit makes it exact"
        }
    };
    let encrypted = match &v.encryption {
        None => "",
        Some(e) if e.locked => ", encrypted, locked",
        Some(_) => ", encrypted",
    };
    format!(
        "{action} {} ({}{encrypted}{pending})\n",
        v.name,
        size(v.size)
    )
}

pub fn stats(s: &StatsView) -> String {
    let mut rows = vec![
        ("name", s.name.clone()),
        ("logical", size(s.logical_bytes)),
        ("mapped", size(s.mapped_bytes)),
        ("exclusive", size(s.exclusive_bytes)),
        ("shared", size(s.shared_bytes)),
    ];
    if let Some(store) = s.store_bytes {
        rows.push((
            "snapshot copies",
            format!(
                "{} (old content kept in the pool for its snapshots)",
                size(store)
            ),
        ));
    }
    fields(&rows)
}

/// `arbor origin list`.
pub fn origins(list: &[OriginView]) -> String {
    if list.is_empty() {
        return "no origins (arbor origin attach NAME PATH snapshots a disk in place)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|o| {
            vec![
                o.name.clone(),
                o.path
                    .clone()
                    .unwrap_or_else(|| "(not recorded)".to_owned()),
                size(o.size),
                match (o.attached, o.rollback_pending, &o.failed) {
                    (_, _, Some(_)) => "FAILED",
                    (true, false, None) => "yes",
                    (true, true, None) => "yes (rollback unfinished)",
                    (false, _, None) => "NO",
                }
                .to_owned(),
                size(o.store_bytes),
                o.checksums.clone(),
                o.snapshots.to_string(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "NAME",
            "PATH",
            "SIZE",
            "ATTACHED",
            "COPIES",
            "CHECKSUMS",
            "SNAPSHOTS",
        ],
        &rows,
    );
    if list.iter().any(|o| o.checksums == "copies") {
        out += "CHECKSUMS copies: the copies in the pool are checksummed and verified on every \
                read; an origin's own device is not (arbor did not write all of it)\n";
    }
    if list.iter().any(|o| !o.attached) {
        out += "an origin not attached fails its I/O: arbor origin attach NAME PATH attaches \
                its device again (the same file or device, of the same size)\n";
    }
    for o in list {
        if let Some(why) = &o.failed {
            out += &format!("{}: FAILED: {why}\n", o.name);
        } else if let Some(loss) = &o.loss {
            out += &format!(
                "{}: lost its bytes from {} on when its device shrank (accepted); snapshots \
                 taken before fail reads of them (arbor check lists them)\n",
                o.name, loss.from
            );
        }
    }
    out
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
        + &format!(
            "{} range{}, {} differ\n",
            ranges.len(),
            if ranges.len() == 1 { "" } else { "s" },
            size(total)
        )
}

pub fn check(c: &CheckView) -> String {
    let mut out = String::new();
    match &c.repaired {
        Some(actions) if actions.is_empty() => out += "repair: nothing needed repair\n",
        Some(actions) => out.extend(actions.iter().map(|a| format!("repaired: {a}\n"))),
        None => {}
    }
    out.extend(c.problems.iter().map(|p| format!("problem: {p}\n")));
    out.extend(c.lost.iter().map(|l| {
        format!(
            "lost: {} lost {} that it read through origin {} from byte {} (its device shrank): \
             those reads fail\n",
            l.volume,
            ByteSize(l.bytes),
            l.origin,
            l.from
        )
    }));
    if !c.damaged.blocks.is_empty() || c.damaged.unlisted > 0 {
        out += &damage(&c.damaged);
    }
    out.extend(c.warnings.iter().map(|w| format!("warning: {w}\n")));
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

fn ago(secs: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// `arbor replica demote`: what a forced resync may now discard.
pub fn demote(v: &arbor_api::model::DemoteView) -> String {
    let volume = &v.volume;
    let mut out = if v.demoted {
        format!("{volume} is now a read-only replica, waiting for its source.\n")
    } else {
        format!("{volume} would become a read-only replica (dry run: nothing changed).\n")
    };
    let writes = if v.written_since_newest {
        match v.snapshots.last() {
            Some(newest) => format!("its writes since {newest}, and "),
            None => "its data (it has no snapshot), and ".to_owned(),
        }
    } else {
        String::new()
    };
    out += &format!(
        "A forced resync from its source (arbor replica resync {volume} --force there) may \
         discard {writes}those of its snapshots after the newest one the source also has:\n"
    );
    if v.snapshots.is_empty() {
        out += "  (none)\n";
    }
    for name in v.snapshots.iter().rev() {
        out += &format!("  {name}\n");
    }
    out += "Nothing else: a replica changes only by replication.\n";
    out
}

/// `arbor replica status`.
pub fn replicas(v: &arbor_api::model::ReplicasView) -> String {
    use arbor_api::model::ReplicaState;
    let mut out = format!(
        "this host: {} (replication listener: {})\n",
        v.identity,
        v.listen.as_deref().unwrap_or("off")
    );
    if v.pairs.is_empty() {
        out += "no volume is replicated from here\n";
    }
    for p in &v.pairs {
        let state = match p.state {
            ReplicaState::Idle => "idle",
            ReplicaState::Running => "running",
            ReplicaState::Failed => "FAILED",
        };
        out += &format!(
            "{} -> {}/{}: {state}\n",
            p.volume, p.target, p.remote_volume
        );
        if let Some(e) = &p.error {
            out += &format!(
                "  error ({}, {} in a row): {e}\n",
                p.error_kind.as_deref().unwrap_or("?"),
                p.failures
            );
        }
        let rpo = p
            .recovery_point_secs
            .map_or("none yet".to_owned(), |s| format!("{} ago", ago(s)));
        out += &format!(
            "  last replicated: {} (recovery point {rpo})\n",
            p.last_snapshot.as_deref().unwrap_or("nothing yet")
        );
        if let Some(c) = &p.cycle {
            let pct = if c.stream_total > 0 {
                100.0 * c.stream_sent as f64 / c.stream_total as f64
            } else {
                0.0
            };
            out += &format!(
                "  sending {}: {} of at most {} ({pct:.0}%), {}/s\n",
                c.snapshot,
                size(c.stream_sent),
                size(c.stream_total),
                size(c.bytes_per_sec as u64)
            );
        }
        out += &format!(
            "  sent {} in {} cycles ({} failed); every {}{}{}",
            size(p.bytes_sent_total),
            p.cycles_ok + p.cycles_failed,
            p.cycles_failed,
            ago(p.interval_secs),
            p.rate_limit
                .map(|r| format!(", at most {}/s", size(r)))
                .unwrap_or_default(),
            p.keep.map(|k| format!(", keeping {k}")).unwrap_or_default()
        );
        if let Some(n) = p.next_run_secs {
            out += &format!("; next in {}", ago(n));
        }
        out += "\n";
    }
    for r in &v.replicas {
        out += &format!(
            "{} here is a read-only replica of {}{}\n",
            r.volume,
            r.source.as_deref().unwrap_or("(waiting for a source)"),
            if r.path.len() > 1 {
                format!(" (via {})", r.path.join(" -> "))
            } else {
                String::new()
            }
        );
    }
    out
}

/// `arbor replica run` and `resync`.
pub fn replica_runs(runs: &Vec<arbor_api::model::ReplicaRunView>) -> String {
    let mut out = String::new();
    for r in runs {
        out += &format!("{}: ", r.pair);
        if !r.rolled_back.is_empty() {
            out += &format!(
                "rolled the target back (discarded {}); ",
                r.rolled_back.join(", ")
            );
        }
        if r.sent.is_empty() {
            out += "the target was up to date";
        } else {
            out += &format!("sent {} ({})", r.sent.join(", "), size(r.wire_bytes));
        }
        if let Some(s) = &r.replicated {
            out += &format!("; the target has {s}");
        }
        if !r.pruned.is_empty() {
            out += &format!("; pruned {}", r.pruned.join(", "));
        }
        if r.healed > 0 {
            out += &format!(
                "; healed {} damaged blocks here with the target's copies",
                r.healed
            );
        }
        if r.heal_sent > 0 {
            out += &format!("; sent {} blocks to heal the target's damage", r.heal_sent);
        }
        out += "\n";
    }
    out
}

/// `arbor token list`: never a secret (the daemon keeps none).
pub fn tokens(list: &[arbor_api::model::TokenView]) -> String {
    if list.is_empty() {
        return "no API tokens (arbor token create NAME --scope read|admin)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            let expires = match (t.expires_unix_secs, t.expired) {
                (None, _) => "never".to_owned(),
                (Some(at), true) => format!("expired {}", timestamp(at)),
                (Some(at), false) => timestamp(at),
            };
            vec![
                t.name.clone(),
                t.scope.name().to_owned(),
                timestamp(t.created_unix_secs),
                expires,
                t.last_used_unix_secs
                    .map_or_else(|| "never".to_owned(), timestamp),
                t.id.clone(),
            ]
        })
        .collect();
    table(
        &["NAME", "SCOPE", "CREATED", "EXPIRES", "LAST USED", "ID"],
        &rows,
    )
}

/// `arbor backup init`.
pub fn backup_init(v: &crate::commands::BackupInitView) -> String {
    format!(
        "made backup repository {} (id {}, blocks of {})\n",
        v.url,
        v.id,
        size(u64::from(v.block_size))
    )
}

/// `arbor backup repositories`.
pub fn backup_repositories(list: &[arbor_api::model::BackupRepositoryView]) -> String {
    if list.is_empty() {
        return "no backup repositories are configured (backup_repositories)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            let schedule = r
                .schedule
                .as_ref()
                .map_or("-".to_owned(), |s| match &s.keep {
                    Some(keep) => format!("{}, keep {keep}", s.schedule),
                    None => s.schedule.clone(),
                });
            vec![r.name.clone(), r.url.clone(), schedule]
        })
        .collect();
    let mut text = table(&["NAME", "URL", "SCHEDULE"], &rows);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut volumes = Vec::new();
    for r in list {
        let Some(s) = &r.schedule else { continue };
        if let Some(e) = &s.error {
            text += &format!("{}: {e}\n", r.name);
        }
        for v in &s.volumes {
            volumes.push(vec![
                r.name.clone(),
                v.volume.clone(),
                v.last_success_unix.map_or("never".to_owned(), |t| {
                    format!("{} ago", age(now.saturating_sub(t)))
                }),
                if v.next_run_unix <= now {
                    "now".to_owned()
                } else {
                    format!("in {}", age(v.next_run_unix - now))
                },
                match (&v.last_error, v.failures) {
                    (Some(e), n) if n > 0 => format!("failed {n}x: {e}"),
                    _ => "ok".to_owned(),
                },
            ]);
        }
    }
    if !volumes.is_empty() {
        text += "\n";
        text += &table(
            &["REPOSITORY", "VOLUME", "LAST BACKUP", "NEXT", "STATE"],
            &volumes,
        );
    }
    text
}

/// `arbor backup jobs`.
pub fn backup_jobs(list: &[arbor_api::model::BackupJobView]) -> String {
    if list.is_empty() {
        return "no backup jobs are running\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|j| {
            vec![
                j.kind.clone(),
                j.repository.clone(),
                j.subject.clone(),
                format!(
                    "{} of {}",
                    size(j.done_bytes),
                    size(j.total_bytes.max(j.done_bytes))
                ),
                format!("{}/s", size(j.rate_bytes_per_sec)),
                j.eta_secs.map_or("-".to_owned(), age),
                size(j.store_bytes),
            ]
        })
        .collect();
    table(
        &["JOB", "REPOSITORY", "OF", "DONE", "RATE", "LEFT", "STORE"],
        &rows,
    )
}

/// The backup's id as shown: its first 12 digits (any 8 or more name it).
fn short_id(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// `arbor backup create`.
pub fn backup_made(v: &arbor_api::model::BackupView) -> String {
    let how = match &v.parent {
        Some(p) => format!("incremental from {}", short_id(p)),
        None => "full".to_owned(),
    };
    format!(
        "backed up {} as {} ({how}): {} mapped, {} new in the repository ({} blobs)\n",
        v.snapshot,
        short_id(&v.id),
        size(v.mapped_bytes),
        size(v.added_bytes),
        v.added_blobs
    )
}

/// `arbor backup list`.
pub fn backup_list(v: &arbor_api::model::BackupListView) -> String {
    let now = arbor_daemon::unix_now();
    let rows: Vec<Vec<String>> = v
        .backups
        .iter()
        .map(|b| {
            vec![
                short_id(&b.id).to_owned(),
                b.snapshot.clone(),
                b.host.clone(),
                size(b.size),
                size(b.mapped_bytes),
                size(b.added_bytes),
                b.parent
                    .as_deref()
                    .map_or("-".to_owned(), |p| short_id(p).to_owned()),
                age(now.saturating_sub(b.completed_unix)),
            ]
        })
        .collect();
    let mut text = format!(
        "{} ({}): {} backups\n",
        v.repository,
        v.url,
        v.backups.len()
    );
    if !rows.is_empty() {
        text += &table(
            &[
                "ID", "SNAPSHOT", "HOST", "SIZE", "MAPPED", "ADDED", "PARENT", "AGE",
            ],
            &rows,
        );
    }
    text
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `arbor backup verify`.
pub fn backup_verified(v: &arbor_api::model::VerifyView) -> String {
    let mut text = format!(
        "{}: {} backups, {} of {} packs read ({}), {} blobs checked: ",
        v.repository,
        v.backups,
        v.packs_read,
        v.packs_total,
        size(v.bytes_read),
        v.blobs_checked
    );
    if v.problem_count == 0 {
        text += "no problems\n";
        return text;
    }
    text += &format!("{} problems\n", v.problem_count);
    for p in &v.problems {
        text += &format!("  {p}\n");
    }
    text
}

/// `arbor backup prune`: the backups forgotten and kept with why, then
/// every object deleted (a dry run lists exactly what the prune would
/// delete).
pub fn backup_pruned(v: &arbor_api::model::BackupPruneView) -> String {
    let (verb, deleted) = if v.dry_run {
        ("would forget", "would delete")
    } else {
        ("forgot", "deleted")
    };
    let mut text = String::new();
    let forgotten = v.forgotten.iter().map(|b| (verb, b));
    for (what, b) in forgotten.chain(v.kept.iter().map(|b| ("keep", b))) {
        text += &format!(
            "{what} {} {} ({}): {}\n",
            short_id(&b.backup.id),
            b.backup.snapshot,
            b.backup.host,
            b.reason
        );
    }
    for name in &v.deleted_packs {
        text += &format!("{deleted} {name} (unused)\n");
    }
    for name in &v.repacked_packs {
        if v.small_packs.contains(name) {
            text += &format!("{deleted} {name} (small: combined into a new pack)\n");
        } else {
            text += &format!("{deleted} {name} (partly used: repacked)\n");
        }
    }
    for name in &v.replaced_indexes {
        text += &format!("{deleted} {name} (index, replaced)\n");
    }
    for lock in &v.stale_locks {
        text += &format!("{deleted} a stale lock: {lock}\n");
    }
    for name in &v.deleted_checkpoints {
        text += &format!("{deleted} {name} (an unfinished backup's checkpoint, a week old)\n");
    }
    if v.kept_checkpoints > 0 {
        text += &format!(
            "keep what {} unfinished backups' checkpoints name\n",
            v.kept_checkpoints
        );
    }
    text += &format!(
        "{}{}: {} backups forgotten, {} kept; {} packs deleted, {} repacked ({} small) into {}; \
         {} blobs removed, {} kept; {} -> {}\n",
        if v.dry_run {
            "dry run, nothing changed: "
        } else {
            ""
        },
        v.repository,
        v.forgotten.len(),
        v.kept.len(),
        v.deleted_packs.len(),
        v.repacked_packs.len(),
        v.small_packs.len(),
        v.written_packs,
        v.removed_blobs,
        v.kept_blobs,
        size(v.bytes_before),
        size(v.bytes_after)
    );
    text
}

/// `arbor backup restore`.
pub fn backup_restored(v: &arbor_api::model::RestoreView) -> String {
    if v.instant {
        return format!(
            "{} serves now ({}); backup {} is restored into it in the background: `arbor volume list` shows how far\n",
            v.volume,
            size(v.size),
            short_id(&v.backup)
        );
    }
    format!(
        "restored backup {} into {} ({}, {} written)\n",
        short_id(&v.backup),
        v.volume,
        size(v.size),
        size(v.restored_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `receive --status` printed "received 8 MiB of 16 MiB", the volume's
    /// position and size, as if they were the stream's.
    #[test]
    fn receive_status_labels_volume_positions_not_stream_bytes() {
        let text = receive_status(&ReceiveStatusView {
            volume: "vm1".into(),
            token: "t".into(),
            target: "a".repeat(32),
            base: None,
            offset: 8 << 20,
            size: 16 << 20,
            stale: false,
        });
        let row = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label:?} row in:\n{text}"))
                .to_owned()
        };
        assert!(row("volume size").ends_with("16 MiB"), "{text}");
        assert!(
            row("applied up to").contains("8 MiB into the volume"),
            "{text}"
        );
        assert!(
            !text.contains(" of 16 MiB") && !text.contains("received"),
            "{text}"
        );
    }

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
    fn pool_status_says_when_only_a_fill_is_left() {
        let mut p = PoolView {
            path: "pool".into(),
            format_version: 7,
            io: "buffered".into(),
            pool_bytes: 1 << 30,
            chunk_size: 16384,
            data_bytes: 1 << 30,
            data_used_bytes: 0,
            metadata_bytes: 1 << 20,
            metadata_used_bytes: 0,
            volumes: 1,
            snapshots: 0,
            reclaim_pending: false,
            fill_pending: false,
            txn: 1,
            warnings: Vec::new(),
            alerts: Vec::new(),
            damaged_blocks: 0,
        };
        let reclaim = |p: &PoolView| {
            pool(p)
                .lines()
                .find(|l| l.starts_with("reclaim"))
                .map(|l| l.split_once(':').map_or(l, |(_, v)| v).trim().to_owned())
        };
        assert_eq!(reclaim(&p).as_deref(), Some("idle"));
        p.fill_pending = true;
        assert_eq!(reclaim(&p).as_deref(), Some("filling partial extents"));
        p.reclaim_pending = true;
        assert_eq!(reclaim(&p).as_deref(), Some("pending"));
    }

    fn view(name: &str, kind: VolumeKind, parent: Option<&str>) -> VolumeView {
        VolumeView {
            name: name.into(),
            id: 0,
            kind,
            size: 1 << 30,
            mapped_bytes: 0,
            parent: parent.map(Into::into),
            created_unix_secs: 0,
            created_txn: 0,
            durable: true,
            nbd_connections: 0,
            guid: None,
            holds: Vec::new(),
            layout: LayoutView::Row,
            qos: None,
            restoring: None,
            encryption: None,
        }
    }

    #[test]
    fn the_tree_nests_snapshots_and_clones() {
        use VolumeKind::{Snapshot, Volume};
        let list = [
            view("gold", Volume, None),
            view("gold@a", Snapshot, Some("gold")),
            view("gold@b", Snapshot, Some("gold")),
            view("ci-1", Volume, Some("gold@a")),
            view("ci-1@x", Snapshot, Some("ci-1")),
            view("orphan@s", Snapshot, None),
        ];
        let text = volume_tree(&list);
        let width = text.find("TYPE").unwrap();
        let names: Vec<String> = text
            .lines()
            .skip(1)
            .map(|l| {
                l.chars()
                    .take(width)
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "gold",
                "├─ gold@a",
                "│  └─ ci-1",
                "│     └─ ci-1@x",
                "└─ gold@b",
                "orphan@s",
            ]
        );
        assert!(volume_tree(&list).contains("clone"));
    }

    #[test]
    fn fields_align_values() {
        assert_eq!(
            fields(&[("a", "1".into()), ("long", "2".into())]),
            "a:    1\nlong: 2\n"
        );
    }
}
