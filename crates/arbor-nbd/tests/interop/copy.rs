//! Bulk data through real clients: nbdcopy (libnbd) and qemu-img/qemu-io.

use std::path::Path;

use arbor_nbd::Export;
use rand::{RngCore, SeedableRng};

use crate::common::{memory, qemu_io, run, tool, TestServer, MIB};

const IMAGE_SIZE: u64 = 64 * MIB;

/// A 64 MiB image of random data with some all-zero MiBs, so copies
/// exercise both data and zero detection.
fn random_image(path: &Path) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_251_123);
    let mut image = vec![0u8; IMAGE_SIZE as usize];
    for (index, mib) in image.chunks_mut(MIB as usize).enumerate() {
        if index % 5 != 3 {
            rng.fill_bytes(mib);
        }
    }
    std::fs::write(path, &image).expect("write image");
    image
}

fn read_back(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read copy")
}

#[test]
fn nbdcopy_round_trip_over_unix_and_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (source, copy) = (dir.path().join("source.img"), dir.path().join("copy.img"));
    let image = random_image(&source);
    let export = memory(IMAGE_SIZE);
    let server = TestServer::start_with_tcp(vec![("vol", export.clone())]);
    let tcp_uri = format!("nbd://{}/vol", server.tcp.expect("tcp listener"));

    run(tool("nbdcopy", "libnbd-bin").args([source.to_str().unwrap(), &server.uri("vol")]));
    let mut served = vec![0u8; IMAGE_SIZE as usize];
    export.read(0, &mut served).unwrap();
    assert!(
        served == image,
        "export differs from the source after nbdcopy in"
    );

    run(tool("nbdcopy", "libnbd-bin").args([&tcp_uri, copy.to_str().unwrap()]));
    assert!(
        read_back(&copy) == image,
        "nbdcopy out over TCP differs from the source"
    );
}

#[test]
fn qemu_img_convert_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    let (source, copy) = (dir.path().join("source.img"), dir.path().join("copy.img"));
    let image = random_image(&source);
    let server = TestServer::start(vec![("vol", memory(IMAGE_SIZE))]);
    let uri = server.uri("vol");
    let qemu_img = || tool("qemu-img", "qemu-utils");

    run(qemu_img().args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        source.to_str().unwrap(),
        &uri,
    ]));
    run(qemu_img().args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        source.to_str().unwrap(),
        &uri,
    ]));
    run(qemu_img().args([
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &uri,
        copy.to_str().unwrap(),
    ]));
    assert!(
        read_back(&copy) == image,
        "qemu-img convert out differs from the source"
    );
}

#[test]
fn qemu_io_write_read_discard_zero_flush() {
    let export = memory(16 * MIB);
    let server = TestServer::start(vec![("vol", export.clone())]);
    let uri = server.uri("vol");
    qemu_io(
        &uri,
        &[
            "write -P 0x55 0 1M",
            "write -f -P 0x66 1M 512k",
            "read -P 0x55 0 1M",
            "read -P 0x66 1M 512k",
            "aio_write -P 0x77 4M 64k",
            "aio_flush",
            "discard 0 1M",
            "write -z -u 1M 512k",
            "write -z -n -u 2M 64k",
            "read -P 0 1M 512k",
            "flush",
        ],
    );
    let mut buf = vec![0u8; 64 * 1024];
    export.read(4 * MIB, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x77));
    assert!(
        export.allocated_bytes() <= 64 * 1024 + 512 * 1024,
        "discard freed nothing"
    );
}

#[test]
fn qemu_io_unaligned_access_is_handled_by_the_client() {
    // qemu honours the advertised 512-byte minimum with read-modify-write.
    let server = TestServer::start(vec![("vol", memory(MIB))]);
    let output = qemu_io(
        &server.uri("vol"),
        &[
            "write -P 0x11 100 300",
            "read -P 0x11 100 300",
            "read -P 0 0 100",
        ],
    );
    assert!(output.contains("wrote 300/300"), "{output}");
}
