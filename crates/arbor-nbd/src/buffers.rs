//! Recycled buffers for large write payloads and read replies.
//!
//! Why: a fresh 1 MiB allocation per request comes from `mmap`, or from a
//! heap top that the allocator trims and grows again, so every request
//! faulted in and cleared 256 new pages: 12% of the server's profile on
//! 1 MiB writes. Buffers returned here are kept, still mapped, for the next
//! large request.
//!
//! Invariant that keeps one client's data from another: a recycled buffer
//! holds the bytes of an earlier request, perhaps another volume's. So
//! [`BufferPool::take_filled`] hands out a buffer whose contents are
//! *unspecified*, and every caller overwrites all of it before any byte
//! leaves the server (a read reply is only sent when the export filled the
//! whole buffer, see [`crate::Export::read`]); [`BufferPool::take_empty`]
//! hands out an empty buffer that only exposes what is written into it.
//!
//! Limits: buffers under [`BufferPool::MIN_POOLED`] are not kept (they come
//! cheaply from the allocator's free lists), and the idle buffers together
//! hold at most the pool's byte limit; a returned buffer that does not fit
//! is freed.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// Idle buffers, each kept with its initialized length. The server has one,
/// shared by its connections: their budgets bound the buffers in flight,
/// this bounds what stays allocated between requests.
pub struct BufferPool {
    idle: Mutex<Idle>,
    max_idle_bytes: usize,
}

struct Idle {
    buffers: Vec<Vec<u8>>,
    /// Sum of the idle buffers' capacities.
    bytes: usize,
}

impl BufferPool {
    /// Smaller buffers are not kept.
    pub const MIN_POOLED: usize = 128 * 1024;

    pub fn new(max_idle_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(Idle {
                buffers: Vec::new(),
                bytes: 0,
            }),
            max_idle_bytes,
        })
    }

    /// A buffer of exactly `len` bytes whose contents are unspecified (an
    /// earlier request's data): the caller must overwrite all of it before
    /// exposing any of it. `len` must already be bounded by the caller.
    pub fn take_filled(self: &Arc<Self>, len: usize) -> Buffer {
        if len < Self::MIN_POOLED {
            // Zeroed memory from the allocator: the cheapest for small sizes.
            return self.wrap(vec![0; len]);
        }
        let mut data = self.take(len);
        if data.len() >= len {
            data.truncate(len);
        } else {
            // Only the part never initialized is cleared.
            data.resize(len, 0);
        }
        self.wrap(data)
    }

    /// An empty buffer with room for `capacity` bytes without reallocating.
    pub fn take_empty(self: &Arc<Self>, capacity: usize) -> Buffer {
        let mut data = self.take(capacity);
        data.clear();
        self.wrap(data)
    }

    /// Only buffers worth keeping hold on to the pool.
    fn wrap(self: &Arc<Self>, data: Vec<u8>) -> Buffer {
        let pool = (data.capacity() >= Self::MIN_POOLED).then(|| Arc::clone(self));
        Buffer { data, pool }
    }

    /// The smallest idle buffer of at least `capacity` bytes, or a new one.
    fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= Self::MIN_POOLED {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let best = idle
                .buffers
                .iter()
                .enumerate()
                .filter(|(_, buffer)| buffer.capacity() >= capacity)
                .min_by_key(|(_, buffer)| buffer.capacity())
                .map(|(index, _)| index);
            if let Some(index) = best {
                let buffer = idle.buffers.swap_remove(index);
                idle.bytes -= buffer.capacity();
                return buffer;
            }
        }
        Vec::with_capacity(capacity)
    }

    fn give_back(&self, buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.bytes + capacity <= self.max_idle_bytes {
            idle.bytes += capacity;
            idle.buffers.push(buffer);
        }
    }

    #[cfg(test)]
    fn idle_bytes(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

/// A buffer that goes back to its pool, if it has one, when dropped.
pub struct Buffer {
    data: Vec<u8>,
    /// `None` for a buffer too small to keep.
    pool: Option<Arc<BufferPool>>,
}

impl Buffer {
    /// The buffer as reply bytes; a pooled one returns to its pool when the
    /// last slice of them is dropped. A small one is handed over as is,
    /// which costs no allocation for the owner.
    pub fn into_bytes(mut self) -> Bytes {
        if self.pool.is_some() {
            Bytes::from_owner(self)
        } else {
            Bytes::from(std::mem::take(&mut self.data))
        }
    }
}

impl Deref for Buffer {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.data
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give_back(std::mem::take(&mut self.data));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = BufferPool::MIN_POOLED;

    #[test]
    fn large_buffers_are_reused_and_small_ones_are_not_kept() {
        let pool = BufferPool::new(4 * BIG);
        let first = pool.take_filled(BIG);
        let address = first.as_ptr();
        drop(first);
        assert_eq!(pool.idle_bytes(), BIG);
        let again = pool.take_empty(BIG / 2 + BIG / 2);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
        assert_eq!(pool.idle_bytes(), 0);
        drop(again);

        drop(pool.take_filled(BIG - 1));
        assert_eq!(pool.idle_bytes(), BIG, "a small buffer was kept");
    }

    #[test]
    fn a_filled_buffer_has_the_requested_length_whatever_it_held() {
        let pool = BufferPool::new(4 * BIG);
        let mut short = pool.take_empty(2 * BIG);
        short.extend_from_slice(&[7; 16]);
        drop(short);
        let grown = pool.take_filled(2 * BIG);
        assert_eq!(grown.len(), 2 * BIG);
        assert_eq!(&grown[..16], &[7; 16]);
        assert!(grown[16..].iter().all(|&b| b == 0));
        drop(grown);
        assert_eq!(pool.take_filled(BIG).len(), BIG);
    }

    #[test]
    fn the_smallest_fitting_buffer_is_chosen() {
        let pool = BufferPool::new(16 * BIG);
        let large = pool.take_empty(8 * BIG);
        let small = pool.take_empty(2 * BIG);
        let small_address = small.as_ptr();
        drop(large);
        drop(small);
        assert_eq!(pool.take_empty(2 * BIG).as_ptr(), small_address);
    }

    #[test]
    fn reply_bytes_return_their_buffer_when_the_last_slice_is_dropped() {
        let pool = BufferPool::new(4 * BIG);
        let mut buffer = pool.take_filled(BIG);
        buffer.fill(3);
        let bytes = buffer.into_bytes();
        let tail = bytes.slice(BIG - 8..);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "returned while a slice was alive");
        assert_eq!(tail[..], [3; 8]);
        drop(tail);
        assert_eq!(pool.idle_bytes(), BIG);

        let small = pool.take_filled(512).into_bytes();
        assert_eq!(small.len(), 512);
        drop(small);
        assert_eq!(pool.idle_bytes(), BIG);
    }

    #[test]
    fn idle_memory_stays_within_the_limit() {
        let pool = BufferPool::new(3 * BIG);
        let held: Vec<_> = (0..5).map(|_| pool.take_empty(BIG)).collect();
        drop(held);
        assert_eq!(pool.idle_bytes(), 3 * BIG);
        let huge = pool.take_empty(4 * BIG);
        drop(huge);
        assert_eq!(
            pool.idle_bytes(),
            3 * BIG,
            "a buffer over the limit was kept"
        );
    }
}
