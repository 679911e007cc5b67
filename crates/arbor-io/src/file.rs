use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{check_range, BlockDevice};

/// A pool stored in a regular file or on a block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// Only grows (see [`BlockDevice::refresh_size`]).
    size: AtomicU64,
}

impl FileDevice {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        // seek(End) also gives the size of a block device, where metadata().len() is 0.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(Self {
            file,
            size: AtomicU64::new(size),
        })
    }

    /// Creates (or truncates) a regular file of `size` bytes. The file is
    /// sparse: space is allocated only as the pool writes.
    pub fn create_file(path: &Path, size: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(size)?;
        Ok(Self {
            file,
            size: AtomicU64::new(size),
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size())?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size())?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn refresh_size(&self) -> io::Result<u64> {
        // seek(End) gives a block device's size too; the shared offset it
        // moves is not used (all I/O is positional).
        let now = (&self.file).seek(SeekFrom::End(0))?;
        let known = self.size();
        if now < known {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the device shrank from {known} to {now} bytes"),
            ));
        }
        self.size.fetch_max(now, Ordering::AcqRel);
        Ok(now)
    }

    fn extend(&self, size: u64) -> io::Result<()> {
        if !self.file.metadata()?.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not a regular file: enlarge the block device with its own tools (lvextend, ...), then grow the pool to it",
            ));
        }
        if size > self.refresh_size()? {
            self.file.set_len(size)?;
        }
        self.refresh_size().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, 8192).unwrap();
        dev.write_at(&[7u8; 512], 4096).unwrap();
        dev.flush().unwrap();
        let reopened = FileDevice::open(&path).unwrap();
        assert_eq!(reopened.size(), 8192);
        let mut buf = [0u8; 512];
        reopened.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [7u8; 512]);
        assert!(reopened.read_at(&mut buf, 8000).is_err());
        assert!(reopened.write_at(&buf, u64::MAX - 10).is_err());
    }

    #[test]
    fn a_file_grows_and_never_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, 8192).unwrap();
        dev.extend(16384).unwrap();
        assert_eq!(dev.size(), 16384);
        dev.write_at(&[1u8; 512], 12288).unwrap();
        // Enlarged from outside.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(20480)
            .unwrap();
        assert_eq!(dev.size(), 16384);
        assert_eq!(dev.refresh_size().unwrap(), 20480);
        dev.extend(4096).unwrap();
        assert_eq!(dev.size(), 20480, "extend never shrinks");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        assert!(dev.refresh_size().is_err(), "a shrunk device is an error");
    }
}
