//! A batch of independent reads or writes submitted to the kernel at once
//! through io_uring: one system call puts many in flight, where threads
//! each waiting for one write in turn would cost a thread start (or a
//! wake-up) per few writes, and a read of scattered chunks would wait for
//! each in turn. Used by [`crate::FileDevice`]'s `write_batch` and
//! `read_batch` with direct I/O, where each waits for the device
//! (PERFORMANCE.md § 10, "io_uring for batches").
//!
//! The kernel uses a buffer while its operation is in flight, so a batch
//! returns only once every entry it submitted has completed, whatever
//! failed; a ring whose state can no longer be known
//! (an `io_uring_enter` error the kernel documents only for misuse) aborts
//! the process rather than return and let the device read freed memory.
//! The pool's journal recovers the last commit at the next start.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring, Probe};
use rustix::io::Errno;

/// Writes in flight at once, at most: a device's queue rarely serves more
/// at a time, and the ring's memory is per device.
pub(crate) const RING_DEPTH: u32 = 64;

/// Longest write submitted as one entry (an entry's length is a `u32`; a
/// longer buffer is written in pieces, as `pwrite` would).
const MAX_ENTRY: usize = 1 << 30;

/// One io_uring instance. Each thread has its own ([`with_ring`]), so
/// that the batches of requests served at once on several threads never
/// wait for each other's.
pub(crate) struct Ring {
    ring: IoUring,
}

/// This thread's ring, made at its first batch.
enum Slot {
    Untried,
    Ready(Box<Ring>),
    /// The kernel refused one: this thread's batches go without.
    Refused,
}

thread_local! {
    static RING: RefCell<Slot> = const { RefCell::new(Slot::Untried) };
}

/// Runs `f` on this thread's ring, made on first use; `None` where the
/// kernel refuses the thread a ring (no io_uring before Linux 5.1,
/// `kernel.io_uring_disabled`, a seccomp filter, a memory limit), and the
/// caller then does without.
pub(crate) fn with_ring<T>(f: impl FnOnce(&mut Ring) -> T) -> Option<T> {
    RING.with(|cell| {
        // Nothing a batch runs calls back into here: a nested call (none
        // today) would go without.
        let mut slot = cell.try_borrow_mut().ok()?;
        if let Slot::Untried = *slot {
            *slot = Ring::new().map_or(Slot::Refused, |ring| Slot::Ready(Box::new(ring)));
        }
        match &mut *slot {
            Slot::Ready(ring) => Some(f(ring)),
            Slot::Untried | Slot::Refused => None,
        }
    })
}

/// Whether this thread can have a ring (made now if not yet).
pub(crate) fn available() -> bool {
    with_ring(|_| ()).is_some()
}

/// One read or write of a batch: `len` bytes at `ptr`, borrowed by the
/// safe function that built it for as long as the batch runs.
#[derive(Clone, Copy)]
struct Op {
    offset: u64,
    ptr: *mut u8,
    len: usize,
    write: bool,
}

impl Op {
    /// The device offset `done` bytes into the op.
    fn at(&self, done: usize) -> io::Result<u64> {
        self.offset.checked_add(done as u64).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "I/O past the largest offset")
        })
    }

    /// The error of a transfer that moved no byte: the end of the file
    /// for a read, a device that takes nothing for a write.
    fn nothing_moved(&self) -> io::Error {
        io::Error::from(if self.write {
            io::ErrorKind::WriteZero
        } else {
            io::ErrorKind::UnexpectedEof
        })
    }
}

/// What happened to one operation of a batch.
#[derive(Clone, Copy)]
struct Progress {
    /// Bytes done so far.
    done: usize,
    in_flight: bool,
}

impl Ring {
    /// A ring of [`RING_DEPTH`] entries, or the reason the kernel refused
    /// one. A kernel whose io_uring cannot read and write at an offset
    /// (before Linux 5.6) gives none: a batch that failed there would fail
    /// a commit.
    pub(crate) fn new() -> io::Result<Self> {
        let ring = IoUring::new(RING_DEPTH)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) || !probe.is_supported(opcode::Write::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this kernel's io_uring cannot read and write at an offset",
            ));
        }
        Ok(Self { ring })
    }

    /// Writes all of each buffer at its offset of `fd`, up to
    /// [`RING_DEPTH`] at once, in any order. A short write continues where
    /// it stopped; the first error stops new submissions and is returned
    /// once the writes in flight have completed (any subset of the batch
    /// may then have been written).
    pub(crate) fn write_all(
        &mut self,
        fd: BorrowedFd<'_>,
        writes: &[(u64, &[u8])],
    ) -> io::Result<()> {
        let ops: Vec<Op> = writes
            .iter()
            .map(|&(offset, buf)| Op {
                offset,
                // Only read through (an IORING_OP_WRITE entry).
                ptr: buf.as_ptr().cast_mut(),
                len: buf.len(),
                write: true,
            })
            .collect();
        // SAFETY: every op names a buffer of `writes`, borrowed for this call.
        unsafe { self.run(fd, &ops) }
    }

    /// Fills each buffer from its offset of `fd`, as `write_all` writes: a
    /// short read continues where it stopped, the end of the file is an
    /// `UnexpectedEof` error, and on error any buffer may hold anything.
    pub(crate) fn read_exact(
        &mut self,
        fd: BorrowedFd<'_>,
        reads: &mut [(u64, &mut [u8])],
    ) -> io::Result<()> {
        let ops: Vec<Op> = reads
            .iter_mut()
            .map(|(offset, buf)| Op {
                offset: *offset,
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
                write: false,
            })
            .collect();
        // SAFETY: every op names a buffer of `reads`, borrowed exclusively
        // for this call (the buffers are distinct `&mut` slices).
        unsafe { self.run(fd, &ops) }
    }

    /// Runs `ops` on `fd`, up to [`RING_DEPTH`] at once.
    ///
    /// # Safety
    /// Each op's `len` bytes at `ptr` must stay valid (and, for a read,
    /// unaliased) until this returns. It returns only once every entry it
    /// submitted has completed: the loop waits while `in_flight` is not
    /// zero, and `reap` aborts rather than return with entries whose fate
    /// is unknown.
    unsafe fn run(&mut self, fd: BorrowedFd<'_>, ops: &[Op]) -> io::Result<()> {
        // The ring holds no state between batches: every batch reaps all
        // it submitted before it returns or could panic.
        let ring = &mut self.ring;
        let mut progress = vec![
            Progress {
                done: 0,
                in_flight: false,
            };
            ops.len()
        ];
        // Operations to submit again (short or interrupted), then the rest
        // in order from `next`.
        let mut again: Vec<usize> = Vec::new();
        let mut next = 0;
        let mut in_flight = 0usize;
        // Operations io_uring refused, for the plain system calls.
        let mut plain: Vec<usize> = Vec::new();
        let mut failed: Option<io::Error> = None;
        loop {
            if failed.is_none() {
                let mut sq = ring.submission();
                while in_flight < RING_DEPTH as usize && !sq.is_full() {
                    let index = match again.pop() {
                        Some(index) => index,
                        None if next < ops.len() => {
                            next += 1;
                            next - 1
                        }
                        None => break,
                    };
                    let op = ops[index];
                    let done = progress[index].done;
                    if done == op.len {
                        continue;
                    }
                    let len = (op.len - done).min(MAX_ENTRY);
                    let at = match op.at(done) {
                        Ok(at) => at,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    };
                    let fd = types::Fd(fd.as_raw_fd());
                    // `done` < `len` of the op's buffer: in bounds. At most
                    // MAX_ENTRY (2^30) bytes: the length fits a u32.
                    let ptr = op.ptr.wrapping_add(done);
                    let entry = if op.write {
                        opcode::Write::new(fd, ptr, len as u32).offset(at).build()
                    } else {
                        opcode::Read::new(fd, ptr, len as u32).offset(at).build()
                    }
                    .user_data(index as u64);
                    // SAFETY: the entry names `len` bytes of a buffer the
                    // caller keeps valid until this returns (see above).
                    if unsafe { sq.push(&entry) }.is_err() {
                        again.push(index);
                        break;
                    }
                    progress[index].in_flight = true;
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                break;
            }
            reap(
                ring,
                ops,
                &mut progress,
                &mut in_flight,
                &mut again,
                &mut plain,
                &mut failed,
            );
        }
        if failed.is_none() {
            for &index in &plain {
                // SAFETY: as for the entries: the caller keeps the op's
                // buffer valid (and a read's unaliased) until this returns.
                if let Err(e) = unsafe { plainly(fd, ops[index], &mut progress[index]) } {
                    failed = Some(e);
                    break;
                }
            }
        }
        debug_assert!(failed.is_some() || progress.iter().zip(ops).all(|(p, op)| p.done == op.len));
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Finishes `op` from `progress.done` with `pread` or `pwrite`.
///
/// # Safety
/// As for [`Ring::run`]: the op's buffer valid, and a read's unaliased.
unsafe fn plainly(fd: BorrowedFd<'_>, op: Op, progress: &mut Progress) -> io::Result<()> {
    while progress.done < op.len {
        let at = op.at(progress.done)?;
        let rest = op.len - progress.done;
        let n = if op.write {
            // SAFETY: `done` < `len`: the rest of the op's buffer, valid per
            // the caller; a write's buffer is only read through.
            let buf = unsafe { std::slice::from_raw_parts(op.ptr.add(progress.done), rest) };
            rustix::io::pwrite(fd, buf, at)
        } else {
            // SAFETY: as above; a read's buffer is unaliased per the caller.
            let buf = unsafe { std::slice::from_raw_parts_mut(op.ptr.add(progress.done), rest) };
            rustix::io::pread(fd, buf, at)
        };
        match n {
            Ok(0) => return Err(op.nothing_moved()),
            Ok(n) => progress.done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Submits what is queued, waits for at least one completion and takes
/// every completion there is.
fn reap(
    ring: &mut IoUring,
    ops: &[Op],
    progress: &mut [Progress],
    in_flight: &mut usize,
    again: &mut Vec<usize>,
    plain: &mut Vec<usize>,
    failed: &mut Option<io::Error>,
) {
    if let Err(e) = ring.submit_and_wait(1) {
        match Errno::from_io_error(&e) {
            // Interrupted, or the kernel is short of memory or has too many
            // completions unread: take what completed and try again.
            Some(Errno::INTR | Errno::AGAIN | Errno::BUSY) => {}
            _ => {
                // EBADF, EFAULT, EINVAL...: misuse of the ring, whose
                // entries' fate is then unknown. Returning would let the
                // kernel use buffers the caller frees.
                eprintln!("arbor: io_uring_enter failed with I/O in flight: {e}; aborting");
                std::process::abort();
            }
        }
    }
    for cqe in ring.completion() {
        let Some(index) = usize::try_from(cqe.user_data())
            .ok()
            .filter(|&i| i < ops.len() && progress[i].in_flight)
        else {
            // Not one of ours: a ring is its thread's, used by one batch at
            // a time, and every batch reaps all it submitted.
            eprintln!("arbor: io_uring completion for no I/O in flight; aborting");
            std::process::abort();
        };
        progress[index].in_flight = false;
        *in_flight -= 1;
        let result = cqe.result();
        if result > 0 {
            // Positive: bytes done, at most the entry's length.
            progress[index].done += result as usize;
            if progress[index].done < ops[index].len {
                again.push(index);
            }
        } else if result == 0 {
            failed.get_or_insert_with(|| ops[index].nothing_moved());
        } else {
            let errno = Errno::from_raw_os_error(-result);
            if matches!(errno, Errno::INTR | Errno::AGAIN) {
                again.push(index);
            } else if matches!(errno, Errno::INVAL | Errno::OPNOTSUPP) {
                // What io_uring may refuse where the plain system call
                // works (a file system's direct I/O through it): done with
                // that call once the ring is idle, which gives the real
                // error if there is one.
                plain.push(index);
            } else {
                failed.get_or_insert_with(|| io::Error::from_raw_os_error(-result));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn every_write_of_a_batch_deeper_than_the_ring_lands() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let mut ring = Ring::new().expect("io_uring refused here");
        let bufs: Vec<Vec<u8>> = (0..300u32)
            .map(|i| vec![i as u8; 1 + i as usize * 7])
            .collect();
        let writes: Vec<(u64, &[u8])> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| (i as u64 * 4096, &b[..]))
            .collect();
        ring.write_all(file.as_fd(), &writes).unwrap();
        let data = std::fs::read(&path).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(&data[i * 4096..i * 4096 + b.len()], &b[..], "write {i}");
        }
        // The ring serves the next batch.
        ring.write_all(file.as_fd(), &[(0, &b"again"[..])]).unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[..5], b"again");
    }

    #[test]
    fn a_failing_batch_returns_its_error_after_its_writes_complete() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"").unwrap();
        // Opened read-only: every write fails with EBADF.
        let file = std::fs::File::open(&path).unwrap();
        let mut ring = Ring::new().expect("io_uring refused here");
        let buf = vec![1u8; 4096];
        let writes: Vec<(u64, &[u8])> = (0..200).map(|i| (i * 4096, &buf[..])).collect();
        let err = ring.write_all(file.as_fd(), &writes).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(Errno::BADF.raw_os_error()),
            "{err}"
        );
        // Nothing is left in flight: the ring serves a good batch next.
        let good = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        ring.write_all(good.as_fd(), &writes[..3]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), 3 * 4096);
    }

    #[test]
    fn what_io_uring_refuses_is_done_with_the_plain_call_which_gives_the_real_error() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path)
            .unwrap();
        let mut ring = Ring::new().expect("io_uring refused here");
        // 100 bytes with O_DIRECT: EINVAL through the ring, and from
        // pwrite too, which is what the batch returns.
        let odd = [7u8; 100];
        let err = ring.write_all(file.as_fd(), &[(0, &odd[..])]).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(Errno::INVAL.raw_os_error()),
            "{err}"
        );
        // The plain call finishes an op from where it stopped.
        let plain = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut data = *b"0123456789";
        let mut progress = Progress {
            done: 4,
            in_flight: false,
        };
        let op = Op {
            offset: 100,
            ptr: data.as_mut_ptr(),
            len: data.len(),
            write: true,
        };
        // SAFETY: `data` outlives the call.
        unsafe { plainly(plain.as_fd(), op, &mut progress) }.unwrap();
        assert_eq!(progress.done, 10);
        assert_eq!(&std::fs::read(&path).unwrap()[104..110], b"456789");
        let mut back = [0u8; 6];
        let mut progress = Progress {
            done: 0,
            in_flight: false,
        };
        let op = Op {
            offset: 104,
            ptr: back.as_mut_ptr(),
            len: back.len(),
            write: false,
        };
        // SAFETY: `back` outlives the call, borrowed by nothing else.
        unsafe { plainly(plain.as_fd(), op, &mut progress) }.unwrap();
        assert_eq!(&back, b"456789");
        // The ring serves the next batch.
        let block = vec![1u8; 4096];
        let mut aligned = vec![0u8; 8192];
        let at = aligned.as_ptr().align_offset(4096);
        aligned[at..at + 4096].copy_from_slice(&block);
        ring.write_all(file.as_fd(), &[(4096, &aligned[at..at + 4096])])
            .unwrap();
    }
}
