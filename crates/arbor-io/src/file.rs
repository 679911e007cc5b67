use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{check_range, BlockDevice};

/// A pool stored in a regular file or on a block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    size: u64,
}

impl FileDevice {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        // seek(End) also gives the size of a block device, where metadata().len() is 0.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(Self { file, size })
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
        Ok(Self { file, size })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size
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
}
