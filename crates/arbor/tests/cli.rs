//! The offline CLI end to end, through the built binary.

mod common;

use common::*;

const IMAGE_LEN: usize = 3_000_000 + 100; // not a multiple of 512 on purpose

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The first `len` bytes of an exported image, checking the rest is zeros
/// (export is volume-sized; the image was padded to 512).
fn exported(path: &std::path::Path, len: usize) -> Vec<u8> {
    let mut data = read(path);
    assert!(data[len..].iter().all(|&b| b == 0), "padding is not zeros");
    data.truncate(len);
    data
}

#[test]
fn volume_lifecycle_round_trips_data() {
    let pool = TestPool::new("256M");
    let image = random_image(1, IMAGE_LEN);
    let source = pool.file("source.raw");
    std::fs::write(&source, &image).unwrap();

    ok(&["create", pool.path(), "base", "--size", "8M"]);
    let out = ok(&["import", pool.path(), "base", p(&source)]);
    assert!(out.contains("imported"), "{out}");
    ok(&["snapshot", pool.path(), "base@v1"]);
    ok(&["clone", pool.path(), "base@v1", "work"]);

    // Overwrite the volume with a second image: its zero stretches must
    // replace the old data, not be skipped over it.
    let second = random_image(2, IMAGE_LEN);
    let second_path = pool.file("second.raw");
    std::fs::write(&second_path, &second).unwrap();
    ok(&["import", pool.path(), "base", p(&second_path)]);

    for (name, expected) in [("base", &second), ("base@v1", &image), ("work", &image)] {
        let target = pool.file(&format!("{name}.out"));
        ok(&["export", pool.path(), name, p(&target)]);
        assert_eq!(
            read(&target).len(),
            8 << 20,
            "{name} export is volume-sized"
        );
        assert!(&exported(&target, IMAGE_LEN) == expected, "{name} differs");
    }

    let list = json(&["list", pool.path(), "--json"]);
    let rows = list.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["base", "base@v1", "work"]);
    assert_eq!(rows[1]["kind"], "snapshot");
    assert_eq!(rows[1]["parent"], "base");
    assert_eq!(rows[2]["parent"], "base@v1");
    assert_eq!(rows[2]["size"], 8 << 20);

    let table = ok(&["list", pool.path()]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("8 MiB"), "{table}");

    let stats = json(&["stats", pool.path(), "work", "--json"]);
    assert_eq!(stats["logical_bytes"], 8 << 20);
    assert_eq!(
        stats["exclusive_bytes"], 0,
        "a fresh clone shares everything"
    );
    assert!(stats["shared_bytes"].as_u64().unwrap() > 0);

    let same = json(&["diff", pool.path(), "work", "base@v1", "--json"]);
    assert_eq!(same.as_array().unwrap().len(), 0);
    let changed = json(&["diff", pool.path(), "base", "base@v1", "--json"]);
    let first = &changed.as_array().unwrap()[0];
    assert_eq!(first["offset"], 0);
    assert!(first["len"].as_u64().unwrap() > 0);

    ok(&["rollback", pool.path(), "base", "base@v1"]);
    let rolled = pool.file("rolled.out");
    ok(&["export", pool.path(), "base", p(&rolled)]);
    assert!(exported(&rolled, IMAGE_LEN) == image);

    ok(&["rename", pool.path(), "base", "gold"]);
    ok(&["resize", pool.path(), "work", "16M"]);
    let list = json(&["list", pool.path(), "--json"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["gold", "gold@v1", "work"],
        "snapshots follow a rename"
    );

    ok(&["delete", pool.path(), "work"]);
    ok(&["delete", pool.path(), "gold@v1"]);
    ok(&["reclaim", pool.path()]);
    let info = json(&["pool", "info", pool.path(), "--json"]);
    assert_eq!(info["reclaim_pending"], false);
    assert_eq!(info["volumes"], 1);
    assert_eq!(info["snapshots"], 0);
    let check = ok(&["check", pool.path()]);
    assert!(check.contains("clean"), "{check}");
}

#[test]
fn import_creates_a_volume_sized_to_the_file_and_stays_sparse() {
    let pool = TestPool::new("64M");
    let mut image = vec![0u8; 1 << 20];
    image[700_000..700_010].copy_from_slice(b"0123456789");
    image.truncate(1_000_001);
    let source = pool.file("sparse.raw");
    std::fs::write(&source, &image).unwrap();

    ok(&["import", pool.path(), "disk", p(&source)]);
    let list = json(&["list", pool.path(), "--json"]);
    let disk = &list[0];
    assert_eq!(disk["size"], 1_000_448, "rounded up to 512");
    let chunk = json(&["pool", "info", pool.path(), "--json"])["chunk_size"].clone();
    assert_eq!(disk["mapped_bytes"], chunk, "only the non-zero chunk");

    let target = pool.file("disk.out");
    ok(&["export", pool.path(), "disk", p(&target)]);
    assert_eq!(exported(&target, image.len()), image);
}

#[test]
fn bad_input_fails_cleanly() {
    let pool = TestPool::new("64M");
    let path = pool.path();
    for bad in ["10X", "1.5G", "", "-1", "99999999999E"] {
        fails(&["create", path, "v", &format!("--size={bad}")], "invalid");
    }
    fails(&["create", path, "v", "--size", "1000"], "multiple of 512");
    fails(&["create", path, "a/b", "--size", "1M"], "invalid name");
    fails(
        &["create", path, "-v", "--size", "1M"],
        "unexpected argument",
    );
    fails(&["snapshot", path, "nosnap"], "volume@snapshot");
    fails(&["delete", path, "ghost"], "no such volume");
    fails(&["stats", path, "ghost"], "no such volume");
    fails(&["diff", path, "ghost", "ghost2"], "no such volume");
    fails(
        &["export", path, "ghost", p(&pool.file("x"))],
        "no such volume",
    );
    fails(
        &["import", path, "v", p(&pool.file("missing"))],
        "cannot open",
    );

    ok(&["create", path, "v", "--size", "1M"]);
    fails(&["create", path, "v", "--size", "1M"], "already exists");
    ok(&["snapshot", path, "v@s"]);
    fails(&["resize", path, "v@s", "2M"], "read-only");
    fails(&["clone", path, "v", "c"], "not a snapshot");
    let big = pool.file("big.raw");
    std::fs::write(&big, vec![1u8; 2 << 20]).unwrap();
    fails(&["import", path, "v", p(&big)], "resize it first");

    fails(&["list", p(&pool.file("nothing"))], "cannot open");
    let junk = pool.file("junk");
    std::fs::write(&junk, vec![7u8; 1 << 20]).unwrap();
    fails(&["list", p(&junk)], "not an arbor pool");
    fails(&["no-such-command"], "unrecognized subcommand");
}

#[test]
fn pool_create_protects_existing_data() {
    let pool = TestPool::new("64M");
    ok(&["create", pool.path(), "keep", "--size", "1M"]);
    fails(
        &["pool", "create", pool.path(), "--size", "64M"],
        "already contains an arbor pool",
    );
    assert_eq!(json(&["list", pool.path(), "--json"])[0]["name"], "keep");

    ok(&["pool", "create", pool.path(), "--size", "32M", "--force"]);
    assert_eq!(
        json(&["list", pool.path(), "--json"]),
        serde_json::json!([])
    );

    let data = pool.file("data");
    std::fs::write(&data, b"precious").unwrap();
    fails(
        &["pool", "create", p(&data), "--size", "64M"],
        "already contains data",
    );
    assert_eq!(read(&data), b"precious");

    let missing = pool.file("new.img");
    fails(&["pool", "create", p(&missing)], "--size is required");
    assert!(!missing.exists(), "a failed create leaves no file behind");
    fails(
        &[
            "pool",
            "create",
            p(&missing),
            "--size",
            "64M",
            "--chunk-size",
            "3K",
        ],
        "chunk size",
    );
    fails(
        &["pool", "create", p(&missing), "--size", "1M"],
        "too small",
    );
    assert!(!missing.exists());
    ok(&[
        "pool",
        "create",
        p(&missing),
        "--size",
        "64M",
        "--chunk-size",
        "4K",
        "--metadata-size",
        "8M",
    ]);
    let info = json(&["pool", "info", p(&missing), "--json"]);
    assert_eq!(info["chunk_size"], 4096);
    assert_eq!(info["metadata_bytes"], 8 << 20);
}

#[test]
fn help_and_version_succeed() {
    assert!(ok(&["--help"]).contains("snapshot"));
    assert!(ok(&["--version"]).contains(env!("CARGO_PKG_VERSION")));
    assert!(ok(&["pool", "create", "--help"]).contains("--chunk-size"));
}

#[test]
fn check_fails_on_a_damaged_pool() {
    let pool = TestPool::new("64M");
    ok(&["create", pool.path(), "v", "--size", "1M"]);
    ok(&["snapshot", pool.path(), "v@s"]);
    // Break the checksum of every metadata node (block type 4).
    let mut image = read(&pool.path);
    for block in image.chunks_exact_mut(4096) {
        if block.starts_with(b"ARBR") && block[6..8] == [4, 0] {
            block[100] ^= 0xff;
        }
    }
    std::fs::write(&pool.path, &image).unwrap();
    fails(&["check", pool.path()], "damaged");
}
