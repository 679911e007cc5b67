//! Moving whole images between raw files and volumes, keeping them sparse
//! in both directions: import does not allocate chunks that are all zeros,
//! export leaves holes where the volume reads as zeros.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use arbor_engine::{Pool, VolumeId, SECTOR};

/// Bytes moved per engine call: a multiple of every chunk size (4 KiB–1 MiB),
/// so import's pieces stay chunk-aligned.
const IO_BUFFER: usize = 4 << 20;
/// Bytes of allocation map fetched at once during export, bounding its memory.
const MAP_WINDOW: u64 = 1 << 30;

#[derive(Debug, Default)]
pub struct Transferred {
    /// Bytes written to the destination.
    pub written: u64,
    /// Bytes that read as zeros and were left unwritten (or unmapped).
    pub skipped: u64,
}

/// Copies `source` into `volume`, creating the volume (sized to the file,
/// rounded up to 512 bytes) if it does not exist. Bytes of an existing
/// volume beyond the end of the file are left as they are.
pub fn import(pool: &Pool, volume: &str, source: &Path) -> Result<Transferred> {
    let mut file =
        File::open(source).with_context(|| format!("cannot open {}", source.display()))?;
    // seek(End) also sizes block devices, whose metadata length is 0.
    let len = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    if len == 0 {
        bail!("{} is empty", source.display());
    }
    let (id, fresh) = import_target(pool, volume, len.div_ceil(SECTOR) * SECTOR)?;
    let mut importer = Importer {
        pool,
        id,
        chunk: usize::try_from(pool.chunk_size())?,
        fresh,
        done: Transferred::default(),
    };
    let mut buf = vec![0u8; IO_BUFFER];
    let mut offset = 0u64;
    loop {
        let n = read_up_to(&mut file, &mut buf)
            .with_context(|| format!("cannot read {}", source.display()))?;
        if n == 0 {
            return Ok(importer.done);
        }
        // The tail of a file whose length is not a multiple of 512 is
        // padded with zeros.
        let padded = n.div_ceil(SECTOR as usize) * SECTOR as usize;
        buf[n..padded].fill(0);
        importer.write(offset, &buf[..padded])?;
        offset += padded as u64;
    }
}

/// The volume to import into and whether it was just created (and so
/// already reads as zeros everywhere).
fn import_target(pool: &Pool, volume: &str, size: u64) -> Result<(VolumeId, bool)> {
    match pool.lookup(volume) {
        Ok(id) => {
            let existing = pool.info(id)?.size;
            if existing < size {
                bail!("volume {volume} is {existing} bytes, smaller than the {size} bytes to import; resize it first");
            }
            Ok((id, false))
        }
        Err(arbor_engine::Error::NotFound(_)) => Ok((pool.create_volume(volume, size)?, true)),
        Err(e) => Err(e.into()),
    }
}

struct Importer<'a> {
    pool: &'a Pool,
    id: VolumeId,
    chunk: usize,
    /// A fresh volume reads as zeros everywhere: zero chunks need no work.
    fresh: bool,
    done: Transferred,
}

impl Importer<'_> {
    /// Writes chunk-aligned `data` at `offset`, merging neighbouring chunks
    /// into runs: data runs are written, all-zero runs skipped (or, on an
    /// existing volume, unmapped).
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        // (all zeros?, length) of each chunk
        let chunks: Vec<(bool, usize)> = data
            .chunks(self.chunk)
            .map(|c| (is_zero(c), c.len()))
            .collect();
        let mut start = 0;
        for run in chunks.chunk_by(|a, b| a.0 == b.0) {
            let zero = run[0].0;
            let len: usize = run.iter().map(|&(_, len)| len).sum();
            let at = offset + start as u64;
            if !zero {
                self.pool.write(self.id, at, &data[start..start + len])?;
                self.done.written += len as u64;
            } else {
                if !self.fresh {
                    self.pool.write_zeroes(self.id, at, len as u64, false)?;
                }
                self.done.skipped += len as u64;
            }
            start += len;
        }
        Ok(())
    }
}

/// Writes volume or snapshot `name` to `target`. A regular file is truncated
/// and left with holes where the volume reads as zeros; a device gets every
/// byte written.
pub fn export(pool: &Pool, name: &str, target: &Path) -> Result<Transferred> {
    let id = pool.lookup(name)?;
    let size = pool.info(id)?.size;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(target)
        .with_context(|| format!("cannot open {}", target.display()))?;
    let sparse = file.metadata()?.is_file();
    if sparse {
        // Drop old contents first: only written ranges may hold data.
        file.set_len(0)?;
        file.set_len(size)?;
    }
    let mut exporter = Exporter {
        pool,
        id,
        file,
        sparse,
        buf: vec![0u8; IO_BUFFER],
        done: Transferred::default(),
    };
    let mut window = 0;
    while window < size {
        let len = MAP_WINDOW.min(size - window);
        for run in pool.allocation_map(id, window, len)? {
            if run.mapped || !sparse {
                exporter
                    .copy(run.offset, run.len)
                    .with_context(|| format!("cannot write {}", target.display()))?;
            } else {
                exporter.done.skipped += run.len;
            }
        }
        window += len;
    }
    exporter
        .file
        .sync_all()
        .with_context(|| format!("cannot sync {}", target.display()))?;
    Ok(exporter.done)
}

struct Exporter<'a> {
    pool: &'a Pool,
    id: VolumeId,
    file: File,
    /// A sparse (regular) file reads as zeros wherever nothing is written.
    sparse: bool,
    buf: Vec<u8>,
    done: Transferred,
}

impl Exporter<'_> {
    /// Copies `[offset, offset + len)` of the volume to the same place in
    /// the file; in a sparse file, pieces that read as zeros stay holes.
    fn copy(&mut self, offset: u64, len: u64) -> Result<()> {
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let n = (self.buf.len() as u64).min(end - at);
            let piece = &mut self.buf[..n as usize];
            self.pool.read(self.id, at, piece)?;
            if self.sparse && is_zero(piece) {
                self.done.skipped += n;
            } else {
                self.file.write_all_at(piece, at)?;
                self.done.written += n;
            }
            at += n;
        }
        Ok(())
    }
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Fills `buf` from `file` as far as it goes; fewer bytes only at the end.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
