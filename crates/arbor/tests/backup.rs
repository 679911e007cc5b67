//! `arbor backup` end to end with the real binary: a key made, a
//! repository made in a directory, a daemon configured with it backing up
//! snapshots written through NBD (full, then incremental), listing them,
//! restoring one into a new volume read back through NBD, and the errors
//! a user meets.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;

#[test]
fn backups_are_made_listed_and_restored_through_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("backup.key");
    let repo = tmp.path().join("repo");
    ok(&["backup", "new-key", p(&key)]);
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Never over an existing key.
    assert!(!arbor(&["backup", "new-key", p(&key)]).status.success());
    let made = json(&["backup", "init", p(&repo), "--key-file", p(&key), "--json"]);
    assert_eq!(made["block_size"], 65536, "{made}");
    // A second init is refused (exit 2) and changes nothing.
    let config = std::fs::read(repo.join("config")).unwrap();
    fails_with(
        &["backup", "init", p(&repo), "--key-file", p(&key)],
        2,
        "already holds a repository",
    );
    assert_eq!(std::fs::read(repo.join("config")).unwrap(), config);

    let daemon_config = tmp.path().join("arbor.toml");
    std::fs::write(
        &daemon_config,
        format!(
            "backup_repositories = [{{ name = \"local\", url = \"{}\", key_file = \"{}\" }}]\n",
            p(&repo),
            p(&key)
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&[
        "--config",
        p(&daemon_config),
        "--initial-volume-size",
        "32M",
    ]);
    let repositories = daemon.json(&["backup", "repositories"]);
    assert_eq!(repositories[0]["name"], "local", "{repositories}");

    let export = format!("nbd+unix:///disk0?socket={}", daemon.nbd_socket());
    let data = random_file(tmp.path(), "data", 32 << 20, 7);
    nbdcopy(p(&data), &export);
    daemon.ok(&["snapshot", "create", "disk0@one"]);
    let one = daemon.json(&["backup", "create", "local", "disk0@one"]);
    assert_eq!(one["parent"], serde_json::Value::Null, "{one}");
    assert_eq!(one["mapped_bytes"], 32 << 20, "{one}");
    assert!(
        one["added_bytes"].as_u64().unwrap() > 32 << 20,
        "random data does not compress"
    );

    // One MiB written again: the next backup is incremental and adds
    // about that.
    let change = random_file(tmp.path(), "change", 1 << 20, 8);
    nbdcopy(p(&change), &export);
    daemon.ok(&["snapshot", "create", "disk0@two"]);
    let two = daemon.json(&["backup", "create", "local", "disk0@two"]);
    assert_eq!(two["parent"], one["id"], "{two}");
    let added = two["added_bytes"].as_u64().unwrap();
    assert!(
        added > 1 << 20 && added < (1 << 20) + (256 << 10),
        "an incremental backup of 1 MiB added {added} bytes"
    );
    // The newest backed-up snapshot is held (the next one's base).
    let held = daemon.json(&["snapshot", "list"]);
    let holds_of = |name: &str| {
        held.as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["holds"].as_array().map_or(0, Vec::len))
            .unwrap()
    };
    assert_eq!(holds_of("disk0@two"), 1, "{held}");
    assert_eq!(holds_of("disk0@one"), 0, "{held}");

    let list = daemon.json(&["backup", "list", "local"]);
    let backups = list["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 2, "{list}");
    assert_eq!(backups[1]["id"], two["id"]);
    assert!(daemon
        .ok(&["backup", "list", "local"])
        .contains("disk0@two"));

    // Restored by a prefix of its id into a new volume: byte for byte
    // what the snapshot held.
    let id = two["id"].as_str().unwrap();
    let restored = daemon.json(&["backup", "restore", "local", &id[..10], "back"]);
    assert_eq!(restored["volume"], "back", "{restored}");
    let copy = tmp.path().join("copy");
    nbdcopy(
        &format!("nbd+unix:///back?socket={}", daemon.nbd_socket()),
        p(&copy),
    );
    let mut expected = std::fs::read(&data).unwrap();
    expected[..1 << 20].copy_from_slice(&std::fs::read(&change).unwrap());
    assert!(
        std::fs::read(&copy).unwrap() == expected,
        "the restore differs"
    );

    let verified = daemon.json(&["backup", "verify", "local"]);
    assert_eq!(verified["problem_count"], 0, "{verified}");
    assert_eq!(verified["backups"], 2, "{verified}");
    assert_eq!(
        verified["packs_read"], verified["packs_total"],
        "{verified}"
    );
    daemon.fails(&["backup", "verify", "local", "--sample", "0"], 2, "0");

    // Pruned down to the newest backup: a dry run lists what would go and
    // changes nothing; the prune then forgets the first backup and
    // deletes (repacking) the blocks only it needed.
    let files = |dir: &std::path::Path| {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    stack.push(e);
                } else if !e.starts_with(dir.join("locks")) {
                    out.push((e.clone(), std::fs::read(&e).unwrap()));
                }
            }
        }
        out.sort();
        out
    };
    let before = files(&repo);
    let prune = [
        "backup",
        "prune",
        "local",
        "--keep",
        "frequent=1",
        "--repack-unused",
        "5",
    ];
    let dry = daemon.json(&[&prune[..], &["--dry-run"]].concat());
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["forgotten"][0]["backup"]["id"], one["id"], "{dry}");
    assert_eq!(
        dry["forgotten"][0]["reason"], "not kept by retention",
        "{dry}"
    );
    assert_eq!(dry["kept"][0]["backup"]["id"], two["id"], "{dry}");
    assert!(files(&repo) == before, "a dry run changed the repository");
    let text = daemon.ok(&[&prune[..], &["--dry-run"]].concat());
    assert!(
        text.contains("would forget") && text.contains("dry run"),
        "{text}"
    );
    let pruned = daemon.json(&prune);
    assert_eq!(pruned["forgotten"], dry["forgotten"], "{pruned}");
    assert_eq!(pruned["repacked_packs"], dry["repacked_packs"], "{pruned}");
    assert!(
        pruned["removed_blobs"].as_u64().unwrap() >= 16,
        "the first MiB only the first backup had: {pruned}"
    );
    assert!(
        pruned["bytes_after"].as_u64().unwrap() < pruned["bytes_before"].as_u64().unwrap(),
        "{pruned}"
    );
    let list = daemon.json(&["backup", "list", "local"]);
    assert_eq!(list["backups"].as_array().unwrap().len(), 1, "{list}");
    let verified = daemon.json(&["backup", "verify", "local"]);
    assert_eq!(verified["problem_count"], 0, "{verified}");
    daemon.ok(&["backup", "restore", "local", &id[..10], "after-prune"]);
    let copy2 = tmp.path().join("copy2");
    nbdcopy(
        &format!("nbd+unix:///after-prune?socket={}", daemon.nbd_socket()),
        p(&copy2),
    );
    assert!(
        std::fs::read(&copy2).unwrap() == expected,
        "the restore after a prune differs"
    );
    daemon.fails(
        &["backup", "prune", "local", "--keep", "daily=x"],
        2,
        "keep",
    );

    // What a user gets wrong, each with its own status.
    daemon.fails(
        &["backup", "list", "nowhere"],
        4,
        "no backup repository \"nowhere\"",
    );
    daemon.fails(
        &["backup", "restore", "local", &id[..10], "back"],
        5,
        "back",
    );
    daemon.fails(
        &["backup", "restore", "local", "00000000", "x"],
        4,
        "no backup 00000000",
    );
    daemon.fails(&["backup", "create", "local", "disk0"], 2, "not a snapshot");
    assert!(daemon
        .json(&["volume", "list"])
        .to_string()
        .contains("back"));
    assert!(!daemon
        .json(&["volume", "list"])
        .to_string()
        .contains("\"x\""));
}

/// A directory repository "local" in `dir`, made with a new key, and a
/// daemon configuration naming it (with `extra` fields in its entry).
struct LocalRepo {
    key: std::path::PathBuf,
    repo: std::path::PathBuf,
    config: std::path::PathBuf,
}

impl LocalRepo {
    fn new(dir: &std::path::Path) -> Self {
        let r = LocalRepo {
            key: dir.join("backup.key"),
            repo: dir.join("repo"),
            config: dir.join("arbor.toml"),
        };
        ok(&["backup", "new-key", p(&r.key)]);
        ok(&["backup", "init", p(&r.repo), "--key-file", p(&r.key)]);
        r.configure("");
        r
    }

    /// Writes the configuration with `extra` (`, schedule = ...`) in the
    /// repository's entry.
    fn configure(&self, extra: &str) {
        std::fs::write(
            &self.config,
            format!(
                "backup_repositories = [{{ name = \"local\", url = \"{}\", key_file = \"{}\"{extra} }}]\n",
                p(&self.repo),
                p(&self.key)
            ),
        )
        .unwrap();
    }
}

/// Polls `check` every 100 ms until it holds (a generous bound: only a
/// hang fails on time).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn scheduled_backups_run_alert_on_failure_and_keep_one_snapshot_per_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let local = LocalRepo::new(tmp.path());
    local.configure(
        ", schedule = \"every 2s\", volumes = [\"disk0\", \"nope\"], keep = \"frequent=1\"",
    );
    let config = local.config.clone();
    let daemon = Daemon::start(&["--config", p(&config), "--initial-volume-size", "8M"]);
    let export = format!("nbd+unix:///disk0?socket={}", daemon.nbd_socket());
    let data = random_file(tmp.path(), "data", 8 << 20, 3);
    nbdcopy(p(&data), &export);
    // A user's snapshot named like the schedule's: never destroyed by it.
    let users = "disk0@backup-2020-01-01T00:00:00Z";
    daemon.ok(&["snapshot", "create", users]);

    // Backups come every two seconds, each from a snapshot of its own,
    // each after the first incremental from the one before.
    let backups_of_disk0 = || {
        daemon.json(&["backup", "list", "local"])["backups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["volume"] == "disk0")
            .cloned()
            .collect::<Vec<_>>()
    };
    eventually("three scheduled backups of disk0", || {
        backups_of_disk0().len() >= 3
    });
    let made = backups_of_disk0();
    for pair in made.windows(2) {
        assert_eq!(pair[1]["parent"], pair[0]["id"], "{made:?}");
        assert!(
            pair[1]["snapshot"]
                .as_str()
                .unwrap()
                .starts_with("disk0@backup-"),
            "{made:?}"
        );
    }
    // A scheduled volume that does not exist: a failed run, an alert.
    eventually("the failed run's alert", || {
        let status = daemon.json(&["pool", "status"]);
        status["alerts"].as_array().unwrap().iter().any(|a| {
            a["kind"] == "backup_failed"
                && a["subject"] == "local:nope"
                && a["message"].as_str().unwrap().contains("nope")
        })
    });
    let repositories = daemon.json(&["backup", "repositories"]);
    let schedule = &repositories[0]["schedule"];
    assert_eq!(schedule["schedule"], "every 2s", "{repositories}");
    assert!(
        schedule["last_prune_unix"].is_u64(),
        "the scheduled prune did not run: {repositories}"
    );
    let volumes = schedule["volumes"].as_array().unwrap();
    assert!(volumes[0]["last_success_unix"].is_u64(), "{repositories}");
    assert_eq!(volumes[1]["volume"], "nope", "{repositories}");
    assert!(
        volumes[1]["failures"].as_u64().unwrap() >= 1,
        "{repositories}"
    );
    // Metrics: the backups that succeeded, the one that failed, what they
    // stored, and when disk0 was last backed up.
    let (_, metrics) = http(&daemon.api_socket(), "GET", "/metrics", "");
    let value = |line: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {line} in {metrics}"))
    };
    assert!(
        value(r#"arbor_backup_jobs_succeeded{repository="local",kind="backup"}"#) >= 3.0,
        "{metrics}"
    );
    assert!(
        value(r#"arbor_backup_store_bytes{repository="local",kind="backup"}"#) > 8e6,
        "{metrics}"
    );
    let last =
        value(r#"arbor_backup_last_success_timestamp_seconds{repository="local",volume="disk0"}"#);
    assert!(
        last >= made[0]["completed_unix"].as_f64().unwrap(),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"arbor_alert{kind="backup_failed",subject="local:nope""#),
        "{metrics}"
    );
    let text = daemon.ok(&["backup", "repositories"]);
    assert!(
        text.contains("every 2s, keep frequent=1") && text.contains("failed"),
        "{text}"
    );

    // Schedules a reload refuses, each changing nothing.
    for (extra, why) in [
        (
            ", keep = \"daily=7\"",
            "volumes and keep go with a schedule",
        ),
        (", schedule = \"every 2s\"", "needs the volumes"),
        (
            ", schedule = \"sometimes\", volumes = [\"disk0\"]",
            "schedule",
        ),
        (
            ", schedule = \"every 2s\", volumes = [\"disk0@x\"]",
            "invalid name",
        ),
        (
            ", schedule = \"every 2s\", volumes = [\"disk0\"], keep = \"daily=x\"",
            "keep",
        ),
    ] {
        local.configure(extra);
        daemon.fails(&["config", "reload"], 2, why);
    }
    let still = daemon.json(&["backup", "repositories"]);
    assert_eq!(still[0]["schedule"]["schedule"], "every 2s", "{still}");

    // The schedule taken away by a reload: once the run under way ends,
    // disk0 has exactly one backup snapshot, held, the newest backup's.
    local.configure("");
    daemon.ok(&["config", "reload"]);
    let backup_snapshots = || {
        daemon
            .json(&["snapshot", "list"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| {
                s["name"].as_str().unwrap().starts_with("disk0@backup-") && s["name"] != users
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    eventually("one backup snapshot left", || {
        let left = backup_snapshots();
        left.len() == 1 && backups_of_disk0().last().unwrap()["snapshot"] == left[0]["name"]
    });
    let left = backup_snapshots();
    assert_eq!(left[0]["holds"].as_array().unwrap().len(), 1, "{left:?}");
    assert!(
        daemon
            .json(&["snapshot", "list"])
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == users),
        "the schedule destroyed a user's snapshot"
    );
    eventually("no job left running", || {
        daemon
            .json(&["backup", "jobs"])
            .as_array()
            .unwrap()
            .is_empty()
    });
    assert!(daemon.ok(&["backup", "jobs"]).contains("no backup jobs"));
    // The newest backup restores what its snapshot holds.
    let newest = backups_of_disk0().last().unwrap().clone();
    let id = newest["id"].as_str().unwrap();
    daemon.ok(&["backup", "restore", "local", id, "back"]);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let uri = |v: &str| format!("nbd+unix:///{v}?socket={}", daemon.nbd_socket());
    nbdcopy(&uri(newest["snapshot"].as_str().unwrap()), p(&a));
    nbdcopy(&uri("back"), p(&b));
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the scheduled backup's restore differs"
    );
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&data).unwrap());
}

/// A restore cut off by the daemon's end (SIGKILL) leaves no half-written
/// volume after the restart. The repository's packs are swapped for named
/// pipes, so the restore waits in its first read (its volume made, nothing
/// written) until the daemon is killed.
#[test]
fn a_restore_killed_with_the_daemon_leaves_no_volume_after_the_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let local = LocalRepo::new(tmp.path());
    let (repo, config) = (local.repo.clone(), local.config.clone());
    let mut daemon = Daemon::start(&["--config", p(&config), "--initial-volume-size", "8M"]);
    let export = format!("nbd+unix:///disk0?socket={}", daemon.nbd_socket());
    let data = random_file(tmp.path(), "data", 8 << 20, 5);
    nbdcopy(p(&data), &export);
    daemon.ok(&["snapshot", "create", "disk0@a"]);
    let made = daemon.json(&["backup", "create", "local", "disk0@a"]);
    let id = made["id"].as_str().unwrap().to_owned();
    // Another volume, there before: untouched by what follows.
    daemon.ok(&["volume", "create", "keep", "--size", "1M"]);

    let saved = tmp.path().join("saved");
    let packs = packs_as_pipes(&repo, &saved);
    let mut restoring = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(daemon.args(&["backup", "restore", "local", &id, "back"]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the restore's volume, made", || {
        daemon
            .json(&["volume", "list"])
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "back")
    });
    let jobs = daemon.json(&["backup", "jobs"]);
    assert_eq!(jobs[0]["kind"], "restore", "{jobs}");
    assert_eq!(jobs[0]["subject"], "back", "{jobs}");
    daemon.stop("KILL");
    let _ = restoring.wait();
    put_packs_back(&packs, &saved);
    daemon.restart(&["--initial-volume", "none", "--config", p(&config)]);
    let names: Vec<String> = daemon
        .json(&["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        !names.contains(&"back".to_owned()),
        "the cut-off restore's volume is left: {names:?}"
    );
    assert!(names.contains(&"keep".to_owned()), "{names:?}");
    // The repository lock the killed daemon held is stale (its process is
    // gone): the restore runs again, whole.
    daemon.ok(&["backup", "restore", "local", &id, "back"]);
    let copy = tmp.path().join("copy");
    nbdcopy(
        &format!("nbd+unix:///back?socket={}", daemon.nbd_socket()),
        p(&copy),
    );
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&data).unwrap());
}

/// The packs of `repo`, each swapped for a named pipe (a read of it waits
/// until the pipe is written, here never): returns them with where each
/// was moved, for [`put_packs_back`].
fn packs_as_pipes(repo: &std::path::Path, saved: &std::path::Path) -> Vec<std::path::PathBuf> {
    let packs = pack_files(repo);
    std::fs::create_dir(saved).unwrap();
    for (i, pack) in packs.iter().enumerate() {
        std::fs::rename(pack, saved.join(i.to_string())).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(pack)
            .status()
            .unwrap();
        assert!(made.success());
    }
    packs
}

/// The pack objects of a directory repository.
fn pack_files(repo: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut packs = Vec::new();
    let mut stack = vec![repo.join("packs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap().path();
            if e.is_dir() {
                stack.push(e);
            } else {
                packs.push(e);
            }
        }
    }
    packs
}

fn put_packs_back(packs: &[std::path::PathBuf], saved: &std::path::Path) {
    for (i, pack) in packs.iter().enumerate() {
        std::fs::remove_file(pack).unwrap();
        std::fs::rename(saved.join(i.to_string()), pack).unwrap();
    }
}

fn qemu_io_write(uri: &str, command: &str) {
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", command, uri])
        .output()
        .expect("qemu-io (qemu-utils)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("error") && !text.contains("failed"),
        "{text}"
    );
}

/// An instant restore answers and serves before a byte has come from the
/// store (its packs are pipes nobody writes): a client's whole-block write
/// needs nothing from it, a snapshot is refused while holes remain. Killed
/// with the daemon, it is taken up at the next start, keeping what the
/// client wrote and flushed, and completes byte for byte.
#[test]
fn an_instant_restore_serves_at_once_and_is_taken_up_after_a_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let local = LocalRepo::new(tmp.path());
    let (repo, config) = (local.repo.clone(), local.config.clone());
    let mut daemon = Daemon::start(&["--config", p(&config), "--initial-volume-size", "8M"]);
    let export = format!("nbd+unix:///disk0?socket={}", daemon.nbd_socket());
    let data = random_file(tmp.path(), "data", 8 << 20, 6);
    nbdcopy(p(&data), &export);
    daemon.ok(&["snapshot", "create", "disk0@a"]);
    let made = daemon.json(&["backup", "create", "local", "disk0@a"]);
    let id = made["id"].as_str().unwrap().to_owned();

    let saved = tmp.path().join("saved");
    let packs = packs_as_pipes(&repo, &saved);
    let restored = daemon.json(&["backup", "restore", "local", &id, "back", "--instant"]);
    assert_eq!(restored["instant"], true, "{restored}");
    let view = daemon.json(&["volume", "list"]);
    let back = view
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "back")
        .unwrap()
        .clone();
    assert_eq!(back["restoring"]["state"], "filling", "{back}");
    assert_eq!(back["restoring"]["size"], 8 << 20, "{back}");
    daemon.fails(&["snapshot", "create", "back@early"], 5, "being restored");
    // Whole blocks written: nothing to fetch first. qemu-io flushes.
    let uri = format!("nbd+unix:///back?socket={}", daemon.nbd_socket());
    qemu_io_write(&uri, "write -P 0x5a 0 1M");

    daemon.stop("KILL");
    put_packs_back(&packs, &saved);
    daemon.restart(&["--initial-volume", "none", "--config", p(&config)]);
    eventually("the restore taken up and complete", || {
        daemon
            .json(&["volume", "list"])
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "back" && v.get("restoring").is_none())
    });
    let copy = tmp.path().join("copy");
    nbdcopy(&uri, p(&copy));
    let mut want = std::fs::read(&data).unwrap();
    want[..1 << 20].fill(0x5a);
    assert!(
        std::fs::read(&copy).unwrap() == want,
        "the restored volume differs from the backup and the client's write"
    );
    daemon.ok(&["snapshot", "create", "back@done"]);
}

/// An instant restore from a backup with a damaged pack: the blocks that
/// pack held fail (their reads fail, never returning wrong bytes), the
/// others read right, the volume stays listed as failed with a critical
/// alert, and destroying it ends both.
#[test]
fn an_instant_restore_fails_only_the_blocks_of_a_damaged_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let local = LocalRepo::new(tmp.path());
    let daemon = Daemon::start(&["--config", p(&local.config), "--initial-volume-size", "8M"]);
    let export = format!("nbd+unix:///disk0?socket={}", daemon.nbd_socket());
    let data = random_file(tmp.path(), "data", 8 << 20, 7);
    nbdcopy(p(&data), &export);
    daemon.ok(&["snapshot", "create", "disk0@a"]);
    let made = daemon.json(&["backup", "create", "local", "disk0@a"]);
    let id = made["id"].as_str().unwrap().to_owned();
    // A byte flipped in the middle of the data pack (the largest object).
    let packs = pack_files(&local.repo);
    let victim = packs
        .iter()
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(victim, &bytes).unwrap();

    daemon.ok(&["backup", "restore", "local", &id, "back", "--instant"]);
    let state = || {
        daemon
            .json(&["volume", "list"])
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "back")
            .map(|v| v["restoring"].clone())
    };
    eventually("the restore to end with failed blocks", || {
        state().is_some_and(|r| r["state"] == "failed")
    });
    let restoring = state().unwrap();
    let failed = restoring["failed_blocks"].as_u64().unwrap();
    assert!((1..128).contains(&failed), "{restoring}");
    eventually("the restore's critical alert", || {
        let status = daemon.json(&["pool", "status"]);
        status["alerts"].as_array().unwrap().iter().any(|a| {
            a["kind"] == "restore_incomplete"
                && a["subject"] == "back"
                && a["severity"] == "critical"
        })
    });
    // Block by block (64 KiB): each reads as the backup had it, or fails.
    let want = std::fs::read(&data).unwrap();
    let uri = format!("nbd+unix:///back?socket={}", daemon.nbd_socket());
    let (mut good, mut bad) = (0, 0);
    for block in 0..128u64 {
        let out = std::process::Command::new("qemu-io")
            .args([
                "-f",
                "raw",
                "-c",
                &format!("read -v {} 64k", block * 65536),
                &uri,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("read failed") {
            bad += 1;
            continue;
        }
        // `read -v` dumps the bytes, 16 to a line after the offset.
        let got: Vec<u8> = text
            .lines()
            .filter(|l| l.len() > 10 && l.as_bytes()[8] == b':')
            .flat_map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(16)
                    .map(|h| u8::from_str_radix(h, 16).unwrap())
                    .collect::<Vec<u8>>()
            })
            .collect();
        let at = (block * 65536) as usize;
        assert!(
            got == want[at..at + 65536],
            "block {block} reads wrong bytes"
        );
        good += 1;
    }
    assert_eq!(
        bad, failed,
        "reads failed for {bad} blocks, the restore failed {failed}"
    );
    assert!(good > 0);
    daemon.ok(&["destroy", "back"]);
    eventually("the alert cleared", || {
        let status = daemon.json(&["pool", "status"]);
        !status["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["kind"] == "restore_incomplete")
    });
}

/// A pool whose format keeps no properties cannot list a restore under
/// way, so an instant one (which a restart must take up, or its volume
/// would serve holes as zeros) is refused there, saying to upgrade; a plain
/// restore still works.
#[test]
fn an_instant_restore_needs_a_pool_that_keeps_properties() {
    let tmp = tempfile::tempdir().unwrap();
    let local = LocalRepo::new(tmp.path());
    let source = Daemon::start(&["--config", p(&local.config), "--initial-volume-size", "1M"]);
    source.ok(&["snapshot", "create", "disk0@a"]);
    let made = source.json(&["backup", "create", "local", "disk0@a"]);
    let id = made["id"].as_str().unwrap().to_owned();
    drop(source);

    let old = tmp.path().join("old.img");
    ok(&[
        "pool",
        "create",
        p(&old),
        "--size",
        "64M",
        "--format-version",
        "3",
    ]);
    let daemon = Daemon::start(&["--pool", p(&old), "--config", p(&local.config)]);
    daemon.fails(
        &["backup", "restore", "local", &id, "dr", "--instant"],
        5,
        "arbor pool upgrade",
    );
    assert!(!daemon
        .ok(&["volume", "list"])
        .lines()
        .any(|l| l.starts_with("dr ")));
    daemon.ok(&["backup", "restore", "local", &id, "dr"]);
}
