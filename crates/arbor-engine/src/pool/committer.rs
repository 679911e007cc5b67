//! The committer: the state of the pool's commits, apart from the
//! transaction they commit (`Pool::meta`).
//!
//! * The commit lock runs one commit at a time (phases B and C, and the
//!   management operations that commit before they return).
//! * The group commit ([`Committer::group`]): one caller at a time, the
//!   leader, commits for every caller whose changes the open transaction
//!   holds; the others wait for it, not for the commit lock.
//! * The failed state: once an error stops the pool it stays stopped, with
//!   the first reason ([`Committer::fail`], [`Committer::check_failed`]).
//! * The observer told the duration of every commit's device work, and the
//!   page images a check walking an earlier commit needs kept
//!   ([`Committer::preserve`]): both hooks of the commit's device work.
//!
//! Its locks' place in the pool's lock order is in `pool.rs`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use tracing::warn;

use super::{lock_mutex, CommitObserver};
use crate::error::{Error, Result};
use crate::meta::CommitJob;
use crate::store::{PreservedPages, Store};

#[derive(Default)]
pub(super) struct Committer {
    lock: Mutex<()>,
    /// Whether a caller is committing for the others, who wait on
    /// `group_committed` instead of queueing for `lock`.
    group_leader: Mutex<bool>,
    group_committed: Condvar,
    /// Why the pool stopped, once it has.
    failure: Mutex<Option<String>>,
    observer: OnceLock<CommitObserver>,
    /// While a check walks an earlier commit: where commits keep the old
    /// home images of the space-map pages they overwrite.
    preserve: Mutex<Option<Arc<PreservedPages>>>,
}

/// The leader of a group commit: steps down and wakes the followers when
/// dropped.
struct GroupLeader<'a>(&'a Committer);

impl Drop for GroupLeader<'_> {
    fn drop(&mut self) {
        *lock_mutex(&self.0.group_leader) = false;
        self.0.group_committed.notify_all();
    }
}

impl Committer {
    /// The commit lock: one commit at a time.
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        lock_mutex(&self.lock)
    }

    /// The commit lock without waiting: `None` while another holds it.
    #[cfg(test)]
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.lock.try_lock().ok()
    }

    /// `Error::Failed` once the pool stopped.
    pub(super) fn check_failed(&self) -> Result<()> {
        match lock_mutex(&self.failure).as_ref() {
            Some(why) => Err(Error::failed(why.clone())),
            None => Ok(()),
        }
    }

    /// Stops the pool: its in-memory state is no longer trusted. The first
    /// reason sticks.
    pub(super) fn fail(&self, why: &Error) {
        let mut failure = lock_mutex(&self.failure);
        if failure.is_none() {
            warn!(error = %why, "pool stopped: in-memory state no longer trusted");
            *failure = Some(why.to_string());
        }
    }

    /// Installs the commit observer; false (and `observer` dropped) if one
    /// is set.
    pub(super) fn observe(&self, observer: CommitObserver) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// Keeps (`Some`) or stops keeping (`None`) the old home images of the
    /// space-map pages later commits overwrite, for a check.
    pub(super) fn preserve(&self, pages: Option<Arc<PreservedPages>>) {
        *lock_mutex(&self.preserve) = pages;
    }

    /// Phase B, the device work of a commit (caller holds the commit lock):
    /// writes `job`, keeping page images for a check; a failure stops the
    /// pool. Returns when it began, for [`Committer::observed`].
    pub(super) fn write(&self, store: &Store, job: &CommitJob) -> Result<Instant> {
        let started = Instant::now();
        let preserve = lock_mutex(&self.preserve).clone();
        if let Err(e) = job.write(store, preserve.as_deref()) {
            self.fail(&e);
            return Err(e);
        }
        Ok(started)
    }

    /// Tells the observer a commit begun at `started` is done.
    pub(super) fn observed(&self, started: Instant) {
        if let Some(observe) = self.observer.get() {
            observe(started.elapsed());
        }
    }

    /// Makes the changes of transaction `txn` durable, as a group commit:
    /// one caller at a time (the leader) runs `commit` for every caller
    /// whose changes it holds, while the others wait for it to finish, not
    /// for the commit lock; each then returns if that commit, or any other
    /// since, covered its transaction (`durable` says the last durable
    /// transaction), or leads the next one. (Queued on the commit lock
    /// instead, callers whose changes were durable already waited for each
    /// commit begun meanwhile.)
    pub(super) fn group(
        &self,
        txn: u64,
        durable: impl Fn() -> Result<u64>,
        commit: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut leader = lock_mutex(&self.group_leader);
        loop {
            if durable()? >= txn {
                return Ok(());
            }
            if !*leader {
                break;
            }
            leader = self
                .group_committed
                .wait(leader)
                .unwrap_or_else(|p| p.into_inner());
        }
        *leader = true;
        drop(leader);
        // Steps down however the commit ends, so no follower waits forever.
        let _leading = GroupLeader(self);
        commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Barrier;
    use std::time::Duration;

    /// A leader commits for a follower that arrives while it commits: the
    /// follower's transaction is covered, so it commits nothing itself.
    #[test]
    fn one_leader_commits_for_both() {
        let c = Committer::default();
        let durable = AtomicU64::new(0);
        let commits = AtomicU64::new(0);
        let (inside, release) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                c.group(
                    1,
                    || Ok(durable.load(Ordering::SeqCst)),
                    || {
                        inside.wait();
                        release.wait();
                        commits.fetch_add(1, Ordering::SeqCst);
                        // The open transaction held the follower's too.
                        durable.store(2, Ordering::SeqCst);
                        Ok(())
                    },
                )
                .unwrap();
            });
            inside.wait();
            let follower = s.spawn(|| {
                c.group(
                    2,
                    || Ok(durable.load(Ordering::SeqCst)),
                    || {
                        commits.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    },
                )
            });
            // The follower waits for the leader, whichever comes first.
            release.wait();
            follower.join().unwrap().unwrap();
        });
        assert_eq!(commits.load(Ordering::SeqCst), 1);
    }

    /// A leader whose commit fails steps down: the next caller leads.
    #[test]
    fn a_failed_leader_steps_down() {
        let c = Committer::default();
        let failed = c.group(1, || Ok(0), || Err(Error::inconsistent("test")));
        assert!(failed.is_err());
        let mut ran = false;
        c.group(
            1,
            || Ok(0),
            || {
                ran = true;
                Ok(())
            },
        )
        .unwrap();
        assert!(ran);
        // Covered already: nothing runs.
        c.group(1, || Ok(1), || panic!("committed a durable transaction"))
            .unwrap();
    }

    #[test]
    fn the_failed_state_sticks_with_its_first_reason() {
        let c = Committer::default();
        c.check_failed().unwrap();
        c.fail(&Error::inconsistent("first"));
        c.fail(&Error::inconsistent("second"));
        for _ in 0..2 {
            match c.check_failed() {
                Err(Error::Stop(crate::error::Fault::Failed(why))) => {
                    assert!(why.contains("first") && !why.contains("second"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn one_observer_is_told_each_commit() {
        let c = Committer::default();
        let told = Arc::new(AtomicU64::new(0));
        let t = Arc::clone(&told);
        assert!(c.observe(Box::new(move |_: Duration| {
            t.fetch_add(1, Ordering::SeqCst);
        })));
        assert!(!c.observe(Box::new(|_: Duration| panic!("second observer"))));
        c.observed(Instant::now());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_commit_lock_is_exclusive() {
        let c = Committer::default();
        let held = c.lock();
        assert!(c.try_lock().is_none());
        drop(held);
        assert!(c.try_lock().is_some());
    }
}
