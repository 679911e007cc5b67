//! When the pool is scrubbed (docs/MONITOR.md, "Scrub schedule"): one
//! [`Schedule`] for the whole pool, kept in the pool as the property
//! [`SCRUB_SCHEDULE_KEY`], in the same grammar as a policy's.
//!
//! The stored value is the schedule's text in its full form (its
//! `Display`, e.g. `weekly on sun at 02:00`), parsed when it is read: a
//! value that does not parse is an error that says so, never a schedule.
//!
//! The last run is not stored apart: it is the `started` time of the
//! pool's scrub record, so a scrub started by hand counts as a run, and
//! the schedule survives restarts and moves with the pool. [`turn`]
//! decides, on a clock it is given, whether a scrub starts now.

use crate::error::PolicyError;
use crate::schedule::Schedule;

/// The pool property key of the scrub schedule.
pub const SCRUB_SCHEDULE_KEY: &str = "arbor.scrub.schedule";

/// The stored form of `schedule`.
pub fn encode(schedule: &Schedule) -> Vec<u8> {
    schedule.to_string().into_bytes()
}

/// The schedule a stored value holds. Its length is bounded by the
/// grammar (`MAX_SCHEDULE_LEN`).
pub fn decode(bytes: &[u8]) -> Result<Schedule, PolicyError> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        PolicyError::Schedule(format!(
            "the stored scrub schedule is not text ({} bytes)",
            bytes.len()
        ))
    })?;
    text.parse()
}

/// What the scrub schedule says at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// A new scrub starts now.
    pub start: bool,
    /// When the next scheduled scrub is due (`now` while one is due);
    /// `None`: never (beyond the clock's range).
    pub next_run: Option<u64>,
}

/// The scrub schedule's turn at `now`: `last_started` is when the last
/// scrub started (none: never, which is due at once), `running` whether
/// one runs now. A running scrub is never started again, whatever is due;
/// after downtime the missed runs make one scrub, as [`Schedule::due`]
/// says for snapshots.
pub fn turn(schedule: &Schedule, last_started: Option<u64>, running: bool, now: u64) -> Turn {
    let next = schedule.next_run(last_started, now);
    Turn {
        start: !running && schedule.due(last_started, now),
        next_run: (next != u64::MAX).then_some(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::civil::{DAY, HOUR};

    /// 2026-11-24T04:00:00Z, a Tuesday.
    const T0: u64 = 1_795_492_800;

    fn s(text: &str) -> Schedule {
        decode(text.as_bytes()).unwrap()
    }

    #[test]
    fn never_run_is_due_at_once() {
        let weekly = s("weekly on sun at 02:00");
        assert_eq!(
            turn(&weekly, None, false, T0),
            Turn {
                start: true,
                next_run: Some(T0)
            }
        );
    }

    #[test]
    fn due_and_not_due() {
        let daily = s("daily at 02:00");
        // Started at today's 02:00 slot: nothing until tomorrow's.
        let slot = T0 - 2 * HOUR;
        let t = turn(&daily, Some(slot), false, T0);
        assert_eq!(
            t,
            Turn {
                start: false,
                next_run: Some(slot + DAY)
            }
        );
        // The clock reaches the next slot: due.
        let t = turn(&daily, Some(slot), false, slot + DAY);
        assert!(t.start);
        assert_eq!(t.next_run, Some(slot + DAY));
        // An interval runs from the last start.
        let every = s("every 1h");
        assert!(!turn(&every, Some(T0), false, T0 + HOUR - 1).start);
        assert!(turn(&every, Some(T0), false, T0 + HOUR).start);
        assert_eq!(
            turn(&every, Some(T0), false, T0 + 10).next_run,
            Some(T0 + HOUR)
        );
    }

    #[test]
    fn missed_runs_make_one_catch_up() {
        let daily = s("daily at 02:00");
        let slot = T0 - 2 * HOUR;
        // Down for ten days: due once.
        let back = slot + 10 * DAY + 5;
        assert!(turn(&daily, Some(slot), false, back).start);
        // That scrub started at `back`: nothing more until the next slot.
        let t = turn(&daily, Some(back), false, back + 1);
        assert!(!t.start);
        assert_eq!(t.next_run, Some(slot + 11 * DAY));
        let every = s("every 1h");
        let back = T0 + 30 * HOUR;
        assert!(turn(&every, Some(T0), false, back).start);
        assert!(!turn(&every, Some(back), false, back + 60).start);
    }

    #[test]
    fn a_running_scrub_is_not_started_again() {
        let every = s("every 1s");
        for last in [None, Some(T0 - DAY), Some(T0)] {
            let t = turn(&every, last, true, T0 + 5);
            assert!(!t.start, "{last:?}");
        }
        // Once it is done, the overdue run starts.
        assert!(turn(&every, Some(T0), false, T0 + 5).start);
    }

    #[test]
    fn stored_values_round_trip_and_damage_is_an_error() {
        for text in ["every 1s", "hourly at :30", "weekly on sun at 02:00"] {
            let schedule = s(text);
            assert_eq!(decode(&encode(&schedule)).unwrap(), schedule);
        }
        assert_eq!(encode(&s("weekly on sun")), b"weekly on sun at 00:00");
        for bad in [
            &b"sometimes"[..],
            b"",
            b"\xff\xfe",
            b"{\"version\":2}",
            &[b'x'; 4096],
        ] {
            let e = decode(bad).unwrap_err();
            assert!(matches!(e, PolicyError::Schedule(_)), "{e}");
        }
    }
}
