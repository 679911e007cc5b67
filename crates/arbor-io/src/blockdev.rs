//! What the kernel alone can say about a block device, through calls that
//! need `unsafe` (kept in this crate): which file a loop device reads and
//! writes (`LOOP_GET_STATUS64`), and an exclusive open (`O_EXCL` on a block
//! device, the claim dm, md and a mounted filesystem take, so none of them
//! and no other exclusive opener can use the device while it is held).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use linux_raw_sys::loop_device::{loop_info64, LOOP_GET_STATUS64};
use rustix::fs::OFlags;
use rustix::ioctl::{ioctl, Getter};

/// The file behind a loop device, as `stat` gives it: `st_dev` and
/// `st_ino` of the backing file, and its `st_rdev` when that file is
/// itself a block device (else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopBacking {
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
}

/// The backing file of the loop device open as `device`; `None` when the
/// loop device is not bound to a file (`ENXIO`).
pub fn loop_backing(device: &File) -> io::Result<Option<LoopBacking>> {
    // SAFETY: LOOP_GET_STATUS64 writes one `struct loop_info64` (the type
    // linux-raw-sys generates from the kernel's uapi header) to the pointer
    // it is given, and nothing else.
    let getter = unsafe { Getter::<{ LOOP_GET_STATUS64 as _ }, loop_info64>::new() };
    // SAFETY: the opcode and its output type match (above); the descriptor
    // is borrowed for the call only.
    match unsafe { ioctl(device, getter) } {
        Ok(info) => Ok(Some(LoopBacking {
            dev: info.lo_device,
            ino: info.lo_inode,
            rdev: info.lo_rdevice,
        })),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens the block device at `path` for reading and writing, exclusively
/// (`O_EXCL`): refused with `EBUSY` while it is mounted, held by
/// device-mapper or md, or open exclusively by another program; and while
/// the returned file is open, none of those can take it. (On a regular
/// file, `O_EXCL` without `O_CREAT` means nothing: call this for block
/// devices only.)
pub fn open_exclusive(path: &Path) -> io::Result<File> {
    let excl = i32::try_from(OFlags::EXCL.bits()).map_err(io::Error::other)?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(excl)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_no_loop_device() {
        let file = tempfile::tempfile().unwrap();
        // The kernel answers ENOTTY (no such ioctl for a file), never data.
        assert!(loop_backing(&file).is_err());
    }
}
