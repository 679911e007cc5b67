//! `nbdinfo`: listing, export information, capability flags, allocation map.

use std::sync::Arc;

use arbor_nbd::memory::MemoryExport;
use arbor_nbd::Export;

use crate::common::{memory, run, tool, TestServer, MIB};

fn nbdinfo() -> std::process::Command {
    tool("nbdinfo", "libnbd-bin")
}

#[test]
fn list_shows_every_export_with_its_description() {
    let server = TestServer::start(vec![
        (
            "vol-a",
            Arc::new(MemoryExport::new(MIB).with_description("first volume")),
        ),
        ("snap-b", Arc::new(MemoryExport::new(2 * MIB).read_only())),
    ]);
    let listing = run(nbdinfo().args(["--list", "--json", &server.uri("")]));
    assert!(listing.contains("\"vol-a\""), "{listing}");
    assert!(listing.contains("first volume"), "{listing}");
    assert!(listing.contains("\"snap-b\""), "{listing}");
}

#[test]
fn size_and_block_sizes_are_reported() {
    let server = TestServer::start(vec![("vol", memory(3 * MIB))]);
    let size = run(nbdinfo().args(["--size", &server.uri("vol")]));
    assert_eq!(size.trim(), (3 * MIB).to_string());
    let info = run(nbdinfo().args(["--json", &server.uri("vol")]));
    for expected in [
        "\"block_size_minimum\": 512",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 33554432",
    ] {
        assert!(info.contains(expected), "missing {expected} in {info}");
    }
}

#[test]
fn capabilities_of_a_writable_export() {
    let server = TestServer::start(vec![("vol", memory(MIB))]);
    for flag in [
        "connect",
        "read",
        "write",
        "flush",
        "fua",
        "trim",
        "zero",
        "fast-zero",
        "df",
        "multi-conn",
        "cache",
        "structured-reply",
    ] {
        let status = nbdinfo()
            .args(["--can", flag, &server.uri("vol")])
            .status()
            .expect("nbdinfo");
        assert!(status.success(), "writable export should have --can {flag}");
    }
    let read_only = nbdinfo()
        .args(["--is", "read-only", &server.uri("vol")])
        .status()
        .expect("nbdinfo");
    assert_eq!(
        read_only.code(),
        Some(2),
        "writable export reported read-only"
    );
}

#[test]
fn capabilities_of_a_read_only_export() {
    let server = TestServer::start(vec![("snap", Arc::new(MemoryExport::new(MIB).read_only()))]);
    let ask = |args: &[&str]| {
        nbdinfo()
            .args(args)
            .arg(server.uri("snap"))
            .status()
            .expect("nbdinfo")
            .code()
    };
    assert_eq!(ask(&["--is", "read-only"]), Some(0));
    for flag in ["write", "trim", "zero", "fast-zero", "fua"] {
        assert_eq!(
            ask(&["--can", flag]),
            Some(2),
            "read-only export has --can {flag}"
        );
    }
    for flag in ["connect", "read", "flush", "multi-conn", "cache", "df"] {
        assert_eq!(
            ask(&["--can", flag]),
            Some(0),
            "read-only export lacks --can {flag}"
        );
    }
}

#[test]
fn map_shows_data_and_holes_after_trim() {
    let export = memory(8 * MIB);
    export.write(0, &vec![0xAB; 4 * MIB as usize]).unwrap();
    export.trim(MIB, MIB).unwrap();
    let server = TestServer::start(vec![("vol", export)]);
    let map = run(nbdinfo().args(["--map", "--totals", &server.uri("vol")]));
    // --totals prints: bytes percent type description
    let data_line = map
        .lines()
        .find(|line| line.contains("data"))
        .unwrap_or_else(|| panic!("no data line in {map}"));
    let data_bytes: u64 = data_line
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(data_bytes, 3 * MIB, "{map}");

    let extents = run(nbdinfo().args(["--map", &server.uri("vol")]));
    let expected = [
        (0, MIB, "data"),
        (MIB, MIB, "hole,zero"),
        (2 * MIB, 2 * MIB, "data"),
        (4 * MIB, 4 * MIB, "hole,zero"),
    ];
    let got: Vec<(u64, u64, String)> = extents
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[3].to_owned(),
            )
        })
        .collect();
    let expected: Vec<(u64, u64, String)> = expected
        .iter()
        .map(|(offset, len, kind)| (*offset, *len, kind.to_string()))
        .collect();
    assert_eq!(got, expected, "{extents}");
}

#[test]
fn exports_are_looked_up_on_every_connection() {
    let server = TestServer::start(vec![("vol", memory(MIB))]);
    let size = || run(nbdinfo().args(["--size", &server.uri("vol")]));
    assert_eq!(size().trim(), MIB.to_string());
    // A resize (or any replacement) is seen by the next connection.
    server.table.insert("vol", memory(2 * MIB));
    assert_eq!(size().trim(), (2 * MIB).to_string());
    server.table.insert("new", memory(MIB));
    let listing = run(nbdinfo().args(["--list", &server.uri("")]));
    assert!(listing.contains("new"), "{listing}");
    server.table.remove("vol");
    let gone = nbdinfo()
        .args(["--size", &server.uri("vol")])
        .output()
        .expect("nbdinfo");
    assert!(!gone.status.success());
}
