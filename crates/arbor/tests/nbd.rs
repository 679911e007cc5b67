//! `arbor serve`'s NBD socket with real NBD clients (libnbd's nbdcopy and
//! nbdinfo, from Debian's libnbd-bin, which CI installs).

mod common;

use std::process::{Command, Output};

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
        Self {
            daemon: Daemon::start(&["--initial-volume", "none"]),
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
