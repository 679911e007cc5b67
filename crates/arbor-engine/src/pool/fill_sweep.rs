//! Where the sweep for fillable partial extents stands (`pool/fill.rs`
//! runs it): whether one is wanted, and its cursor over every volume's
//! map. The sweep is wanted after an open and after reclaim dropped
//! references; a full pass that finds nothing, with no new reason to look
//! since it began, ends it. Its lock is a leaf of the pool's lock order.

use std::sync::Mutex;

use super::lock_mutex;

#[derive(Debug, Default)]
pub(super) struct FillSweep(Mutex<Sweep>);

#[derive(Debug)]
struct Sweep {
    /// A sweep is wanted.
    wanted: bool,
    /// Bumped whenever `wanted` is set: a pass that began at an older
    /// reason may have missed a partial.
    reason: u64,
    /// The next volume id and chunk to look at.
    cursor: (u64, u64),
    /// The reason the current pass began at, and whether it filled any.
    pass_reason: u64,
    pass_filled: bool,
}

impl Default for Sweep {
    /// An opened pool may hold fillable partials.
    fn default() -> Self {
        Self {
            wanted: true,
            reason: 1,
            cursor: (0, 0),
            pass_reason: 0,
            pass_filled: false,
        }
    }
}

impl FillSweep {
    /// Asks for a sweep (references dropped).
    pub(super) fn want(&self) {
        let mut sweep = lock_mutex(&self.0);
        sweep.wanted = true;
        sweep.reason += 1;
    }

    pub(super) fn wanted(&self) -> bool {
        lock_mutex(&self.0).wanted
    }

    /// No sweep is wanted (the pool can hold no partial extents).
    pub(super) fn end(&self) {
        lock_mutex(&self.0).wanted = false;
    }

    /// The current pass filled a partial.
    pub(super) fn filled(&self) {
        lock_mutex(&self.0).pass_filled = true;
    }

    /// Where a step of the sweep starts (a pass begins at (0, 0)); `None`
    /// when no sweep is wanted.
    pub(super) fn start(&self) -> Option<(u64, u64)> {
        let mut sweep = lock_mutex(&self.0);
        if !sweep.wanted {
            return None;
        }
        if sweep.cursor == (0, 0) {
            sweep.pass_reason = sweep.reason;
            sweep.pass_filled = false;
        }
        Some(sweep.cursor)
    }

    /// A step that started at `start` looked up to `next` (`None`: past
    /// the last volume) and found fillable partials or not (`found`).
    /// Returns whether this step reached the last volume, or `None` when
    /// the sweep ended.
    pub(super) fn advance(
        &self,
        start: (u64, u64),
        next: Option<(u64, u64)>,
        found: bool,
    ) -> Option<bool> {
        let mut sweep = lock_mutex(&self.0);
        if sweep.cursor != start {
            // Another sweep moved the cursor meanwhile: its pass goes on
            // from there (this step's finds are filled all the same).
            return Some(false);
        }
        match next {
            Some(at) => sweep.cursor = at,
            None => {
                // The pass reached the last volume: done, unless it filled
                // some (their fills may free others) or a new reason came.
                sweep.cursor = (0, 0);
                if !found && !sweep.pass_filled && sweep.pass_reason == sweep.reason {
                    sweep.wanted = false;
                    return None;
                }
            }
        }
        Some(next.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_finds_nothing_ends_the_sweep() {
        let s = FillSweep::default();
        assert!(s.wanted());
        let start = s.start().unwrap();
        assert_eq!(start, (0, 0));
        assert_eq!(s.advance(start, Some((3, 10)), false), Some(false));
        assert_eq!(s.start(), Some((3, 10)));
        assert_eq!(s.advance((3, 10), None, false), None);
        assert!(!s.wanted());
        assert_eq!(s.start(), None);
    }

    #[test]
    fn a_pass_that_filled_or_a_new_reason_goes_round_again() {
        let s = FillSweep::default();
        let start = s.start().unwrap();
        s.filled();
        assert_eq!(s.advance(start, None, false), Some(true));
        assert!(s.wanted());
        // The next pass filled nothing, but a reason came meanwhile.
        let start = s.start().unwrap();
        s.want();
        assert_eq!(s.advance(start, None, false), Some(true));
        // Found some on its last step: round again.
        let start = s.start().unwrap();
        assert_eq!(s.advance(start, None, true), Some(true));
        let start = s.start().unwrap();
        assert_eq!(s.advance(start, None, false), None);
    }

    #[test]
    fn a_step_behind_a_moved_cursor_leaves_it() {
        let s = FillSweep::default();
        let a = s.start().unwrap();
        let b = s.start().unwrap();
        assert_eq!(s.advance(b, Some((1, 5)), false), Some(false));
        // `a` began at the same place, which is no longer the cursor.
        assert_eq!(s.advance(a, None, false), Some(false));
        assert_eq!(s.start(), Some((1, 5)));
        s.end();
        assert!(!s.wanted());
    }
}
