//! The frozen pool images of every format version
//! (`crates/arbor-engine/tests/images`, made once by the code of each
//! version) through the binary: `arbor check` finds each clean, `arbor
//! serve` opens it without upgrading it and serves every volume and
//! snapshot over NBD as that version read it back (real `nbdcopy`),
//! `arbor pool upgrade` converts it while it is served, and writes over
//! the chunks its snapshots share, a snapshot and a clone then leave the
//! old snapshots as they were, through a restart and an offline check.
//! The engine's own test (`crates/arbor-engine/tests/images.rs`) goes
//! further inside the pool: properties, holds, growth, reclaim.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "../../arbor-engine/tests/images/manifest.rs"]
mod manifest;

use std::collections::BTreeMap;

use arbor_format::FormatVersion;
use common::*;
use manifest::{image_bytes, manifest, pattern};

const KIB: usize = 1024;

/// Name → (size, snapshot) as `arbor volume list --json` shows them.
fn listed(daemon: &Daemon) -> BTreeMap<String, (u64, bool)> {
    let list = daemon.json(&["volume", "list"]);
    list.as_array()
        .expect("a list")
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_owned();
            let size = v["size"].as_u64().unwrap();
            (name, (size, v["kind"] == "snapshot"))
        })
        .collect()
}

/// The whole content of an export, read by `nbdcopy`.
fn read_export(daemon: &Daemon, export: &str) -> Vec<u8> {
    let file = daemon.path("export.raw");
    let uri = format!("nbd+unix:///{export}?socket={}", daemon.nbd_socket());
    nbdcopy(&uri, p(&file));
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    bytes
}

/// Writes `bytes` over the whole of a volume with `nbdcopy`.
fn write_export(daemon: &Daemon, export: &str, bytes: &[u8]) {
    let file = daemon.path("import.raw");
    std::fs::write(&file, bytes).unwrap();
    let uri = format!("nbd+unix:///{export}?socket={}", daemon.nbd_socket());
    nbdcopy(p(&file), &uri);
    std::fs::remove_file(&file).unwrap();
}

fn format_version(daemon: &Daemon) -> u64 {
    daemon.json(&["pool", "status"])["format_version"]
        .as_u64()
        .unwrap()
}

/// Loads the keys of the image's encrypted volumes (`arbor key load`, a
/// key file of the manifest's raw key): locked, they are not served.
fn unlock(daemon: &Daemon, keys: &BTreeMap<String, String>) {
    for (volume, hex) in keys {
        let file = daemon.path(&format!("{volume}.key"));
        std::fs::write(&file, format!("{hex}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        daemon.ok(&["key", "load", volume, "--key-file", p(&file)]);
    }
}

/// Every listed volume and snapshot reads as `model` says, over NBD.
fn assert_serves(daemon: &Daemon, model: &BTreeMap<String, Vec<u8>>, when: &str) {
    let names: Vec<String> = listed(daemon).into_keys().collect();
    assert_eq!(
        names,
        model.keys().cloned().collect::<Vec<_>>(),
        "{when}: the volumes listed"
    );
    for (name, want) in model {
        assert!(
            read_export(daemon, name) == *want,
            "{when}: {name} reads wrong"
        );
    }
}

#[test]
fn the_binary_checks_serves_and_upgrades_an_image_of_every_format_version() {
    for version in FormatVersion::all() {
        let made = manifest(version);
        let dir = tempfile::tempdir().unwrap();
        let pool = dir.path().join("pool");
        std::fs::write(&pool, image_bytes(version)).unwrap();

        // Offline: clean as made.
        let report = ok(&["check", p(&pool)]);
        assert!(!report.contains("problem"), "v{version}: {report}");

        // Served as made: not upgraded by the open, every volume and
        // snapshot listed and read over NBD as the manifest recorded.
        let mut daemon = Daemon::start_in(dir, &["--initial-volume", "none"]);
        assert_eq!(format_version(&daemon), u64::from(version.number()));
        unlock(&daemon, &made.keys);
        let want: BTreeMap<String, (u64, bool)> = made
            .volumes
            .iter()
            .map(|(name, (size, snapshot, _))| (name.clone(), (*size, *snapshot)))
            .collect();
        assert_eq!(listed(&daemon), want, "v{version}: volume list");
        let mut model = BTreeMap::new();
        for (name, (_, _, crc)) in &made.volumes {
            let bytes = read_export(&daemon, name);
            assert_eq!(crc32c::crc32c(&bytes), *crc, "v{version}: {name} over NBD");
            model.insert(name.clone(), bytes);
        }
        // Known bytes, independent of the manifest: the first write.
        assert_eq!(model["base@s1"][..256 * KIB], pattern(1, 0, 256 * KIB)[..]);

        // Upgraded while served.
        let upgrade = daemon.json(&["pool", "upgrade"]);
        assert_eq!(upgrade["upgraded"], !version.is_newest(), "v{version}");
        assert_eq!(
            format_version(&daemon),
            u64::from(FormatVersion::NEWEST.number())
        );
        assert_serves(&daemon, &model, &format!("v{version} upgraded"));

        // Writes over every chunk `base`'s snapshots share (and the partial
        // extents of versions 7 and 8), then a snapshot and a clone of it.
        let mut base = model["base"].clone();
        base[64 * KIB..80 * KIB].copy_from_slice(&pattern(20, 64 * 1024, 16 * KIB));
        base[136 * KIB..140 * KIB].copy_from_slice(&pattern(21, 136 * 1024, 4 * KIB));
        write_export(&daemon, "base", &base);
        model.insert("base".into(), base.clone());
        daemon.ok(&["snapshot", "create", "base@after"]);
        model.insert("base@after".into(), base.clone());
        daemon.ok(&["clone", "base@after", "clone2"]);
        let mut clone2 = base;
        clone2[..64 * KIB].copy_from_slice(&pattern(22, 0, 64 * KIB));
        write_export(&daemon, "clone2", &clone2);
        model.insert("clone2".into(), clone2);
        if model.contains_key("cow") {
            let mut cow = model["cow"].clone();
            cow[..32 * KIB].copy_from_slice(&pattern(23, 0, 32 * KIB));
            write_export(&daemon, "cow", &cow);
            model.insert("cow".into(), cow);
        }
        assert_serves(&daemon, &model, &format!("v{version} after the writes"));

        // Through a clean stop, an offline check and a restart.
        daemon.stop_cleanly();
        let pool = daemon.path("pool");
        let report = ok(&["check", p(&pool)]);
        assert!(!report.contains("problem"), "v{version}: {report}");
        daemon.restart(&["--initial-volume", "none"]);
        assert_eq!(
            format_version(&daemon),
            u64::from(FormatVersion::NEWEST.number())
        );
        unlock(&daemon, &made.keys);
        assert_serves(&daemon, &model, &format!("v{version} restarted"));
        daemon.stop_cleanly();
    }
}
