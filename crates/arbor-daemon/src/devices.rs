//! What a block device is stacked on and what holds it, as sysfs and the
//! mount table say: the storage behind a name, so that an origin is known
//! by its storage and not by its path (docs/CLI.md § Origins).
//!
//! One file or disk can be reached under many names: a loop device reads
//! and writes its backing file, a partition is a range of its disk, a
//! device-mapper or md device is stacked on its `slaves`. Two origins
//! attached through two such names would write each other's bytes behind
//! the copy-on-write that keeps their snapshots. [`Sysfs::below`] lists
//! every file and device a block device reads and writes through, and
//! [`overlap`] decides whether two devices share storage.
//!
//! Reading sysfs goes through [`Sysfs`], rooted anywhere, so the rules are
//! tested on a made-up tree; a loop device's backing file comes from the
//! kernel (`LOOP_GET_STATUS64`, [`arbor_io::blockdev::loop_backing`]),
//! passed in as a function for the same reason.

use std::path::{Path, PathBuf};

use arbor_engine::DeviceIdentity;
use arbor_io::blockdev::LoopBacking;

/// Deepest stack of devices followed (partition of a loop device over a
/// device-mapper target over md...): bounds a walk of a damaged or cyclic
/// tree.
const MAX_DEPTH: usize = 16;

/// The major and minor numbers of `rdev` (glibc's `gnu_dev_major` and
/// `gnu_dev_minor`).
pub fn major_minor(rdev: u64) -> (u64, u64) {
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
    (major, minor)
}

/// `rdev` of `major` and `minor` (glibc's `gnu_dev_makedev`).
pub fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0xff)
}

/// `"8:16"` (a sysfs `dev` file, a mountinfo field) as `rdev`.
fn parse_dev(text: &str) -> Option<u64> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(makedev(major.parse().ok()?, minor.parse().ok()?))
}

/// The identity arbor records for block device `rdev`.
pub fn block_identity(rdev: u64) -> DeviceIdentity {
    DeviceIdentity { dev: rdev, ino: 0 }
}

/// A file or device another one reads and writes through, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Below {
    pub identity: DeviceIdentity,
    /// How the upper one reaches it: "loop0 is a loop device over it".
    pub how: String,
}

/// Sysfs, from its root (`/sys` on a running system).
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    pub fn system() -> Self {
        Self::at("/sys")
    }

    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The sysfs directory of block device `rdev`, resolved (so its parent
    /// is a partition's disk).
    fn dir(&self, rdev: u64) -> Option<PathBuf> {
        let (major, minor) = major_minor(rdev);
        let link = self.root.join("dev/block").join(format!("{major}:{minor}"));
        std::fs::canonicalize(link).ok()
    }

    fn read(path: &Path) -> Option<String> {
        std::fs::read_to_string(path)
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
    }

    /// The kernel's name of block device `rdev` (`sda1`, `loop0`, `dm-3`).
    pub fn name(&self, rdev: u64) -> Option<String> {
        let dir = self.dir(rdev)?;
        Some(dir.file_name()?.to_string_lossy().into_owned())
    }

    /// The names of the devices in `dir`'s `sub` directory (`slaves`,
    /// `holders`), with their device numbers.
    fn linked(dir: &Path, sub: &str) -> Vec<(String, u64)> {
        Self::devices_in(&dir.join(sub), |_| true)
    }

    /// The devices in directory `dir` (links or directories holding a
    /// `dev` file) that `keep` accepts, by name and device number, sorted.
    fn devices_in(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<(String, u64)> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut out: Vec<(String, u64)> = entries
            .flatten()
            .filter(|entry| keep(&entry.path()))
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let dev = Self::read(&entry.path().join("dev")).and_then(|d| parse_dev(&d))?;
                Some((name, dev))
            })
            .collect();
        out.sort();
        out
    }

    /// The partitions of disk `rdev`, by name and device number.
    pub fn partitions(&self, rdev: u64) -> Vec<(String, u64)> {
        match self.dir(rdev) {
            Some(dir) => Self::devices_in(&dir, |entry| entry.join("partition").is_file()),
            None => Vec::new(),
        }
    }

    /// The devices stacked on block device `rdev` or on one of its
    /// partitions (device-mapper, md, bcache...: sysfs `holders`), by name.
    pub fn holders(&self, rdev: u64) -> Vec<String> {
        let mut out = Vec::new();
        let mut of = vec![rdev];
        of.extend(self.partitions(rdev).into_iter().map(|(_, dev)| dev));
        for dev in of {
            if let Some(dir) = self.dir(dev) {
                out.extend(
                    Self::linked(&dir, "holders")
                        .into_iter()
                        .map(|(name, _)| name),
                );
            }
        }
        out
    }

    /// Every file and block device that block device `rdev` reads and
    /// writes through, itself excluded: a partition's disk, the devices it
    /// is stacked on (`slaves`), a loop device's backing file (and that
    /// file's device, when it is one), and theirs in turn.
    /// `loop_backing` asks the kernel about a loop device, by name.
    pub fn below(
        &self,
        rdev: u64,
        loop_backing: &dyn Fn(&str) -> Option<LoopBacking>,
    ) -> Vec<Below> {
        let mut out: Vec<Below> = Vec::new();
        let mut todo = vec![(rdev, 0usize)];
        while let Some((dev, depth)) = todo.pop() {
            if depth >= MAX_DEPTH {
                continue;
            }
            let Some(dir) = self.dir(dev) else {
                continue;
            };
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut push = |identity: DeviceIdentity, how: String, todo: &mut Vec<(u64, usize)>| {
                if identity == block_identity(rdev) || out.iter().any(|b| b.identity == identity) {
                    return;
                }
                if identity.ino == 0 {
                    todo.push((identity.dev, depth + 1));
                }
                out.push(Below { identity, how });
            };
            if dir.join("partition").is_file() {
                if let Some(disk) = dir
                    .parent()
                    .and_then(|p| Self::read(&p.join("dev")))
                    .and_then(|d| parse_dev(&d))
                {
                    let disk_name = self.name(disk).unwrap_or_default();
                    push(
                        block_identity(disk),
                        format!("{name} is a partition of {disk_name}"),
                        &mut todo,
                    );
                }
            }
            for (slave, slave_dev) in Self::linked(&dir, "slaves") {
                push(
                    block_identity(slave_dev),
                    format!("{name} is stacked on {slave}"),
                    &mut todo,
                );
            }
            if dir.join("loop").is_dir() {
                if let Some(backing) = loop_backing(&name) {
                    let file = Self::read(&dir.join("loop/backing_file")).unwrap_or_default();
                    if backing.rdev != 0 {
                        push(
                            block_identity(backing.rdev),
                            format!("{name} is a loop device over {file}"),
                            &mut todo,
                        );
                    }
                    push(
                        DeviceIdentity {
                            dev: backing.dev,
                            ino: backing.ino,
                        },
                        format!("{name} is a loop device over {file}"),
                        &mut todo,
                    );
                }
            }
        }
        out
    }
}

/// The kernel's answer for loop device `name` (`/dev/{name}`), or `None`
/// where it cannot be asked (no such node, not bound).
pub fn system_loop_backing(name: &str) -> Option<LoopBacking> {
    if name.contains('/') || name.starts_with('.') {
        return None;
    }
    let file = std::fs::File::open(Path::new("/dev").join(name)).ok()?;
    arbor_io::blockdev::loop_backing(&file).ok().flatten()
}

/// Whether two files or devices share storage: the same, or one reads and
/// writes through the other. `a_below` and `b_below` are what each is
/// stacked on ([`Sysfs::below`]; empty for a regular file). Says how.
pub fn overlap(
    a: DeviceIdentity,
    a_below: &[Below],
    b: DeviceIdentity,
    b_below: &[Below],
) -> Option<String> {
    if a == b {
        return Some("the same file or device".to_owned());
    }
    if let Some(below) = a_below.iter().find(|x| x.identity == b) {
        return Some(below.how.clone());
    }
    b_below
        .iter()
        .find(|x| x.identity == a)
        .map(|below| below.how.clone())
}

/// The mount points of the filesystems mounted from any of `devices`, from
/// the text of `/proc/self/mountinfo` (field 3 is the device number).
pub fn mounted_at(mountinfo: &str, devices: &[u64]) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let dev = parse_dev(fields.nth(2)?)?;
            let point = fields.nth(1)?;
            devices.contains(&dev).then(|| unescape_mount(point))
        })
        .collect()
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape_mount(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_split_and_join_as_glibc_does() {
        assert_eq!(major_minor(0x810), (8, 16));
        assert_eq!(major_minor(0x10301), (259, 1));
        // A minor past 255 and a major past 4095 use the high bits.
        assert_eq!(major_minor(0x0010_072c), (7, 300));
        assert_eq!(major_minor((0x1000u64 << 32) | 0x0100), (4097, 0));
        for (major, minor) in [(8, 16), (259, 1), (7, 300), (4097, 0), (253, 1 << 19)] {
            assert_eq!(major_minor(makedev(major, minor)), (major, minor));
        }
        assert_eq!(parse_dev("8:16\n"), Some(0x810));
        assert_eq!(parse_dev("8"), None);
        assert_eq!(parse_dev("x:1"), None);
    }

    /// A made-up sysfs: `/sys/dev/block/M:m` links to the device's
    /// directory under `devices`, which holds `dev` and, for a partition,
    /// `partition`; `slaves` and `holders` hold links to other devices.
    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("dev/block")).unwrap();
            Self(dir)
        }

        fn sysfs(&self) -> Sysfs {
            Sysfs::at(self.0.path())
        }

        /// Adds device `path` (relative to `devices/`, a partition inside
        /// its disk's directory) with number `major:minor`.
        fn device(&self, path: &str, major: u64, minor: u64, partition: bool) -> PathBuf {
            let dir = self.0.path().join("devices").join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("dev"), format!("{major}:{minor}\n")).unwrap();
            if partition {
                std::fs::write(dir.join("partition"), "1\n").unwrap();
            }
            std::os::unix::fs::symlink(
                &dir,
                self.0.path().join(format!("dev/block/{major}:{minor}")),
            )
            .unwrap();
            dir
        }

        /// `upper` is stacked on `lower`: a slave of it, and it a holder.
        fn stack(&self, upper: &Path, lower: &Path) {
            for (from, sub, to) in [(upper, "slaves", lower), (lower, "holders", upper)] {
                std::fs::create_dir_all(from.join(sub)).unwrap();
                std::os::unix::fs::symlink(to, from.join(sub).join(to.file_name().unwrap()))
                    .unwrap();
            }
        }
    }

    fn no_loops(_: &str) -> Option<LoopBacking> {
        None
    }

    fn ids(below: &[Below]) -> Vec<DeviceIdentity> {
        below.iter().map(|b| b.identity).collect()
    }

    #[test]
    fn a_partition_and_its_disk_overlap_and_two_partitions_do_not() {
        let tree = Tree::new();
        tree.device("sda", 8, 0, false);
        tree.device("sda/sda1", 8, 1, true);
        tree.device("sda/sda2", 8, 2, true);
        let sysfs = tree.sysfs();
        let (disk, one, two) = (makedev(8, 0), makedev(8, 1), makedev(8, 2));
        let below_one = sysfs.below(one, &no_loops);
        assert_eq!(ids(&below_one), vec![block_identity(disk)]);
        assert_eq!(below_one[0].how, "sda1 is a partition of sda");
        let below_disk = sysfs.below(disk, &no_loops);
        assert!(below_disk.is_empty());
        // Either way round.
        let how = overlap(
            block_identity(disk),
            &below_disk,
            block_identity(one),
            &below_one,
        );
        assert_eq!(how.as_deref(), Some("sda1 is a partition of sda"));
        let how = overlap(
            block_identity(one),
            &below_one,
            block_identity(disk),
            &below_disk,
        );
        assert_eq!(how.as_deref(), Some("sda1 is a partition of sda"));
        let below_two = sysfs.below(two, &no_loops);
        assert_eq!(
            overlap(
                block_identity(one),
                &below_one,
                block_identity(two),
                &below_two
            ),
            None
        );
        assert_eq!(
            sysfs.partitions(disk),
            vec![("sda1".to_owned(), one), ("sda2".to_owned(), two)]
        );
        assert_eq!(sysfs.name(one).as_deref(), Some("sda1"));
    }

    #[test]
    fn a_stacked_device_reaches_every_device_under_it() {
        let tree = Tree::new();
        tree.device("sdb", 8, 16, false);
        let part = tree.device("sdb/sdb1", 8, 17, true);
        let md = tree.device("md0", 9, 0, false);
        let dm = tree.device("dm-0", 253, 0, false);
        tree.stack(&md, &part);
        tree.stack(&dm, &md);
        let sysfs = tree.sysfs();
        let below = sysfs.below(makedev(253, 0), &no_loops);
        assert_eq!(
            ids(&below).iter().map(|i| i.dev).collect::<Vec<_>>(),
            vec![makedev(9, 0), makedev(8, 17), makedev(8, 16)]
        );
        // The whole disk under the partition under md under dm.
        let how = overlap(
            block_identity(makedev(8, 16)),
            &[],
            block_identity(makedev(253, 0)),
            &below,
        );
        assert_eq!(how.as_deref(), Some("sdb1 is a partition of sdb"));
        // Holders: of the disk's partitions too.
        assert_eq!(sysfs.holders(makedev(8, 16)), vec!["md0".to_owned()]);
        assert_eq!(sysfs.holders(makedev(9, 0)), vec!["dm-0".to_owned()]);
        assert!(sysfs.holders(makedev(253, 0)).is_empty());
    }

    #[test]
    fn a_loop_device_reaches_its_backing_file_and_a_cycle_ends() {
        let tree = Tree::new();
        let loop0 = tree.device("loop0", 7, 0, false);
        std::fs::create_dir_all(loop0.join("loop")).unwrap();
        std::fs::write(loop0.join("loop/backing_file"), "/images/a.img\n").unwrap();
        let loop1 = tree.device("loop1", 7, 1, false);
        std::fs::create_dir_all(loop1.join("loop")).unwrap();
        std::fs::write(loop1.join("loop/backing_file"), "/dev/loop0\n").unwrap();
        let file = DeviceIdentity { dev: 2049, ino: 77 };
        let backing = |name: &str| match name {
            "loop0" => Some(LoopBacking {
                dev: file.dev,
                ino: file.ino,
                rdev: 0,
            }),
            // loop1 over the device node /dev/loop0 (on devtmpfs, inode 5).
            "loop1" => Some(LoopBacking {
                dev: 6,
                ino: 5,
                rdev: makedev(7, 0),
            }),
            _ => None,
        };
        let sysfs = tree.sysfs();
        let below = sysfs.below(makedev(7, 0), &backing);
        assert_eq!(ids(&below), vec![file]);
        assert_eq!(below[0].how, "loop0 is a loop device over /images/a.img");
        assert_eq!(
            overlap(file, &[], block_identity(makedev(7, 0)), &below).as_deref(),
            Some("loop0 is a loop device over /images/a.img")
        );
        let below = sysfs.below(makedev(7, 1), &backing);
        assert!(ids(&below).contains(&file), "{below:?}");
        assert!(ids(&below).contains(&block_identity(makedev(7, 0))));

        // A device stacked on itself (a damaged tree) ends.
        let tree = Tree::new();
        let a = tree.device("dm-1", 253, 1, false);
        let b = tree.device("dm-2", 253, 2, false);
        tree.stack(&a, &b);
        tree.stack(&b, &a);
        let below = tree.sysfs().below(makedev(253, 1), &no_loops);
        assert_eq!(ids(&below), vec![block_identity(makedev(253, 2))]);
    }

    #[test]
    fn mount_points_come_from_the_device_field() {
        let info = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
97 27 7:0 / /mnt/with\\040space rw,relatime - ext4 /dev/loop0 rw
98 27 7:1 / /mnt/b rw,relatime - ext4 /dev/loop1 rw
99 27 7:0 /sub /mnt/bind rw,relatime - ext4 /dev/loop0 rw
bad line
";
        assert_eq!(
            mounted_at(info, &[makedev(7, 0)]),
            vec!["/mnt/with space".to_owned(), "/mnt/bind".to_owned()]
        );
        assert_eq!(mounted_at(info, &[makedev(8, 0)]), Vec::<String>::new());
        assert_eq!(unescape_mount("a\\134b\\0"), "a\\b\\0");
    }
}
