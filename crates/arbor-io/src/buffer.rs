//! [`LargeBuffer`]: memory for large direct reads (a scrub's), laid out so
//! that the device is sent few, large requests.
//!
//! A direct read goes to the device as scatter-gather segments, one per
//! physically contiguous piece of the buffer, and the block layer splits a
//! request at the device's segment limit (254 on virtio-blk). A buffer of
//! ordinary 4 KiB pages may be scattered page by page, so a 4 MiB read can
//! leave as four or more requests of under a MiB each, which a device (a
//! virtual disk above all) serves at a fraction of its sequential rate.
//! This buffer is anonymous memory aligned to 2 MiB and advised to use
//! transparent huge pages: each 2 MiB of it is one segment. Where the
//! kernel gives no huge page, it is ordinary memory and still correct.

use std::ffi::c_void;
use std::io;
use std::ptr::NonNull;

use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};

/// The size of a transparent huge page on x86-64 and arm64 (4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialised byte buffer whose start is aligned to 2 MiB (so to
/// any sector or page size), backed by transparent huge pages where the
/// kernel has them.
pub struct LargeBuffer {
    /// The start of the mapping (what `munmap` takes).
    map: NonNull<c_void>,
    /// The mapping's length.
    map_len: usize,
    /// `offset` bytes into the mapping: where the buffer starts (aligned).
    offset: usize,
    len: usize,
}

// SAFETY: the buffer owns its mapping exclusively (no other pointer to it
// is ever made but through `&self`/`&mut self`), like a `Vec<u8>`.
#[allow(unsafe_code)]
unsafe impl Send for LargeBuffer {}
// SAFETY: shared access only reads, as for `&[u8]`.
#[allow(unsafe_code)]
unsafe impl Sync for LargeBuffer {}

impl LargeBuffer {
    /// A buffer of `len` bytes, all zero.
    pub fn new(len: usize) -> io::Result<Self> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "buffer too large");
        // Room to align the start: one huge page more than rounded up.
        let map_len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .and_then(|l| l.checked_add(HUGE_PAGE))
            .ok_or_else(too_large)?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        #[allow(unsafe_code)]
        let map = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let map = NonNull::new(map).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let offset = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
        let buffer = LargeBuffer {
            map,
            map_len,
            offset,
            len,
        };
        if len > 0 {
            // SAFETY: the range lies within the mapping made above; the
            // advice changes how it is backed, never its contents.
            #[allow(unsafe_code)]
            let advised = unsafe {
                madvise(
                    buffer.start().cast(),
                    len.next_multiple_of(HUGE_PAGE),
                    Advice::LinuxHugepage,
                )
            };
            // A kernel without transparent huge pages: ordinary pages.
            let _ = advised;
        }
        Ok(buffer)
    }

    fn start(&self) -> *mut u8 {
        // `offset` is within the mapping (less than one huge page into it,
        // which is at least one huge page long).
        self.map.as_ptr().cast::<u8>().wrapping_add(self.offset)
    }

    /// The buffer's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for LargeBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `start` lie within the mapping, which
        // is readable, initialised (anonymous memory is zero) and lives as
        // long as `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.start(), self.len)
        }
    }
}

impl std::ops::DerefMut for LargeBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` makes this the only
        // access.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.start(), self.len)
        }
    }
}

impl Drop for LargeBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this length and is
        // not used after this.
        #[allow(unsafe_code)]
        let _ = unsafe { munmap(self.map.as_ptr(), self.map_len) };
    }
}

impl std::fmt::Debug for LargeBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LargeBuffer")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_is_zeroed_aligned_and_writable() {
        for len in [0, 1, 4096, (2 << 20) - 1, 2 << 20, (4 << 20) + 512] {
            let mut b = LargeBuffer::new(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as u8));
        }
        assert!(LargeBuffer::new(usize::MAX - 100).is_err());
    }
}
