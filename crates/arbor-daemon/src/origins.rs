//! Origins: raw disks and image files snapshotted in place (`arbor origin
//! attach`), and what only the daemon knows of them.
//!
//! The engine keeps an origin's data on its device and records which
//! device it is (its identity: `st_dev` and `st_ino` of a file, `st_rdev`
//! of a block device), but it opens nothing: the daemon opens the device
//! from a path, locks it with `flock` as it locks the pool (so two daemons
//! never write one disk), records the path in the pool as a property of
//! the volume, and at its next start opens every origin again from there.
//! A device that cannot be opened then (missing), or is not the one
//! attached (another identity, a smaller size, or the same identity but other
//! [`Marks`]: a reused inode number, a device number now another disk's),
//! leaves its volume unattached: its I/O fails with `origin_unavailable`,
//! and the rest of the pool is served.

use std::collections::HashMap;
use std::fs::{File, Metadata, TryLockError};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::UNIX_EPOCH;

use crate::error::{Context, Result};
use arbor_engine::{
    DeviceIdentity, Error, OriginInfo, Pool, Refusal, Resource, VolumeId, VolumeLayout,
};
use arbor_io::FileDevice;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::devices::{self, major_minor, Below, Sysfs};
use crate::error::DaemonError;
use crate::in_use::{readers_through, InUse};
use crate::metrics::Metrics;
use crate::pool_file::IoMode;
use arbor_api::model::{DeviceView, LossView, OriginView};
use arbor_api::size::ByteSize;

/// The pool property of an origin volume that says where its device is.
pub const RECORD_KEY: &str = "origin";

/// What the pool records of an origin's device (JSON, in [`RECORD_KEY`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Recorded {
    /// Absolute path it was last attached from.
    path: String,
    #[serde(flatten)]
    marks: Marks,
}

/// What tells a device apart from another with the same identity: the
/// engine's identity (`st_dev` and `st_ino`, or `st_rdev`) can pass from
/// one to another. Each is compared only when both the recorded and the
/// opened device have it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Marks {
    /// A regular file's creation time (statx birth time), where the
    /// filesystem keeps one: a file deleted and another created under its
    /// name may get its inode number back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    born_unix_nanos: Option<u64>,
    /// A block device's own name for its disk, where sysfs has one (see
    /// [`disk_id`]): after a reboot the kernel may give its device number
    /// to another disk (sdb and sdc trading places).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disk_id: Option<String>,
}

impl Marks {
    fn of(metadata: &Metadata, identity: DeviceIdentity) -> Self {
        if metadata.file_type().is_block_device() {
            Self {
                born_unix_nanos: None,
                disk_id: disk_id(identity.dev),
            }
        } else {
            let born = metadata
                .created()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
            Self {
                born_unix_nanos: born.and_then(|b| u64::try_from(b.as_nanos()).ok()),
                disk_id: None,
            }
        }
    }

    /// Whether `now` is known to be the disk these marks were recorded
    /// from: at least one mark known on both sides, and none differing.
    fn same_disk(&self, now: &Marks) -> bool {
        let known = (self.born_unix_nanos.is_some() && now.born_unix_nanos.is_some())
            || (self.disk_id.is_some() && now.disk_id.is_some());
        known && self.differ(now).is_none()
    }

    /// Why `now` is not the device these marks were recorded from, if it
    /// is not.
    fn differ(&self, now: &Marks) -> Option<&'static str> {
        fn known_and_differ<T: PartialEq>(then: &Option<T>, now: &Option<T>) -> bool {
            matches!((then, now), (Some(then), Some(now)) if then != now)
        }
        if known_and_differ(&self.born_unix_nanos, &now.born_unix_nanos) {
            return Some(
                "it has that file's inode number but another creation time (the old file \
                 was deleted and its number reused)",
            );
        }
        if known_and_differ(&self.disk_id, &now.disk_id) {
            return Some(
                "it has that device's number but is another disk (device numbers can move \
                 between disks at a reboot)",
            );
        }
        None
    }
}

/// A block device's own name for its disk, from sysfs: a device-mapper
/// UUID (LVM, dm-crypt), a WWID or serial number, or a loop device's
/// backing file; a partition's is its disk's and its number. `None` where
/// sysfs says nothing of the kind.
fn disk_id(rdev: u64) -> Option<String> {
    const OWN: [&str; 6] = [
        "dm/uuid",
        "wwid",
        "device/wwid",
        "serial",
        "device/serial",
        "loop/backing_file",
    ];
    let (major, minor) = major_minor(rdev);
    let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
    };
    if let Some(id) = OWN.iter().find_map(|file| read(file)) {
        return Some(id);
    }
    let number = read("partition")?;
    let disk = OWN.iter().find_map(|file| read(&format!("../{file}")))?;
    Some(format!("{disk} partition {number}"))
}

/// A device this daemon opened for an origin.
struct Handle {
    path: String,
    /// The open file holding the `flock`; the engine holds the device
    /// (another descriptor of the same file), and drops it on detach.
    _lock: File,
}

/// The origins' devices this daemon holds, by volume.
#[derive(Default)]
struct Devices {
    handles: Mutex<HashMap<VolumeId, Handle>>,
    /// Attaches and detaches run one at a time, so the checks each makes
    /// (attached already? this device elsewhere?) still hold when it acts.
    changing: Mutex<()>,
}

impl Devices {
    fn handles(&self) -> MutexGuard<'_, HashMap<VolumeId, Handle>> {
        // Plain inserts and removals: a panic elsewhere leaves it whole.
        self.handles.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changing(&self) -> MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the devices of volumes the engine no longer has attached
    /// (destroyed by a path that did not come through here).
    fn forget_gone(&self, attached: &[OriginInfo]) {
        self.handles()
            .retain(|id, _| attached.iter().any(|o| o.id == *id && o.attached));
    }
}

/// A file or device opened for an origin, not yet locked nor attached.
struct Opened {
    file: File,
    identity: DeviceIdentity,
    marks: Marks,
}

/// Which file or device `metadata` (of an open file) is, as the engine
/// records it; refuses anything but a regular file or a block device.
fn identity_of(path: &Path, metadata: &Metadata) -> Result<DeviceIdentity> {
    let kind = metadata.file_type();
    if kind.is_file() {
        Ok(DeviceIdentity {
            dev: metadata.dev(),
            ino: metadata.ino(),
        })
    } else if kind.is_block_device() {
        Ok(DeviceIdentity {
            dev: metadata.rdev(),
            ino: 0,
        })
    } else {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "neither a file nor a device"
        };
        Err(DaemonError::Invalid(format!(
            "{} is {what}: an origin is a raw disk image file or a block device",
            path.display()
        )))
    }
}

/// Opens `path` read-write for an origin: checks what it is and refuses
/// `pool` (the daemon's own pool).
fn open_device(path: &Path, pool: &Path) -> Result<Opened> {
    if !path.is_absolute() {
        return Err(DaemonError::Invalid(format!(
            "{} is not an absolute path: the daemon does not share your working \
                 directory (the CLI makes paths absolute)",
            path.display()
        )));
    }
    // What it is before opening it: opening a directory read-write fails
    // with a less helpful error, and a FIFO or character device is no disk.
    let before = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            DaemonError::NotFound(format!("no such file or device: {}", path.display()))
        }
        _ => DaemonError::from(e).context(format!("cannot read {}", path.display())),
    })?;
    identity_of(path, &before)?;
    let file = if before.file_type().is_block_device() {
        refuse_held(path, before.rdev())?;
        arbor_io::blockdev::open_exclusive(path).map_err(|e| match e.raw_os_error() {
            Some(EBUSY) => DaemonError::Busy(format!(
                "{} is in use: another program holds it open exclusively (a \
                     filesystem, device-mapper, md, or another arbor daemon's pool or \
                     origin); an origin's device must be arbor's alone",
                path.display()
            )),
            _ => DaemonError::from(e).context(format!(
                "cannot open {} for reading and writing",
                path.display()
            )),
        })?
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {} for reading and writing", path.display()))?
    };
    // The identity of what was opened, not of whatever the path names now.
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    let identity = identity_of(path, &metadata)?;
    if let Ok(pool_metadata) = std::fs::metadata(pool) {
        if identity_of(pool, &pool_metadata).ok() == Some(identity) {
            return Err(DaemonError::Invalid(format!(
                "{} is this daemon's pool: an origin must be another file or device",
                path.display()
            )));
        }
    }
    Ok(Opened {
        file,
        identity,
        marks: Marks::of(&metadata, identity),
    })
}

/// `EBUSY`: the errno of an exclusive open of a block device in use.
const EBUSY: i32 = 16;

/// Refuses block device `rdev` (at `path`) while a filesystem on it or on
/// one of its partitions is mounted, or devices are stacked on it
/// (device-mapper, md: sysfs `holders`): writing it would corrupt theirs.
fn refuse_held(path: &Path, rdev: u64) -> Result<()> {
    let sysfs = Sysfs::system();
    let mut of = vec![rdev];
    of.extend(sysfs.partitions(rdev).into_iter().map(|(_, dev)| dev));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = devices::mounted_at(&mountinfo, &of);
    if !mounted.is_empty() {
        return Err(DaemonError::Busy(format!(
            "{} is mounted (at {}): unmount it first; an origin's device must be \
                 arbor's alone",
            path.display(),
            mounted.join(", ")
        )));
    }
    let holders = sysfs.holders(rdev);
    if !holders.is_empty() {
        return Err(DaemonError::Busy(format!(
            "{} is held by {} (devices stacked on it: device-mapper, md, bcache...): \
                 remove those first; an origin's device must be arbor's alone",
            path.display(),
            holders.join(", ")
        )));
    }
    Ok(())
}

/// What `identity` (a file's, or a block device's) reads and writes
/// through, as far as the kernel says.
fn below(identity: DeviceIdentity) -> Vec<Below> {
    if identity.ino != 0 {
        return Vec::new();
    }
    Sysfs::system().below(identity.dev, &devices::system_loop_backing)
}

impl Opened {
    /// Takes the exclusive `flock` and opens the device the engine reads
    /// and writes: through the locked descriptor, so it is the very file
    /// checked and locked even if the path was replaced meanwhile.
    /// The device is reached as the daemon's `io` setting says for its kind
    /// (with `auto`: direct I/O on a block device, buffered on a file).
    fn lock(&self, path: &str, io: IoMode) -> Result<FileDevice> {
        match self.file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(DaemonError::Busy(format!(
                    "{path} is in use by another process (another arbor daemon's pool or \
                         origin?): one daemon at a time may write it"
                )))
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {path}"))
            }
        }
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        io.open(&fd_path)
            .with_context(|| format!("cannot open {path} for reading and writing"))
    }
}

/// Origins (`arbor origin`) as a service of the daemon: what attach,
/// detach and the listing need; cheap to clone.
#[derive(Clone)]
pub struct Origins {
    pool: Arc<Pool>,
    /// The pool's own file or device, which no origin may be.
    pool_path: PathBuf,
    /// The `io` setting, which origins' devices follow too.
    io: IoMode,
    /// The devices of origins this daemon opened.
    devices: Arc<Devices>,
    in_use: InUse,
    metrics: Arc<Metrics>,
}

impl Origins {
    pub fn new(
        pool: Arc<Pool>,
        pool_path: PathBuf,
        io: IoMode,
        in_use: InUse,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            pool,
            pool_path,
            io,
            devices: Arc::default(),
            in_use,
            metrics,
        }
    }

    /// The pool: what name suggestions look in.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// `POST /v1/origins`: makes the file or block device at `path` the
    /// origin `name`, its data left in place; or attaches the device of
    /// origin `name` again (after a start that could not open it): then it
    /// must be the same file or device, of the same size or larger (the
    /// volume keeps its recorded size until `volume resize`).
    pub fn attach_origin(&self, name: &str, path: &str, accept_damage: bool) -> Result<OriginView> {
        let _one = self.devices.changing();
        let known = self.pool.origins()?;
        self.devices.forget_gone(&known);
        let existing = known.iter().find(|o| o.name == name);
        if let Some(o) = existing.filter(|o| o.attached) {
            let from = self
                .devices
                .handles()
                .get(&o.id)
                .map(|h| format!(" from {}", h.path))
                .unwrap_or_default();
            return Err(Error::conflict(format!(
                "{name} is attached already{from}; to use another device, destroy its \
                 snapshots and detach it first"
            ))
            .into());
        }
        // Before opening: a block device attached under another name would
        // be refused as open exclusively "by another program" (this daemon).
        if let Ok(metadata) = std::fs::metadata(path) {
            if let Ok(identity) = identity_of(Path::new(path), &metadata) {
                self.refuse_alias(name, path, identity, &known)?;
            }
        }
        let opened = open_device(Path::new(path), &self.pool_path)?;
        // Again for what was opened (the path may name another file now),
        // before the lock, which this daemon's own handle would refuse as
        // "in use".
        self.refuse_alias(name, path, opened.identity, &known)?;
        if let Some(o) = existing {
            self.refuse_another_file(o, path, &opened)?;
        }
        let device = opened.lock(path, self.io)?;
        if let Some(o) = existing.filter(|o| o.identity != opened.identity) {
            // The same disk under another device number (numbers move at a
            // reboot), known by the marks recorded for it: record its new
            // identity, so that it is attached again.
            let recorded = self.recorded(o.id)?;
            if recorded.is_some_and(|r| r.marks.same_disk(&opened.marks)) {
                info!(volume = %name, path = %path, "the origin's disk has a new device number; recording it");
                self.pool.reidentify_origin(name, opened.identity)?;
            }
        }
        let id = self
            .pool
            .attach_origin_with(name, Arc::new(device), opened.identity, accept_damage)
            .map_err(|e| explain_attach(e, name, path))?;
        self.devices.handles().insert(
            id,
            Handle {
                path: path.to_owned(),
                _lock: opened.file,
            },
        );
        let record = Recorded {
            path: path.to_owned(),
            marks: opened.marks,
        };
        if self.recorded(id).ok().flatten().as_ref() != Some(&record) {
            let value = serde_json::to_vec(&record).context("cannot encode the origin's path")?;
            self.pool
                .set_property(Some(id), RECORD_KEY, &value)
                .with_context(|| {
                    format!(
                        "{name} is attached, but its path could not be recorded, so the next \
                         start will not attach it (then run arbor origin attach {name} {path} \
                         again)"
                    )
                })?;
        }
        info!(volume = %name, path = %path, "attached an origin");
        self.origin(name)
    }

    /// Refuses a device that shares storage with another origin's device
    /// or with the pool (the same one under another name, a loop device
    /// over its file, a partition of its disk or its disk, a device stacked
    /// on it): writes through one would change what the other's snapshots
    /// read. Known origins count attached or not: their device comes back.
    fn refuse_alias(
        &self,
        name: &str,
        path: &str,
        identity: DeviceIdentity,
        known: &[OriginInfo],
    ) -> Result<()> {
        let mine = below(identity);
        for other in known.iter().filter(|o| o.name != name) {
            let how = devices::overlap(identity, &mine, other.identity, &below(other.identity));
            if identity == other.identity {
                return Err(Error::conflict(format!(
                    "{path} is the device of origin {} already",
                    other.name
                ))
                .into());
            }
            if let Some(how) = how {
                let from = match self.devices.handles().get(&other.id) {
                    Some(h) => Some(h.path.clone()),
                    None => self.recorded(other.id).ok().flatten().map(|r| r.path),
                };
                let from = from.map(|p| format!(" ({p})")).unwrap_or_default();
                return Err(Error::conflict(format!(
                    "{path} is the storage of origin {}{from} already: {how}; an origin \
                     attached twice would change its snapshots under them",
                    other.name
                ))
                .into());
            }
        }
        if let Ok(pool) = std::fs::metadata(&self.pool_path) {
            if let Ok(pool_id) = identity_of(&self.pool_path, &pool) {
                if let Some(how) = devices::overlap(identity, &mine, pool_id, &below(pool_id)) {
                    return Err(DaemonError::Invalid(format!(
                        "{path} is this daemon's pool ({how}): an origin must be another \
                             file or device"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Refuses a file or device that has the identity origin `o` was
    /// attached with but not the marks recorded for it.
    fn refuse_another_file(&self, o: &OriginInfo, path: &str, opened: &Opened) -> Result<()> {
        let recorded = self.recorded(o.id)?;
        let why = recorded.and_then(|r| r.marks.differ(&opened.marks).map(str::to_owned));
        match why {
            Some(why) if o.identity == opened.identity => Err(Error::conflict(format!(
                "{path} is not the device {} was attached from: {why}",
                o.name
            ))
            .into()),
            _ => Ok(()),
        }
    }

    /// `DELETE /v1/origins/{name}` (and `destroy` of an origin): flushes
    /// its device, which keeps the volume's current content as a plain raw
    /// disk, removes the volume and closes the device. Refused while
    /// snapshots or clones read through it, and (unless `force`) while NBD
    /// clients have it open.
    pub fn detach_origin(&self, name: &str, force: bool) -> Result<()> {
        let _one = self.devices.changing();
        let id = self.origin_id(name)?;
        let readers = self.readers_of(id)?;
        if !readers.is_empty() {
            return Err(Error::conflict(format!(
                "{name} has snapshots or clones that read through it ({}): destroy them \
                 first (arbor destroy NAME), then detach it; or keep them with arbor origin \
                 detach {name} --copy-to-pool, which copies {name}'s data ({}) into the \
                 pool, where it stays with them",
                readers.join(", "),
                ByteSize(self.pool.info(id)?.size)
            ))
            .into());
        }
        self.in_use.refuse(name, id, force)?;
        self.pool.detach_origin(name)?;
        let path = self.devices.handles().remove(&id).map(|h| h.path);
        self.metrics.forget_volume(name);
        info!(volume = %name, path = ?path, "detached an origin");
        Ok(())
    }

    /// `DELETE /v1/origins/{name}?copy_to_pool=true`: copies the origin's
    /// data into the pool and detaches its device (flushed, left a plain
    /// raw disk with the volume's current content, closed). The volume
    /// stays in the pool (its home there now), served on, with its
    /// snapshots and clones; its recorded path is dropped.
    pub fn copy_origin_to_pool(&self, name: &str) -> Result<()> {
        let _one = self.devices.changing();
        let id = self.origin_id(name)?;
        let size = self.pool.info(id)?.size;
        self.pool.copy_origin_to_pool(name).map_err(|e| match e {
            Error::Exhausted(Resource::DataSpace) => DaemonError::from(e).context(format!(
                "the pool has no free run of {} (in one region) for {name}'s data: grow the \
                 pool or free space, then run it again",
                ByteSize(size)
            )),
            other => other.into(),
        })?;
        let path = self.devices.handles().remove(&id).map(|h| h.path);
        // Only origins are attached from a recorded path: one left behind
        // (the property's removal failed) is never read again.
        if let Err(e) = self.pool.remove_property(Some(id), RECORD_KEY) {
            warn!(volume = %name, error = %e, "cannot drop a copied origin's recorded path");
        }
        info!(volume = %name, path = ?path, "copied an origin into the pool and detached its device");
        Ok(())
    }

    /// The id of origin `name`; a usage error for any other volume.
    fn origin_id(&self, name: &str) -> Result<VolumeId> {
        let id = self.pool.lookup(name)?;
        if !self.pool.origins()?.iter().any(|o| o.id == id) {
            return Err(DaemonError::Invalid(format!(
                "{name} is not an origin (a volume made by arbor origin attach); \
                     destroy it with arbor destroy {name}"
            )));
        }
        Ok(id)
    }

    /// `GET /v1/origins`.
    pub fn origins(&self) -> Result<Vec<OriginView>> {
        let known = self.pool.origins()?;
        self.devices.forget_gone(&known);
        let all = self.pool.list()?;
        known
            .into_iter()
            .map(|o| self.origin_view(o, &all))
            .collect()
    }

    /// One origin, by name.
    pub fn origin(&self, name: &str) -> Result<OriginView> {
        let id = self.pool.lookup(name)?;
        let all = self.pool.list()?;
        match self.pool.origins()?.into_iter().find(|o| o.id == id) {
            Some(o) => self.origin_view(o, &all),
            None => Err(Error::not_found(name.to_owned()).into()),
        }
    }

    fn origin_view(&self, o: OriginInfo, all: &[arbor_engine::VolumeInfo]) -> Result<OriginView> {
        let readers = readers_through(all, o.id);
        let store_bytes = all
            .iter()
            .find(|v| v.id == o.id)
            .map_or(0, |v| match v.layout {
                VolumeLayout::CowExternal { store_bytes, .. } => store_bytes,
                _ => 0,
            });
        // The path it is open from, else the one recorded for the next start.
        let path = match self.devices.handles().get(&o.id) {
            Some(h) => Some(h.path.clone()),
            None => self.recorded(o.id)?.map(|r| r.path),
        };
        Ok(OriginView {
            path,
            size: o.size,
            attached: o.attached,
            store_bytes,
            checksums: if self.pool.format_version().has_data_checksums() {
                "copies"
            } else {
                "none"
            }
            .to_owned(),
            snapshots: readers
                .iter()
                .filter(|v| v.snapshot && v.parent == Some(o.id))
                .count() as u64,
            readers: readers.iter().map(|v| v.name.clone()).collect(),
            device: DeviceView {
                dev: o.identity.dev,
                ino: o.identity.ino,
            },
            rollback_pending: o.rollback_epoch != 0,
            failed: o.loss.filter(|l| l.accepted_unix == 0).map(|l| {
                format!(
                    "its device shrank to {} bytes: what it held from there on is lost; it \
                     serves no I/O until attached again with --accept-damage",
                    l.from
                )
            }),
            loss: o.loss.map(|l| LossView {
                from: l.from,
                seen_unix_secs: l.seen_unix,
                accepted_unix_secs: (l.accepted_unix != 0).then_some(l.accepted_unix),
            }),
            name: o.name,
        })
    }

    /// The names of the volumes and snapshots that read through origin `id`.
    fn readers_of(&self, id: VolumeId) -> Result<Vec<String>> {
        let all = self.pool.list()?;
        Ok(readers_through(&all, id)
            .into_iter()
            .map(|v| v.name.clone())
            .collect())
    }

    /// What the pool records of origin `id`'s device.
    fn recorded(&self, id: VolumeId) -> Result<Option<Recorded>> {
        let Some(value) = self.pool.property(Some(id), RECORD_KEY)? else {
            return Ok(None);
        };
        let record = serde_json::from_slice(&value)
            .with_context(|| format!("the recorded device of volume {} is unreadable", id.0))?;
        Ok(Some(record))
    }

    /// At the daemon's start: attaches every origin's device again from
    /// its recorded path. One that cannot be (no path recorded, the file
    /// missing, replaced or shrunk) is logged and stays unattached; the
    /// daemon serves everything else. Fails only if the pool does.
    pub fn attach_recorded_origins(&self) -> Result<()> {
        for o in self.pool.origins()? {
            if o.attached {
                continue;
            }
            let record = match self.recorded(o.id) {
                Ok(Some(record)) => record,
                Ok(None) => {
                    warn!(
                        volume = %o.name,
                        "origin {} has no recorded path (its attach was cut short): its I/O \
                         fails until arbor origin attach {} PATH",
                        o.name,
                        o.name
                    );
                    continue;
                }
                Err(e) => {
                    warn!(volume = %o.name, error = e.chain(), "cannot read an origin's path");
                    continue;
                }
            };
            match self.attach_origin(&o.name, &record.path, false) {
                Ok(_) => {}
                Err(e) if e.stops_pool() => return Err(e),
                Err(e) => warn!(
                    volume = %o.name,
                    path = %record.path,
                    error = e.chain(),
                    "cannot attach origin {} from {}: it stays unattached and its I/O \
                     fails; fix the device, then arbor origin attach {} {}",
                    o.name,
                    record.path,
                    o.name,
                    record.path
                ),
            }
        }
        Ok(())
    }
}

/// The engine's refusal of an attach, with what to do about it.
fn explain_attach(e: Error, name: &str, path: &str) -> DaemonError {
    match e {
        Error::Refused(Refusal::Conflict(why)) => Error::conflict(format!(
            "{why}; {path} cannot be {name}'s device: attach the one it was attached from, \
             as it was (arbor origin attach {name} PATH), or destroy {name}'s snapshots and \
             detach it"
        ))
        .into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_refuse_only_what_both_sides_know_to_differ() {
        let file = |born| Marks {
            born_unix_nanos: born,
            disk_id: None,
        };
        let disk = |id: &str| Marks {
            born_unix_nanos: None,
            disk_id: Some(id.to_owned()),
        };
        assert!(file(Some(1)).differ(&file(Some(2))).is_some());
        assert!(file(Some(1)).differ(&file(Some(1))).is_none());
        // A filesystem without birth times, or a record from before them.
        assert!(file(None).differ(&file(Some(2))).is_none());
        assert!(file(Some(1)).differ(&file(None)).is_none());
        assert!(disk("wwn-1").differ(&disk("wwn-2")).is_some());
        assert!(disk("wwn-1").differ(&disk("wwn-1")).is_none());
        // Recorded before marks existed: an old record reads as no marks.
        let old: Recorded = serde_json::from_str(r#"{"path":"/x"}"#).unwrap();
        assert_eq!(old.marks, Marks::default());
        // A new device number is taken for the same disk only on a mark
        // both sides know and agree on.
        assert!(disk("wwn-1").same_disk(&disk("wwn-1")));
        assert!(file(Some(1)).same_disk(&file(Some(1))));
        assert!(!disk("wwn-1").same_disk(&disk("wwn-2")));
        assert!(!file(None).same_disk(&file(Some(1))));
        assert!(!Marks::default().same_disk(&Marks::default()));
    }
}
