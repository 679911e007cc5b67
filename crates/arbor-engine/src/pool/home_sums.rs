//! Sums for new homes: a home in the pool is written whole when it is
//! built (zeroed when a copy-on-write volume is created or grown; copied
//! when it moves to grow or takes an origin's data, `detach
//! --copy-to-pool`), and those writes carry no sums (one commit cannot
//! hold the sums of a home of any size). So each home run built since the
//! pool opened is listed here, and a pass over it (the scrub's mechanism,
//! bounded to the run: `Pool::scrub_within`) gives every block still
//! without a sum one from what the device holds, and verifies those that
//! have one. The daemon runs the pass at the scrub's pace, before a
//! scheduled scrub would reach it (docs/FORMAT.md §6.4, "What has sums").
//!
//! The list is kept in memory: after a restart, the blocks of a run the
//! pass had not finished get their sums from the next scrub, as an
//! upgraded pool's older blocks do. A run freed before the pass reaches
//! it costs the pass a look at free chunks only.

use std::collections::VecDeque;
use std::ops::Range;

use super::*;

/// Most runs the list holds; a run built while it is full is left to the
/// next scrub (logged).
const MAX_RUNS: usize = 4096;

/// The runs of data chunks of homes built since the pool opened whose
/// blocks the pass has not yet given sums.
#[derive(Default)]
pub(super) struct HomeSums {
    runs: Mutex<VecDeque<Range<u64>>>,
    /// One pass at a time (it moves the first run's start).
    pass: Mutex<()>,
}

impl HomeSums {
    fn runs(&self) -> MutexGuard<'_, VecDeque<Range<u64>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pool {
    /// Lists home run `run`, just built, for the pass (in a pool with
    /// checksums).
    pub(super) fn sum_home_later(&self, run: Range<u64>) {
        if run.is_empty() || !self.store.geo.version().has_data_checksums() {
            return;
        }
        let mut runs = self.home_sums.runs();
        if runs.len() >= MAX_RUNS {
            warn!(
                chunks = ?run,
                "too many new homes await their checksums: this one gets them from the next scrub"
            );
            return;
        }
        runs.push_back(run);
    }

    /// Data chunks of new homes whose blocks the pass has not yet given
    /// sums (0: nothing to do).
    pub fn home_sums_pending(&self) -> u64 {
        self.home_sums.runs().iter().map(|r| r.end - r.start).sum()
    }

    /// Drops every run the pass has not done (after it failed): the next
    /// scrub gives their blocks sums. Returns their chunks.
    pub fn leave_home_sums_to_scrub(&self) -> u64 {
        let mut runs = self.home_sums.runs();
        let chunks = runs.iter().map(|r| r.end - r.start).sum();
        runs.clear();
        chunks
    }

    /// Runs the pass over new homes (see the module documentation) in
    /// steps of about `step_bytes`: streamed as [`Pool::scrub`]'s with
    /// `streamed`, else one step. `go_on` is told of each step, in order,
    /// and says whether to go on. Returns after the last run is done, the
    /// first step `go_on` stops at, a step some of whose blocks got no
    /// sum because a home was being built (the run stands where that step
    /// started: the caller tries again later), or an error (the run stands
    /// after the last step told).
    pub fn sum_new_homes(
        &self,
        step_bytes: u64,
        streamed: bool,
        mut go_on: impl FnMut(&ScrubStep) -> bool,
    ) -> Result<()> {
        let _one = self
            .home_sums
            .pass
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        loop {
            let Some(run) = self.home_sums.runs().front().cloned() else {
                return Ok(());
            };
            let mut stop = false;
            let mut tell = |step: &ScrubStep| {
                if step.sums_deferred > 0 {
                    stop = true;
                } else {
                    // Invariant: only a pass changes the first run, and
                    // one runs at a time.
                    let mut runs = self.home_sums.runs();
                    if step.next >= run.end.min(step.data_chunks) {
                        runs.pop_front();
                    } else if let Some(first) = runs.front_mut() {
                        first.start = step.next;
                    }
                }
                if !go_on(step) {
                    stop = true;
                }
                !stop
            };
            if streamed {
                self.scrub_within(run.clone(), step_bytes, &mut tell)?;
            } else {
                let step = self.scrub_step_within(run.start, run.end, step_bytes)?;
                tell(&step);
                return Ok(());
            }
            if stop {
                return Ok(());
            }
        }
    }
}
