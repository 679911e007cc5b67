//! Small state files in the data directory (replication pairs, API tokens):
//! read with a size bound, and replaced atomically and durably, so a crash
//! or a power cut leaves either the old contents or the new, never a mix.

use std::fs::{OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Reads the whole file at `path` if it holds at most `limit` bytes.
/// `Ok(None)`: no such file. A larger file is an error of kind
/// [`io::ErrorKind::FileTooLarge`]; nothing past the bound is read, whatever
/// its size (the file may grow while it is read).
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(Some(bytes))
}

/// Replaces the file at `path` with `contents`, atomically and durably:
/// written to `PATH.tmp` with exactly `mode` (whatever the umask), synced,
/// renamed over `path`, and the directory synced, so the rename itself
/// survives a power cut. One writer at a time per path (callers hold a
/// lock); a failure leaves the old file as it was.
pub fn replace_atomically(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temporary_name(path);
    let written = (|| {
        let mut out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // A temporary file left by a crash may have had another mode.
        out.set_permissions(Permissions::from_mode(mode))?;
        out.write_all(contents)?;
        out.sync_all()?;
        drop(out);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // Nothing useful to do if it is gone already.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

fn temporary_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_with_the_mode_and_reads_back_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert!(read_bounded(&path, 16).unwrap().is_none());
        replace_atomically(&path, b"first", 0o600).unwrap();
        replace_atomically(&path, b"second", 0o600).unwrap();
        assert_eq!(read_bounded(&path, 16).unwrap().unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert!(
            !temporary_name(&path).exists(),
            "the temporary file is gone"
        );

        // A stale temporary file with a looser mode does not leak its mode.
        std::fs::write(temporary_name(&path), b"stale").unwrap();
        std::fs::set_permissions(temporary_name(&path), Permissions::from_mode(0o644)).unwrap();
        replace_atomically(&path, b"third", 0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);

        assert_eq!(read_bounded(&path, 5).unwrap().unwrap(), b"third");
        let err = read_bounded(&path, 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn a_failed_replace_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace_atomically(&path, b"old", 0o600).unwrap();
        // The temporary name is taken by a directory: the write fails.
        std::fs::create_dir(temporary_name(&path)).unwrap();
        assert!(replace_atomically(&path, b"new", 0o600).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
    }
}
