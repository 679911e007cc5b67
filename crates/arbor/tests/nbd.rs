//! `arbor serve`'s NBD socket with real NBD clients (libnbd's nbdcopy and
//! nbdinfo, from Debian's libnbd-bin, which CI installs).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Command, Output, Stdio};

use common::*;

const MIB: usize = 1 << 20;

fn nbd_tool(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): `apt-get install libnbd-bin` for the NBD tests")
        })
}

fn nbd_ok(program: &str, args: &[&str]) -> String {
    let out = nbd_tool(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        stderr(&out)
    );
    stdout(&out)
}

struct Served {
    daemon: Daemon,
}

impl Served {
    fn start() -> Self {
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Self {
        Self {
            daemon: Daemon::start(&[&["--initial-volume", "none"], extra].concat()),
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.daemon.nbd_socket())
    }

    fn manage(&self, args: &[&str]) -> String {
        self.daemon.ok(args)
    }

    fn write_image(&self, export: &str, image: &[u8]) {
        let source = self.daemon.path("in.raw");
        std::fs::write(&source, image).unwrap();
        nbd_ok("nbdcopy", &[p(&source), &self.uri(export)]);
    }

    /// Flips a byte of the one 4 KiB block of the pool file that holds
    /// only `byte`, behind the daemon's back; returns the block's offset.
    fn damage_block_of(&self, byte: u8) -> u64 {
        use std::os::unix::fs::FileExt;
        let pool_file = self.daemon.path("pool");
        let image = std::fs::read(&pool_file).unwrap();
        let at = image
            .chunks(4096)
            .position(|b| b.iter().all(|&x| x == byte))
            .expect("the block in the pool file") as u64
            * 4096;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&pool_file)
            .unwrap();
        file.write_all_at(&[!byte], at + 100).unwrap();
        file.sync_all().unwrap();
        at
    }

    fn read_image(&self, export: &str, len: usize) -> Vec<u8> {
        let target = self.daemon.path("out.raw");
        nbd_ok("nbdcopy", &[&self.uri(export), p(&target)]);
        let mut data = std::fs::read(&target).unwrap();
        data.truncate(len);
        data
    }
}

/// `len` bytes of seeded random data.
fn random_image(seed: u64, len: usize) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    data
}

#[test]
fn volumes_and_snapshots_are_nbd_exports() {
    let served = Served::start();
    served.manage(&["volume", "create", "vm", "--size", "8M"]);
    let first = random_image(10, 3 * MIB);
    served.write_image("vm", &first);
    served.manage(&["snapshot", "create", "vm@before"]);
    let second = random_image(11, 3 * MIB);
    served.write_image("vm", &second);

    assert!(served.read_image("vm", 3 * MIB) == second);
    assert!(
        served.read_image("vm@before", 3 * MIB) == first,
        "the snapshot kept its data"
    );

    let list = nbd_ok("nbdinfo", &["--list", &served.uri("")]);
    assert!(list.contains("export=\"vm\""), "{list}");
    assert!(list.contains("export=\"vm@before\""), "{list}");

    let source = served.daemon.path("in.raw");
    let refused = nbd_tool("nbdcopy", &[p(&source), &served.uri("vm@before")]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("read-only"),
        "{}",
        stderr(&refused)
    );

    let map = nbd_ok("nbdinfo", &["--map", &served.uri("vm")]);
    assert!(map.contains("hole,zero"), "unwritten tail is a hole: {map}");

    // Exports are looked up per connection: new and resized volumes show.
    served.manage(&["volume", "create", "late", "--size", "1M"]);
    served.manage(&["volume", "resize", "vm", "16M"]);
    assert_eq!(
        nbd_ok("nbdinfo", &["--size", &served.uri("late")]).trim(),
        "1048576"
    );
    assert_eq!(
        nbd_ok("nbdinfo", &["--size", &served.uri("vm")]).trim(),
        "16777216"
    );
    let missing = nbd_tool("nbdinfo", &["--size", &served.uri("ghost")]);
    assert!(!missing.status.success());

    let Served { mut daemon } = served;
    daemon.stop_cleanly();
    assert!(
        !daemon.path("nbd.sock").exists(),
        "NBD socket removed on shutdown"
    );
    daemon.restart(&[]);
    let restarted = Served { daemon };
    assert!(
        restarted.read_image("vm", 3 * MIB) == second,
        "NBD writes survive the daemon's shutdown"
    );
}

/// A raw NBD client that opens its export with `NBD_OPT_EXPORT_NAME`, so it
/// never learns the block sizes and may send any byte offset and length.
struct RawClient {
    stream: std::os::unix::net::UnixStream,
    cookie: u64,
}

impl RawClient {
    const CMD_READ: u16 = 0;
    const CMD_WRITE: u16 = 1;
    const CMD_FLUSH: u16 = 3;
    const CMD_TRIM: u16 = 4;
    const CMD_WRITE_ZEROES: u16 = 6;

    fn open(socket: &str, export: &str) -> (Self, u64) {
        use std::io::{Read, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(120)))
            .unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        // FIXED_NEWSTYLE | NO_ZEROES, then EXPORT_NAME.
        stream.write_all(&3u32.to_be_bytes()).unwrap();
        let mut option = b"IHAVEOPT".to_vec();
        option.extend_from_slice(&1u32.to_be_bytes());
        option.extend_from_slice(&(export.len() as u32).to_be_bytes());
        option.extend_from_slice(export.as_bytes());
        stream.write_all(&option).unwrap();
        let mut reply = [0u8; 10];
        stream.read_exact(&mut reply).unwrap();
        let size = u64::from_be_bytes(reply[..8].try_into().unwrap());
        (Self { stream, cookie: 0 }, size)
    }

    /// One request; returns the reply's error and, for a read, its data.
    fn request(&mut self, kind: u16, offset: u64, length: u32, data: &[u8]) -> (u32, Vec<u8>) {
        use std::io::{Read, Write};
        self.cookie += 1;
        let mut header = 0x2560_9513u32.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&kind.to_be_bytes());
        header.extend_from_slice(&self.cookie.to_be_bytes());
        header.extend_from_slice(&offset.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(data);
        self.stream.write_all(&header).unwrap();
        let mut reply = [0u8; 16];
        self.stream.read_exact(&mut reply).unwrap();
        assert_eq!(
            u32::from_be_bytes(reply[..4].try_into().unwrap()),
            0x6744_6698
        );
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        assert_eq!(
            u64::from_be_bytes(reply[8..].try_into().unwrap()),
            self.cookie
        );
        let mut data = Vec::new();
        if kind == Self::CMD_READ && error == 0 {
            data = vec![0u8; length as usize];
            self.stream.read_exact(&mut data).unwrap();
        }
        (error, data)
    }
}

/// A client that never negotiated block sizes is served at any byte offset
/// and length (the spec asks this of servers; nbd-server does it): random
/// reads, writes, zeroes and trims against a model, across a restart. An
/// unaligned trim is served on its whole sectors.
#[test]
fn byte_granular_requests_match_a_model() {
    byte_granular_requests_match_a_model_with("buffered");
}

/// The same through direct I/O (`--io direct`): unaligned requests become
/// read-modify-writes of whole sectors in the I/O layer, and requests run
/// on the blocking pool, not inline.
#[test]
fn byte_granular_requests_match_a_model_with_direct_io() {
    byte_granular_requests_match_a_model_with("direct");
}

fn byte_granular_requests_match_a_model_with(io: &str) {
    use rand::{Rng, SeedableRng};
    const SIZE: usize = 4 * MIB;
    let mut served = Served::start_with(&["--io", io]);
    let status = served.daemon.json(&["pool", "status"]);
    assert_eq!(status["io"], io, "{status}");
    served.manage(&["volume", "create", "bytes", "--size", "4M"]);
    let socket = served.daemon.nbd_socket();
    let (mut client, size) = RawClient::open(&socket, "bytes");
    assert_eq!(size, SIZE as u64);
    let mut model = vec![0u8; SIZE];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..600u32 {
        let offset = rng.gen_range(0..SIZE);
        let len = rng.gen_range(1..=(SIZE - offset).min(70_000));
        match round % 6 {
            0..=2 => {
                let data: Vec<u8> = (0..len).map(|i| (round as usize + i) as u8 | 1).collect();
                let (error, _) =
                    client.request(RawClient::CMD_WRITE, offset as u64, len as u32, &data);
                assert_eq!(error, 0, "write {offset}+{len}");
                model[offset..offset + len].copy_from_slice(&data);
            }
            3 => {
                let (error, data) =
                    client.request(RawClient::CMD_READ, offset as u64, len as u32, &[]);
                assert_eq!(error, 0, "read {offset}+{len}");
                assert!(
                    data == model[offset..offset + len],
                    "read {offset}+{len} differs"
                );
            }
            4 => {
                let (error, _) =
                    client.request(RawClient::CMD_WRITE_ZEROES, offset as u64, len as u32, &[]);
                assert_eq!(error, 0, "zeroes {offset}+{len}");
                model[offset..offset + len].fill(0);
            }
            _ => {
                let (error, _) =
                    client.request(RawClient::CMD_TRIM, offset as u64, len as u32, &[]);
                assert_eq!(error, 0, "trim {offset}+{len}");
                // arbor trims the whole sectors inside the range: they read
                // as zeros; the sub-sector ends keep their data.
                let start = offset.div_ceil(512) * 512;
                let end = (offset + len) / 512 * 512;
                if start < end {
                    model[start..end].fill(0);
                }
            }
        }
    }
    // Past the end: refused, as for every client.
    let (error, _) = client.request(RawClient::CMD_READ, SIZE as u64 - 1, 2, &[]);
    assert_eq!(error, 22, "EINVAL");
    let (error, _) = client.request(RawClient::CMD_FLUSH, 0, 0, &[]);
    assert_eq!(error, 0);
    drop(client);
    served.daemon.stop_cleanly();
    served
        .daemon
        .restart(&["--initial-volume", "none", "--io", io]);
    assert!(served.read_image("bytes", SIZE) == model, "after a restart");
}

/// Runs qemu-io's `commands` on `uri`, asserting each succeeded (qemu-io
/// exits 0 even when a command fails); returns its output.
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for each in commands {
        command.args(["-c", each]);
    }
    let out = command.arg(uri).output().expect("qemu-io (qemu-utils)");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        out.status.success() && !text.contains("error") && !text.contains("failed"),
        "{text}"
    );
    text
}

/// qemu-io discards with byte offsets: the whole sectors inside go, the
/// command succeeds (qemu's block layer sends the sub-sector rest of a
/// discard too; a trim is advisory).
#[test]
fn unaligned_discards_from_qemu_succeed() {
    let served = Served::start();
    served.manage(&["volume", "create", "q", "--size", "1M"]);
    served.write_image("q", &vec![0x55; MIB]);
    qemu_io(&served.uri("q"), &["discard 100 5000"]);
    // Which sectors inside go is qemu's choice (it aligns discards to the
    // granularity it learned); nothing outside the range may change.
    let image = served.read_image("q", MIB);
    assert!(image[..100].iter().all(|&b| b == 0x55), "before the range");
    assert!(
        image[100..5100].iter().all(|&b| b == 0x55 || b == 0),
        "inside the range"
    );
    assert!(image[5100..].iter().all(|&b| b == 0x55), "after the range");
}

/// A client that never learned the 32 MiB maximum may send larger requests
/// (the NBD reference tester's huge-integrity trace sends 47.5 MiB): 48 MiB
/// writes and reads at byte offsets are served, up to 64 MiB within the
/// memory budget; beyond, `EINVAL`.
#[test]
fn large_requests_from_clients_that_never_learned_the_maximum() {
    const SIZE: usize = 64 * MIB;
    let served = Served::start();
    // Bigger than the largest request, so only the payload limit refuses.
    served.manage(&["volume", "create", "big", "--size", "80M"]);
    let (mut client, _) = RawClient::open(&served.daemon.nbd_socket(), "big");
    let len = 48 * MIB + 3;
    let data = random_image(48, len);
    let (error, _) = client.request(RawClient::CMD_WRITE, 1001, len as u32, &data);
    assert_eq!(error, 0, "48 MiB write");
    let (error, back) = client.request(RawClient::CMD_READ, 1001, len as u32, &[]);
    assert_eq!(error, 0, "48 MiB read");
    assert!(back == data, "the 48 MiB read differs from the write");
    let (error, whole) = client.request(RawClient::CMD_READ, 0, SIZE as u32, &[]);
    assert_eq!(error, 0, "64 MiB read");
    assert!(whole[1001..1001 + len] == data[..] && whole[..1001].iter().all(|&b| b == 0));
    let (error, _) = client.request(RawClient::CMD_READ, 0, SIZE as u32 + 512, &[]);
    assert_eq!(error, 22, "past 64 MiB: EINVAL");
    // The connection is still in step after the refusal.
    let (error, tail) = client.request(RawClient::CMD_READ, 80 * MIB as u64 - 4, 4, &[]);
    assert_eq!(error, 0);
    assert_eq!(tail, vec![0; 4]);
}

/// With extended headers (which qemu 10 negotiates), one request may cover
/// more than 4 GiB: qemu-io's 6 GiB `write -z -u -n` (one request and one
/// `Export::write_zeroes` call, as arbor-nbd's tests/interop/extended.rs
/// shows on the wire) zeroes the engine volume's whole range, and only it.
#[test]
fn a_6_gib_zeroing_from_qemu_unmaps_exactly_its_range() {
    let served = Served::start();
    served.manage(&["volume", "create", "huge", "--size", "8G"]);
    let uri = served.uri("huge");
    let text = qemu_io(
        &uri,
        &[
            "write -P 0x33 0 64k",
            "write -P 0x44 5G 64k",
            "write -P 0x55 7G 64k",
            "write -z -u -n 1G 6G",
            "read -P 0x33 0 64k",
            "read -P 0 5G 64k",
            "read -P 0x55 7G 64k",
        ],
    );
    assert!(text.contains("wrote 6442450944/6442450944 bytes at offset 1073741824"));
    // Nothing in the zeroed range is still mapped.
    let map = nbd_ok("nbdinfo", &["--map", &uri]);
    let data: Vec<(u64, u64)> = map
        .lines()
        .filter(|line| line.trim_end().ends_with("data"))
        .map(|line| {
            let mut fields = line.split_whitespace();
            let mut number = || fields.next().unwrap().parse::<u64>().unwrap();
            (number(), number())
        })
        .collect();
    const GIB: u64 = 1 << 30;
    assert!(!data.is_empty(), "{map}");
    assert!(
        data.iter()
            .all(|&(offset, len)| offset + len <= GIB || offset >= 7 * GIB),
        "{map}"
    );
}

/// A data block damaged in the pool file under a served volume and its
/// snapshot: a real client's read of it fails with EIO (never wrong
/// bytes), the daemon records it, and `pool damage`, `pool status`,
/// `check`, the metrics and the alerts all say so, with who reads it;
/// rewritten whole, it is gone from every one of them.
#[test]
fn a_damaged_block_fails_reads_with_eio_and_is_listed_everywhere_until_rewritten() {
    let served = Served::start();
    served.manage(&["volume", "create", "v", "--size", "16M"]);
    let uri = served.uri("v");
    // A block of one byte value, found again in the pool file below.
    qemu_io(&uri, &["write -P 0x5a 1M 4k"]);
    served.manage(&["pool", "flush"]);
    served.manage(&["snapshot", "create", "v@s"]);
    let at = served.damage_block_of(0x5a);
    // qemu-io reports the failed read; nothing of it is returned as data.
    for export in ["v", "v@s"] {
        let out = Command::new("qemu-io")
            .args(["-r", "-f", "raw", "-c", "read -P 0x5a 1M 4k"])
            .arg(served.uri(export))
            .output()
            .unwrap();
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(
            text.contains("Input/output error"),
            "{export}: a read of the damaged block: {text}"
        );
    }
    // Listed with both readers, and where they read it.
    let out = arbor(&served.daemon.args(&["pool", "damage"]));
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("device byte {at}"))
            && text.contains("v at byte 1048576")
            && text.contains("v@s at byte 1048576"),
        "{text}"
    );
    let damage_json = || -> serde_json::Value {
        let out = arbor(&served.daemon.args(&["pool", "damage", "--json"]));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let damage = damage_json();
    assert_eq!(damage["blocks"][0]["readers_count"], 2, "{damage}");
    assert!(damage["found_since_start"].as_u64().unwrap() >= 2);
    let status = served.manage(&["pool", "status"]);
    assert!(status.contains("DAMAGED: 1 data blocks"), "{status}");
    let check = arbor(&served.daemon.args(&["check"]));
    assert_eq!(check.status.code(), Some(8));
    assert!(
        stderr(&check).contains("data is damaged"),
        "{}",
        stderr(&check)
    );
    let (code, metrics) = http(&served.daemon.api_socket(), "GET", "/metrics", "");
    assert_eq!(code, 200);
    assert!(metrics.contains("arbor_data_damaged_blocks 1"), "{metrics}");
    assert!(
        metrics.contains("arbor_data_damage_found_total"),
        "{metrics}"
    );
    let alert = wait_for("the damage alert", 60, || {
        let status = served.daemon.json(&["pool", "status"]);
        status["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["kind"] == "data_damage")
            .cloned()
    });
    assert!(
        alert["message"]
            .as_str()
            .unwrap()
            .ends_with("reads of them fail (arbor pool damage lists them and who reads them)"),
        "{alert}"
    );
    // Rewritten whole in the volume: it reads again there; the snapshot
    // still reads the damaged block until it is deleted.
    qemu_io(&uri, &["write -P 0x77 1M 4k", "read -P 0x77 1M 4k"]);
    let damage = damage_json();
    assert_eq!(
        damage["blocks"][0]["readers"][0]["volume"], "v@s",
        "{damage}"
    );
    served.manage(&["destroy", "v@s"]);
    served.manage(&["pool", "reclaim"]);
    served.manage(&["pool", "flush"]);
    let text = served.manage(&["pool", "damage"]);
    assert!(text.contains("no damaged data blocks"), "{text}");
    assert!(!served.manage(&["pool", "status"]).contains("DAMAGED"));
}

/// A scrub running when the daemon is killed (SIGKILL) goes on by itself
/// after the restart, from where its record stood, and finds a block
/// damaged past that point: its record is durable from `scrub start` on
/// and saved as it goes. The scrub is held at a crawl while clients read
/// (`scrub_busy_rate`), so it is surely running when the daemon dies.
#[test]
fn a_scrub_killed_with_the_daemon_goes_on_after_the_restart() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("arbor.toml");
    std::fs::write(&config, "scrub_busy_rate = \"1M\"\n").unwrap();
    let mut served = Served::start_with(&["--config", p(&config)]);
    served.manage(&["volume", "create", "v", "--size", "96M"]);
    let uri = served.uri("v");
    qemu_io(&uri, &["write -P 0x11 0 64M", "write -P 0x5a 80M 4k"]);
    served.manage(&["pool", "flush"]);
    served.damage_block_of(0x5a);
    // A client reading all the time (one connection, one read after
    // another): the scrub goes at 1 MiB/s after its first step, so 64 MiB
    // would take a minute.
    let mut reader = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\nwhile True:\n    h.pread(4096, 0)\n",
            &uri,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the reader's connection", 60, || {
        let list = served.daemon.json(&["volume", "list"]);
        let v = list
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "v")
            .cloned();
        v.and_then(|v| v["nbd_connections"].as_u64())
            .filter(|&n| n > 0)
            .map(drop)
    });
    served.manage(&["scrub", "start"]);
    let started = served.daemon.json(&["scrub", "status"])["started_unix_secs"].clone();
    wait_for("the scrub's first step", 120, || {
        let status = served.daemon.json(&["scrub", "status"]);
        (status["bytes_read"].as_u64().unwrap() > 0).then_some(())
    });
    let status = served.daemon.json(&["scrub", "status"]);
    assert_eq!(status["state"], "running", "{status}");
    served.daemon.stop("KILL");
    let _ = reader.kill();
    let _ = reader.wait();
    served
        .daemon
        .restart(&["--initial-volume", "none", "--config", p(&config)]);
    // No client I/O now: full speed. Nobody starts it again.
    let status = wait_for("the scrub to finish after the restart", 300, || {
        let status = served.daemon.json(&["scrub", "status"]);
        (status["state"] == "finished").then_some(status)
    });
    assert_eq!(
        status["started_unix_secs"], started,
        "the same scrub went on: {status}"
    );
    assert_eq!(status["damaged_blocks"], 1, "{status}");
    assert_eq!(status["metadata_problems"], 0, "{status}");
    let out = arbor(&served.daemon.args(&["pool", "damage", "--json"]));
    assert_eq!(out.status.code(), Some(8));
    let damage: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        damage["blocks"][0]["readers"][0]["offset"],
        80 << 20,
        "{damage}"
    );
}

/// `arbor receive --heal`: a stream of a snapshot the pool holds, saved
/// before its block was damaged, heals the block for every reader (the
/// volume shares it); the damage record empties, and a second heal finds
/// nothing to do.
#[test]
fn a_stream_of_the_same_snapshot_heals_its_damage_for_every_reader() {
    let served = Served::start();
    served.manage(&["volume", "create", "v", "--size", "16M"]);
    let uri = served.uri("v");
    qemu_io(&uri, &["write -P 0x5a 1M 4k", "write -P 0x21 5M 64k"]);
    served.manage(&["pool", "flush"]);
    served.manage(&["snapshot", "create", "v@s"]);
    let stream = served.daemon.path("s.stream");
    served.manage(&["send", "v@s", "-o", p(&stream)]);
    served.damage_block_of(0x5a);
    let read = |export: &str| {
        let out = Command::new("qemu-io")
            .args(["-r", "-f", "raw", "-c", "read -P 0x5a 1M 4k"])
            .arg(served.uri(export))
            .output()
            .unwrap();
        format!("{}{}", stdout(&out), stderr(&out))
    };
    for export in ["v", "v@s"] {
        assert!(read(export).contains("Input/output error"), "{export}");
    }
    let heal = || {
        arbor(
            &served
                .daemon
                .args(&["receive", "--heal", "v", "-i", p(&stream)]),
        )
    };
    let out = heal();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("healed 1 of 1 damaged blocks of v@s"),
        "{}",
        stdout(&out)
    );
    for export in ["v", "v@s"] {
        let text = read(export);
        assert!(
            !text.contains("error") && text.contains("read 4096/4096"),
            "{export}: {text}"
        );
    }
    let text = served.manage(&["pool", "damage"]);
    assert!(text.contains("no damaged data blocks"), "{text}");
    let check = arbor(&served.daemon.args(&["check"]));
    assert!(check.status.success(), "{}", stderr(&check));
    let out = heal();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("nothing to heal"), "{}", stdout(&out));
    // Usage: an rbd diff carries no identity.
    let out = arbor(&served.daemon.args(&[
        "receive",
        "--heal",
        "v",
        "--format",
        "rbd-diff",
        "-i",
        p(&stream),
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// `arbor scrub`: reads every live chunk once (a snapshot's shared chunks
/// too, once), finds a block damaged in the pool file without any client
/// reading it, records it as a read would, and keeps where it stands in
/// the pool across a stop and a restart.
#[test]
fn a_scrub_finds_damage_no_client_read_and_its_state_survives_a_restart() {
    let mut served = Served::start();
    served.manage(&["volume", "create", "v", "--size", "24M"]);
    let uri = served.uri("v");
    qemu_io(
        &uri,
        &[
            "write -P 0x11 0 8M",
            "write -P 0x5a 9M 4k",
            "write -P 0x22 12M 8M",
        ],
    );
    served.manage(&["snapshot", "create", "v@s"]);
    assert!(served.manage(&["scrub", "status"]).contains("never run"));
    // A clean pool: every live byte read once, nothing found.
    let out = served.manage(&["scrub", "start", "--wait"]);
    assert!(out.contains("finished"), "{out}");
    let status = served.daemon.json(&["scrub", "status"]);
    let live = served.daemon.json(&["pool", "status"])["data_used_bytes"]
        .as_u64()
        .unwrap();
    // Every live chunk once, never twice (twice would be 16 MiB more):
    // the live data moves by a few chunks while it runs, as the scrub's
    // own record and the damage record are rewritten into new chunks and
    // their old ones freed.
    let read_once = |status: &serde_json::Value| {
        let read = status["bytes_read"].as_u64().unwrap();
        let live = status["live_bytes"].as_u64().unwrap();
        assert!(read.abs_diff(live) <= 4 * 16384, "{status}");
    };
    read_once(&status);
    assert_eq!(status["damaged_blocks"], 0);
    assert_eq!(status["metadata_problems"], 0);
    // Every block the clients wrote has a checksum (the scrub's and the
    // damage record's own chunks, written as small properties, hold some
    // blocks without).
    assert!(status["verified_blocks"].as_u64().unwrap() * 4096 + 2 * 16384 >= live);
    // A block damaged where no client reads: the scrub finds it.
    served.damage_block_of(0x5a);
    // Stopped (or already finished: it is fast) and started again: it
    // goes on from where it stood, and reads each live byte once.
    served.manage(&["scrub", "start"]);
    served.manage(&["scrub", "stop"]);
    let out = arbor(&served.daemon.args(&["scrub", "start", "--wait"]));
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(stderr(&out).contains("found damage"), "{}", stderr(&out));
    let status = served.daemon.json(&["scrub", "status"]);
    read_once(&status);
    assert_eq!(status["damaged_blocks"], 1, "{status}");
    let damage = arbor(&served.daemon.args(&["pool", "damage"]));
    assert_eq!(damage.status.code(), Some(8));
    let text = stdout(&damage);
    assert!(
        text.contains("v at byte 9437184") && text.contains("v@s at byte 9437184"),
        "{text}"
    );
    let (_, metrics) = http(&served.daemon.api_socket(), "GET", "/metrics", "");
    assert!(
        metrics.contains("arbor_scrub_damaged_blocks 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("arbor_scrub_progress_ratio 1"),
        "{metrics}"
    );
    // Kept in the pool: a restart shows the finished scrub.
    served.daemon.stop_cleanly();
    served.daemon.restart(&["--initial-volume", "none"]);
    let status = served.daemon.json(&["scrub", "status"]);
    assert_eq!(status["state"], "finished", "{status}");
    assert_eq!(status["damaged_blocks"], 1);
}
