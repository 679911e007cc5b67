//! What the server serves: a synchronous block-device-like [`Export`], and an
//! [`ExportProvider`] that names them.
//!
//! Both traits are blocking; the server calls them from
//! `tokio::task::spawn_blocking`, or, for small I/O an export allows inline,
//! from the connection's own thread (which serves that connection alone), so
//! an implementation may do disk I/O and take locks freely.

use std::sync::Arc;

use crate::proto::Errno;

/// Why an export operation failed. Each variant maps to one NBD error value
/// (see [`ExportError::errno`]), which is all a client ever sees besides the
/// message text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The backing storage failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// A write to a read-only export (or snapshot).
    #[error("export is read-only")]
    ReadOnly,
    /// The pool has no free space for the write.
    #[error("no space left in the pool")]
    NoSpace,
    /// The request is not valid for this export (e.g. beyond its current end).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The request is too large to serve.
    #[error("request too large")]
    TooLarge,
    /// The operation cannot be done as asked; for `write_zeroes` with
    /// `fast_only`, that it would not be faster than writing zeroes.
    #[error("operation not supported")]
    NotSupported,
    /// The export was deleted while the connection was open.
    #[error("export no longer exists")]
    Gone,
    /// No export of that name (only meaningful from [`ExportProvider::open`]).
    #[error("no such export")]
    NotFound,
}

impl ExportError {
    /// The NBD error value a client receives for this error.
    pub fn errno(&self) -> Errno {
        match self {
            Self::Io(_) | Self::NotFound => Errno::Io,
            Self::ReadOnly => Errno::Perm,
            Self::NoSpace => Errno::NoSpc,
            Self::Invalid(_) => Errno::Inval,
            Self::TooLarge => Errno::Overflow,
            Self::NotSupported => Errno::NotSup,
            // ESHUTDOWN obliges the client to disconnect, which is the only
            // sensible reaction to its export disappearing.
            Self::Gone => Errno::Shutdown,
        }
    }
}

/// Allocation status of a run of bytes, as reported by [`Export::block_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRun {
    /// Length in bytes; runs of length 0 are ignored.
    pub length: u64,
    /// Not allocated in the backing store (writing may need new space).
    pub hole: bool,
    /// Reads as zeroes.
    pub zero: bool,
}

/// One line of an export listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportListing {
    pub name: String,
    pub description: String,
}

/// A byte-addressable volume served over NBD.
///
/// Contract (the server validates requests before calling, so an
/// implementation sees only these):
/// * every `offset` and length is a multiple of 512 and the range lies
///   within the size reported when the connection was opened; if the export
///   shrank since, the implementation must itself reject ranges past its new
///   end (`Invalid`);
/// * methods are called concurrently from many threads and connections;
/// * `flush` must make durable every write that completed before it was
///   called, **on any connection** to the same export: the server advertises
///   `NBD_FLAG_CAN_MULTI_CONN`, so clients flush on one connection to cover
///   writes done on others.
pub trait Export: Send + Sync + 'static {
    /// Size in bytes; should be a multiple of 512 (the tail past the last
    /// whole sector is unreachable to clients).
    fn size(&self) -> u64;

    /// Whether writes must be refused. Writes are rejected by the server
    /// before reaching the export, so `write`, `trim` and `write_zeroes` are
    /// never called on a read-only export.
    fn read_only(&self) -> bool;

    /// How long to hold a request of `kind` carrying `bytes` before it
    /// runs: the export's rate limits ([`crate::qos::Limiter::admit`]),
    /// which count it now. The connection reads nothing more meanwhile.
    fn admit(&self, _kind: crate::qos::IoKind, _bytes: u64) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The smallest block a request may address (a power of two from
    /// [`crate::proto::MIN_BLOCK_SIZE`] to 64 KiB), advertised in
    /// `NBD_INFO_BLOCK_SIZE`: a volume encrypted in 4 KiB units takes
    /// whole units only.
    fn min_block_size(&self) -> u32 {
        crate::proto::MIN_BLOCK_SIZE
    }

    /// Human-readable description shown by `nbdinfo` and friends.
    fn description(&self) -> String {
        String::new()
    }

    /// Fills `buf` with the bytes at `offset`. On success every byte of
    /// `buf` must have been written: the server recycles buffers, so one
    /// left untouched would send an earlier request's data.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;

    /// Writes `data` at `offset`. Durability is only required after `flush`
    /// (the server implements FUA as the operation followed by `flush`).
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError>;

    /// [`Export::write`] of a buffer the server gives up: the export may
    /// change its bytes (an encrypted volume encrypts them where they are,
    /// saving a copy). The server calls this for every write request.
    fn write_in_place(&self, offset: u64, data: &mut [u8]) -> Result<(), ExportError> {
        self.write(offset, data)
    }

    /// Makes every completed write durable (see the trait contract).
    fn flush(&self) -> Result<(), ExportError>;

    /// Discards the range; it may read back as anything until rewritten.
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError>;

    /// Makes the range read as zeroes. `may_trim`: the range may be
    /// deallocated instead of written. `fast_only`: fail with
    /// [`ExportError::NotSupported`], changing nothing, unless this is faster
    /// than writing zeroes.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast_only: bool,
    ) -> Result<(), ExportError>;

    /// Allocation status of `[offset, offset + len)`: consecutive runs starting
    /// at `offset` that cover a non-empty prefix of the range (the server asks
    /// again for the rest). The server also uses this to send holes instead of
    /// zeroes on reads.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<StatusRun>, ExportError>;

    /// Metadata contexts beyond `base:allocation` this export answers,
    /// among those `query` names: an exact context name, a namespace
    /// prefix ending in `:` (a wildcard, for listing), or the empty string
    /// for all. Names must be at most 4 KiB and in a namespace the server
    /// owns (an unregistered server's start with `x-`).
    fn meta_contexts(&self, _query: &str) -> Vec<String> {
        Vec::new()
    }

    /// Block status of `[offset, offset + len)` in one of
    /// [`Self::meta_contexts`]: consecutive `(length, flags)` runs from
    /// `offset` covering a non-empty prefix of the range.
    fn context_status(
        &self,
        _context: &str,
        _offset: u64,
        _len: u64,
    ) -> Result<Vec<(u64, u32)>, ExportError> {
        Err(ExportError::NotSupported)
    }

    /// Hint that the range will be accessed soon.
    fn cache(&self, _offset: u64, _len: u64) -> Result<(), ExportError> {
        Ok(())
    }

    /// Whether small reads and writes may run on the connection's own task
    /// rather than on the blocking pool, which saves two thread hand-offs per
    /// request. Say yes only if they never wait for another request to make
    /// progress (run inline, one connection's requests run one at a time)
    /// and are usually served from memory; a slow one still sends the
    /// connection's requests to the pool for a while.
    fn small_io_inline(&self) -> bool {
        false
    }

    /// With [`Export::small_io_inline`]: whether small requests (writes
    /// when `write`, else reads) run inline only while the connection is
    /// idle, with none of its requests on the blocking pool and no further
    /// request already received. Asked for each request, as the answer may
    /// change while a client is connected. For requests that wait for a
    /// device (direct I/O, a write that commits first): a lone request (a
    /// client at queue depth 1) saves the hand-offs, while a deep queue
    /// still reaches the device all at once, and its requests overlap.
    fn inline_only_when_idle(&self, _write: bool) -> bool {
        false
    }
}

/// The set of exports a server offers, looked up by name on every handshake
/// so new volumes appear and resized ones report their new size.
pub trait ExportProvider: Send + Sync + 'static {
    /// Every export a client may open, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportListing>;

    /// Opens the export called `name` (the empty name is the protocol's
    /// "default export", which an implementation may refuse with
    /// [`ExportError::NotFound`]).
    fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_documented_errnos() {
        let cases = [
            (ExportError::Io("disk".into()), Errno::Io),
            (ExportError::ReadOnly, Errno::Perm),
            (ExportError::NoSpace, Errno::NoSpc),
            (ExportError::Invalid("x".into()), Errno::Inval),
            (ExportError::TooLarge, Errno::Overflow),
            (ExportError::NotSupported, Errno::NotSup),
            (ExportError::Gone, Errno::Shutdown),
            (ExportError::NotFound, Errno::Io),
        ];
        for (error, errno) in cases {
            assert_eq!(error.errno(), errno, "{error}");
        }
    }
}
