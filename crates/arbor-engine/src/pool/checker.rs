//! The checker's state: one `check` at a time, and (tests) what runs
//! between a check's capture and its walk. The page images a walk needs
//! kept are the committer's (`Committer::preserve`): commits keep them.
//! The check's lock comes before every other lock of the pool (`pool.rs`).

use std::sync::{Mutex, MutexGuard};

use super::lock_mutex;
#[cfg(test)]
use super::Pool;

/// What a test runs between a check's capture and its walk.
#[cfg(test)]
pub(super) type CheckPause = Box<dyn FnOnce(&Pool) + Send>;

#[derive(Default)]
pub(super) struct Checker {
    lock: Mutex<()>,
    #[cfg(test)]
    pause: Mutex<Option<CheckPause>>,
}

impl Checker {
    /// Held for a whole check: one at a time.
    pub(super) fn one(&self) -> MutexGuard<'_, ()> {
        lock_mutex(&self.lock)
    }

    /// Runs `pause` in the next check, between its capture and its walk.
    #[cfg(test)]
    pub(super) fn pause_next(&self, pause: CheckPause) {
        *lock_mutex(&self.pause) = Some(pause);
    }

    /// The pause a check runs now, if one was set.
    #[cfg(test)]
    pub(super) fn take_pause(&self) -> Option<CheckPause> {
        lock_mutex(&self.pause).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_check_at_a_time_and_a_pause_runs_once() {
        let c = Checker::default();
        let one = c.one();
        assert!(c.lock.try_lock().is_err());
        drop(one);
        assert!(c.take_pause().is_none());
        c.pause_next(Box::new(|_| {}));
        assert!(c.take_pause().is_some());
        assert!(c.take_pause().is_none());
    }
}
