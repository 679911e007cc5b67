//! `arbor serve --nbd-socket` with real NBD clients (libnbd's nbdcopy and
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
    pool: TestPool,
    daemon: Daemon,
}

impl Served {
    fn start() -> Self {
        let pool = TestPool::new("128M");
        let nbd = pool.file("nbd.sock");
        let daemon = Daemon::start(&pool, &["--nbd-socket", p(&nbd)]);
        Self { pool, daemon }
    }

    fn uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{export}?socket={}",
            p(&self.pool.file("nbd.sock"))
        )
    }

    fn manage(&self, args: &[&str]) -> String {
        ok(&[&["--daemon", self.daemon.address()], args].concat())
    }

    fn write_image(&self, export: &str, image: &[u8]) {
        let source = self.pool.file("in.raw");
        std::fs::write(&source, image).unwrap();
        nbd_ok("nbdcopy", &[p(&source), &self.uri(export)]);
    }

    fn read_image(&self, export: &str, len: usize) -> Vec<u8> {
        let target = self.pool.file("out.raw");
        nbd_ok("nbdcopy", &[&self.uri(export), p(&target)]);
        let mut data = std::fs::read(&target).unwrap();
        data.truncate(len);
        data
    }
}

#[test]
fn volumes_and_snapshots_are_nbd_exports() {
    let served = Served::start();
    served.manage(&["create", "vm", "--size", "8M"]);
    let first = random_image(10, 3 * MIB);
    served.write_image("vm", &first);
    served.manage(&["snapshot", "vm@before"]);
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

    let source = served.pool.file("in.raw");
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
    served.manage(&["create", "late", "--size", "1M"]);
    served.manage(&["resize", "vm", "16M"]);
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

    let Served { pool, daemon } = served;
    let (status, log) = daemon.stop("TERM");
    assert!(status.success(), "daemon failed: {log}");
    assert!(
        !pool.file("nbd.sock").exists(),
        "NBD socket removed on shutdown"
    );
    let exported = pool.file("vm.raw");
    ok(&["export", pool.path(), "vm", p(&exported)]);
    let mut data = std::fs::read(&exported).unwrap();
    data.truncate(3 * MIB);
    assert!(data == second, "NBD writes survive the daemon's shutdown");
    assert!(ok(&["check", pool.path()]).contains("clean"));
}
