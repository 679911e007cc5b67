//! When snapshots are taken.
//!
//! A [`Schedule`] is either a fixed interval measured from the previous run
//! ([`Schedule::Every`]) or a UTC calendar spec whose *slots* are fixed
//! instants ([`Schedule::Hourly`], [`Schedule::Daily`],
//! [`Schedule::Weekly`], [`Schedule::Monthly`]).
//!
//! # Due / next-run semantics
//!
//! The daemon records the time of the last successful run (`last_run`) and
//! asks [`Schedule::due`]; when nothing is due it sleeps until
//! [`Schedule::next_run`] and asks again.
//!
//! * **Never run** (`last_run == None`): due at once, so a new policy gets
//!   its first snapshot immediately.
//! * **Every `secs`**: due when `now >= last_run + secs`; the next run is
//!   `last_run + secs`.
//! * **Calendar**: due when the latest slot `<= now` is later than
//!   `last_run`; otherwise the next run is the first slot strictly after
//!   `now`.
//! * **Missed runs** (downtime): however many slots or intervals were
//!   missed, the schedule is due *once*. After the daemon takes that one
//!   catch-up snapshot at `now` (so `last_run = now`), nothing is due until
//!   the next slot (calendar) or `now + secs` (interval) — never a burst.
//! * **`last_run` in the future** (the clock was stepped back, or the record
//!   is corrupt): a future `last_run` carries no usable information, so it
//!   must not stall the schedule until the clock catches up with it. It is
//!   treated as "due at the next slot after `now`": `next_run` returns the
//!   first slot strictly after `now`, and `due` is true when `now` lies
//!   within [`CLOCK_STEP_GRACE_SECS`] after a slot. A daemon that sleeps
//!   until `next_run` therefore snapshots at that slot, after which
//!   `last_run <= now` again and the normal rules apply. For
//!   [`Schedule::Every`], which has no calendar slots, the slots used here
//!   are the multiples of `secs` since the Unix epoch.
//!
//! Because the functions are pure, the daemon may call them as often as it
//! likes; only the recorded `last_run` carries state.
//!
//! # Text form
//!
//! `every 15m` (units `s m h d`; the word `every` is optional), `hourly`,
//! `hourly at :30`, `daily`, `daily at 23:59`, `weekly on mon at 02:00`,
//! `monthly on 1 at 00:00`. Omitted parts default to minute `:00`, time
//! `00:00`, weekday Monday and day 1. [`Schedule`]'s `Display` always
//! writes the full form, which parses back to the same value.

use std::fmt;
use std::str::FromStr;

use crate::civil::{self, Civil, DAY, HOUR, MINUTE, WEEK};
use crate::duration;
use crate::error::PolicyError;

/// Shortest [`Schedule::Every`] interval, in seconds.
pub const MIN_INTERVAL_SECS: u64 = 1;
/// Longest [`Schedule::Every`] interval, in seconds (366 days).
pub const MAX_INTERVAL_SECS: u64 = 366 * DAY;
/// Latest day of the month a [`Schedule::Monthly`] spec may name (so that
/// every month has the slot).
pub const MAX_MONTH_DAY: u8 = 28;
/// Longest schedule string accepted by the parser, in bytes.
pub const MAX_SCHEDULE_LEN: usize = 128;
/// With `last_run` in the future (clock stepped back), how long after a
/// slot the schedule counts as due. See the module docs.
pub const CLOCK_STEP_GRACE_SECS: u64 = 300;
/// The period a calendar spec is taken to have for age alerts: an hour, a
/// day, a week, and 31 days for monthly specs.
pub const MONTHLY_PERIOD_SECS: u64 = 31 * DAY;

/// Weekday names as written by `Display`, index 0 = Monday.
const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
/// Full weekday names, also accepted by the parser.
const WEEKDAYS_LONG: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// When a policy's snapshots are taken. All calendar specs are in UTC.
///
/// Values built by [`FromStr`] are always valid; values built by hand may be
/// checked with [`Schedule::validate`]. An invalid schedule never becomes
/// due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Every `secs` seconds after the previous run
    /// ([`MIN_INTERVAL_SECS`]..=[`MAX_INTERVAL_SECS`]).
    Every {
        /// The interval in seconds.
        secs: u64,
    },
    /// Every hour at `:minute`.
    Hourly {
        /// 0..=59
        minute: u8,
    },
    /// Every day at `hour:minute`.
    Daily {
        /// 0..=23
        hour: u8,
        /// 0..=59
        minute: u8,
    },
    /// Every week on `weekday` at `hour:minute`.
    Weekly {
        /// 0 = Monday ..= 6 = Sunday
        weekday: u8,
        /// 0..=23
        hour: u8,
        /// 0..=59
        minute: u8,
    },
    /// Every month on `day` at `hour:minute`.
    Monthly {
        /// 1..=[`MAX_MONTH_DAY`]
        day: u8,
        /// 0..=23
        hour: u8,
        /// 0..=59
        minute: u8,
    },
}

fn schedule_err(msg: impl Into<String>) -> PolicyError {
    PolicyError::Schedule(msg.into())
}

fn check_time(hour: u8, minute: u8) -> Result<(), PolicyError> {
    if hour > 23 {
        return Err(schedule_err(format!("hour {hour} is out of range 0..=23")));
    }
    if minute > 59 {
        return Err(schedule_err(format!(
            "minute {minute} is out of range 0..=59"
        )));
    }
    Ok(())
}

impl Schedule {
    /// Checks that every field is in range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match *self {
            Schedule::Every { secs } => {
                if !(MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(&secs) {
                    return Err(schedule_err(format!(
                        "interval of {secs}s is out of range (1s ..= 366d)"
                    )));
                }
                Ok(())
            }
            Schedule::Hourly { minute } => check_time(0, minute),
            Schedule::Daily { hour, minute } => check_time(hour, minute),
            Schedule::Weekly {
                weekday,
                hour,
                minute,
            } => {
                if weekday > 6 {
                    return Err(schedule_err(format!(
                        "weekday {weekday} is out of range 0 (Monday) ..= 6 (Sunday)"
                    )));
                }
                check_time(hour, minute)
            }
            Schedule::Monthly { day, hour, minute } => {
                if !(1..=MAX_MONTH_DAY).contains(&day) {
                    return Err(schedule_err(format!(
                        "day of month {day} is out of range 1..=28"
                    )));
                }
                check_time(hour, minute)
            }
        }
    }

    /// The nominal period in seconds: the interval of [`Schedule::Every`],
    /// and an hour, a day, a week or [`MONTHLY_PERIOD_SECS`] for the
    /// calendar specs. Used to derive default age alert thresholds.
    pub fn period_secs(&self) -> u64 {
        match *self {
            Schedule::Every { secs } => secs,
            Schedule::Hourly { .. } => HOUR,
            Schedule::Daily { .. } => DAY,
            Schedule::Weekly { .. } => WEEK,
            Schedule::Monthly { .. } => MONTHLY_PERIOD_SECS,
        }
    }

    /// For fixed-period specs: `(anchor, period)` such that the slots are
    /// `anchor + k * period` for integer `k`. `None` for monthly specs.
    fn fixed_grid(&self) -> Option<(i128, i128)> {
        let hm =
            |h: u8, m: u8| i128::from(h) * i128::from(HOUR) + i128::from(m) * i128::from(MINUTE);
        match *self {
            Schedule::Every { secs } => Some((0, i128::from(secs))),
            Schedule::Hourly { minute } => Some((hm(0, minute), i128::from(HOUR))),
            Schedule::Daily { hour, minute } => Some((hm(hour, minute), i128::from(DAY))),
            Schedule::Weekly {
                weekday,
                hour,
                minute,
            } => {
                // Monday 1969-12-29 is 3 days before the epoch.
                let monday = -3 * i128::from(DAY);
                Some((
                    monday + i128::from(weekday) * i128::from(DAY) + hm(hour, minute),
                    i128::from(WEEK),
                ))
            }
            Schedule::Monthly { .. } => None,
        }
    }

    /// The monthly slot in `(year, month)`, as signed seconds.
    fn month_slot(year: i64, month: u32, day: u8, hour: u8, minute: u8) -> i128 {
        i128::from(civil::days_from_civil(year, month, u32::from(day))) * i128::from(DAY)
            + i128::from(hour) * i128::from(HOUR)
            + i128::from(minute) * i128::from(MINUTE)
    }

    /// `(latest slot <= t, first slot > t)` as signed seconds, for a valid
    /// schedule.
    fn slots_around(&self, t: u64) -> (i128, i128) {
        let t128 = i128::from(t);
        if let Some((anchor, period)) = self.fixed_grid() {
            // validate() guarantees period >= 1.
            let period = period.max(1);
            let k = (t128 - anchor).div_euclid(period);
            let le = anchor + k * period;
            return (le, le + period);
        }
        let Schedule::Monthly { day, hour, minute } = *self else {
            return (i128::MIN, i128::MAX);
        };
        let c: Civil = civil::from_unix(t);
        let (py, pm) = if c.month == 1 {
            (c.year - 1, 12)
        } else {
            (c.year, c.month - 1)
        };
        let (ny, nm) = if c.month == 12 {
            (c.year + 1, 1)
        } else {
            (c.year, c.month + 1)
        };
        let this = Self::month_slot(c.year, c.month, day, hour, minute);
        if this <= t128 {
            (this, Self::month_slot(ny, nm, day, hour, minute))
        } else {
            (Self::month_slot(py, pm, day, hour, minute), this)
        }
    }

    /// The latest scheduled instant `<= now`, or `None` if there is none
    /// (before the first slot after the epoch) or the schedule is invalid.
    ///
    /// For [`Schedule::Every`], which follows `last_run` rather than a
    /// calendar, this is the latest multiple of `secs` since the epoch (the
    /// grid used only when `last_run` is in the future).
    pub fn last_slot(&self, now: u64) -> Option<u64> {
        self.validate().ok()?;
        u64::try_from(self.slots_around(now).0).ok()
    }

    /// The first scheduled instant strictly after `t`, or `None` if it would
    /// not fit in a `u64` or the schedule is invalid.
    pub fn next_slot(&self, t: u64) -> Option<u64> {
        self.validate().ok()?;
        u64::try_from(self.slots_around(t).1).ok()
    }

    /// Whether `now` is within [`CLOCK_STEP_GRACE_SECS`] after a slot.
    fn in_step_grace(&self, now: u64) -> bool {
        self.last_slot(now)
            .is_some_and(|s| now - s < CLOCK_STEP_GRACE_SECS)
    }

    /// Whether a snapshot is due at `now`, given the time of the last
    /// successful run. See the module docs for the exact semantics,
    /// including missed runs and a `last_run` in the future.
    pub fn due(&self, last_run: Option<u64>, now: u64) -> bool {
        if self.validate().is_err() {
            return false;
        }
        match last_run {
            None => true,
            Some(last) if last > now => self.in_step_grace(now),
            Some(last) => match *self {
                Schedule::Every { secs } => last.checked_add(secs).is_some_and(|t| now >= t),
                _ => self.last_slot(now).is_some_and(|slot| slot > last),
            },
        }
    }

    /// When the daemon should next call [`Schedule::due`]: `now` if a run is
    /// due now, otherwise the instant at which one becomes due (see the
    /// module docs). `u64::MAX` means never (an invalid schedule, or a next
    /// run beyond the `u64` range).
    pub fn next_run(&self, last_run: Option<u64>, now: u64) -> u64 {
        if self.validate().is_err() {
            return u64::MAX;
        }
        if self.due(last_run, now) {
            return now;
        }
        match (last_run, *self) {
            (Some(last), Schedule::Every { secs }) if last <= now => last.saturating_add(secs),
            _ => self.next_slot(now).unwrap_or(u64::MAX),
        }
    }
}

fn parse_hhmm(s: &str) -> Result<(u8, u8), PolicyError> {
    let bad = || schedule_err(format!("time {s:?} must be HH:MM (00:00 ..= 23:59)"));
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let hour = u8::try_from(duration::parse_u64(h).map_err(|_| bad())?).map_err(|_| bad())?;
    let minute = u8::try_from(duration::parse_u64(m).map_err(|_| bad())?).map_err(|_| bad())?;
    if hour > 23 || minute > 59 {
        return Err(bad());
    }
    Ok((hour, minute))
}

fn parse_minute(s: &str) -> Result<u8, PolicyError> {
    let bad = || schedule_err(format!("minute {s:?} must be :MM (:00 ..= :59)"));
    let m = s.strip_prefix(':').ok_or_else(bad)?;
    if m.len() != 2 {
        return Err(bad());
    }
    let minute = u8::try_from(duration::parse_u64(m).map_err(|_| bad())?).map_err(|_| bad())?;
    if minute > 59 {
        return Err(bad());
    }
    Ok(minute)
}

fn parse_weekday(s: &str) -> Result<u8, PolicyError> {
    WEEKDAYS
        .iter()
        .position(|d| *d == s)
        .or_else(|| WEEKDAYS_LONG.iter().position(|d| *d == s))
        .and_then(|i| u8::try_from(i).ok())
        .ok_or_else(|| {
            schedule_err(format!(
                "unknown weekday {s:?} (use mon, tue, wed, thu, fri, sat or sun)"
            ))
        })
}

fn parse_month_day(s: &str) -> Result<u8, PolicyError> {
    let bad = || schedule_err(format!("day of month {s:?} must be 1..=28"));
    if s.len() > 2 {
        return Err(bad());
    }
    let day = u8::try_from(duration::parse_u64(s).map_err(|_| bad())?).map_err(|_| bad())?;
    if !(1..=MAX_MONTH_DAY).contains(&day) {
        return Err(bad());
    }
    Ok(day)
}

/// Parses the optional `on X` and `at Y` clauses (in that order) of a
/// calendar spec.
fn on_at<'a>(
    kind: &str,
    rest: &[&'a str],
) -> Result<(Option<&'a str>, Option<&'a str>), PolicyError> {
    match rest {
        [] => Ok((None, None)),
        ["on", on] => Ok((Some(on), None)),
        ["at", at] => Ok((None, Some(at))),
        ["on", on, "at", at] => Ok((Some(on), Some(at))),
        _ => Err(schedule_err(format!(
            "expected `{kind} [on ...] [at ...]`, found trailing words {:?}",
            rest.join(" ")
        ))),
    }
}

const GRAMMAR: &str =
    "expected `every 15m` (units s m h d), `hourly [at :MM]`, `daily [at HH:MM]`, \
     `weekly [on DAY] [at HH:MM]` or `monthly [on 1..28] [at HH:MM]`";

impl FromStr for Schedule {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        if s.len() > MAX_SCHEDULE_LEN {
            return Err(schedule_err(format!(
                "schedule is {} bytes, more than {MAX_SCHEDULE_LEN}",
                s.len()
            )));
        }
        let lower = s.to_ascii_lowercase();
        let words: Vec<&str> = lower.split_whitespace().collect();
        let sched = match words.as_slice() {
            [] => return Err(schedule_err(format!("empty schedule; {GRAMMAR}"))),
            ["every", d] => Schedule::Every {
                secs: duration::parse(d, false).map_err(schedule_err)?,
            },
            [d] if d.starts_with(|c: char| c.is_ascii_digit()) => Schedule::Every {
                secs: duration::parse(d, false).map_err(schedule_err)?,
            },
            ["hourly", rest @ ..] => match rest {
                [] => Schedule::Hourly { minute: 0 },
                ["at", m] => Schedule::Hourly {
                    minute: parse_minute(m)?,
                },
                _ => {
                    return Err(schedule_err(format!(
                        "expected `hourly` or `hourly at :MM`, found {s:?}"
                    )))
                }
            },
            ["daily", rest @ ..] => match rest {
                [] => Schedule::Daily { hour: 0, minute: 0 },
                ["at", t] => {
                    let (hour, minute) = parse_hhmm(t)?;
                    Schedule::Daily { hour, minute }
                }
                _ => {
                    return Err(schedule_err(format!(
                        "expected `daily` or `daily at HH:MM`, found {s:?}"
                    )))
                }
            },
            ["weekly", rest @ ..] => {
                let (on, at) = on_at("weekly", rest)?;
                let weekday = on.map(parse_weekday).transpose()?.unwrap_or(0);
                let (hour, minute) = at.map(parse_hhmm).transpose()?.unwrap_or((0, 0));
                Schedule::Weekly {
                    weekday,
                    hour,
                    minute,
                }
            }
            ["monthly", rest @ ..] => {
                let (on, at) = on_at("monthly", rest)?;
                let day = on.map(parse_month_day).transpose()?.unwrap_or(1);
                let (hour, minute) = at.map(parse_hhmm).transpose()?.unwrap_or((0, 0));
                Schedule::Monthly { day, hour, minute }
            }
            _ => return Err(schedule_err(format!("unknown schedule {s:?}; {GRAMMAR}"))),
        };
        sched.validate()?;
        Ok(sched)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Schedule::Every { secs } => write!(f, "every {}", duration::format(secs, false)),
            Schedule::Hourly { minute } => write!(f, "hourly at :{minute:02}"),
            Schedule::Daily { hour, minute } => write!(f, "daily at {hour:02}:{minute:02}"),
            Schedule::Weekly {
                weekday,
                hour,
                minute,
            } => {
                let day = WEEKDAYS.get(usize::from(weekday)).copied().unwrap_or("?");
                write!(f, "weekly on {day} at {hour:02}:{minute:02}")
            }
            Schedule::Monthly { day, hour, minute } => {
                write!(f, "monthly on {day} at {hour:02}:{minute:02}")
            }
        }
    }
}

impl serde::Serialize for Schedule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2026-11-24T04:00:00Z, a Tuesday.
    const T0: u64 = 1_795_492_800;

    fn p(s: &str) -> Schedule {
        s.parse().unwrap()
    }

    #[test]
    fn parses_all_forms() {
        assert_eq!(p("every 15m"), Schedule::Every { secs: 900 });
        assert_eq!(p("every 90s"), Schedule::Every { secs: 90 });
        assert_eq!(p("every 2h"), Schedule::Every { secs: 7_200 });
        assert_eq!(p("every 1d"), Schedule::Every { secs: 86_400 });
        assert_eq!(p("15m"), Schedule::Every { secs: 900 });
        assert_eq!(p("hourly"), Schedule::Hourly { minute: 0 });
        assert_eq!(p("hourly at :30"), Schedule::Hourly { minute: 30 });
        assert_eq!(p("daily"), Schedule::Daily { hour: 0, minute: 0 });
        assert_eq!(
            p("daily at 23:59"),
            Schedule::Daily {
                hour: 23,
                minute: 59
            }
        );
        assert_eq!(p("daily at 7:05"), Schedule::Daily { hour: 7, minute: 5 });
        assert_eq!(
            p("weekly on mon at 02:00"),
            Schedule::Weekly {
                weekday: 0,
                hour: 2,
                minute: 0
            }
        );
        assert_eq!(
            p("  Weekly  on SUNDAY at 23:00 "),
            Schedule::Weekly {
                weekday: 6,
                hour: 23,
                minute: 0
            }
        );
        assert_eq!(
            p("weekly"),
            Schedule::Weekly {
                weekday: 0,
                hour: 0,
                minute: 0
            }
        );
        assert_eq!(
            p("monthly on 1 at 00:00"),
            Schedule::Monthly {
                day: 1,
                hour: 0,
                minute: 0
            }
        );
        assert_eq!(
            p("monthly at 12:00"),
            Schedule::Monthly {
                day: 1,
                hour: 12,
                minute: 0
            }
        );
    }

    #[test]
    fn rejects_bad_forms() {
        for bad in [
            "",
            "every",
            "every 0s",
            "every 367d",
            "every 15",
            "every 15x",
            "every -5m",
            "every 1w",
            "hourly at 30",
            "hourly at :60",
            "hourly at :5",
            "daily at 24:00",
            "daily at 12:60",
            "daily at 12",
            "daily at :30",
            "daily at 123:00",
            "weekly on funday at 02:00",
            "weekly at 02:00 on mon",
            "monthly on 29 at 00:00",
            "monthly on 0",
            "monthly on 001",
            "yearly",
            "hourly daily",
        ] {
            let err = bad.parse::<Schedule>().unwrap_err();
            assert!(matches!(err, PolicyError::Schedule(_)), "{bad:?}: {err}");
        }
        let long = format!("every {}", "1".repeat(200));
        assert!(long.parse::<Schedule>().is_err());
        let msg = "every 15x".parse::<Schedule>().unwrap_err().to_string();
        assert!(msg.contains("unknown unit"), "{msg}");
    }

    #[test]
    fn display_is_canonical() {
        assert_eq!(p("every 120m").to_string(), "every 2h");
        assert_eq!(p("90s").to_string(), "every 90s");
        assert_eq!(p("hourly").to_string(), "hourly at :00");
        assert_eq!(p("daily").to_string(), "daily at 00:00");
        assert_eq!(
            p("weekly on friday at 2:00").to_string(),
            "weekly on fri at 02:00"
        );
        assert_eq!(p("monthly").to_string(), "monthly on 1 at 00:00");
    }

    #[test]
    fn last_slot_calendar() {
        // T0 = Tue 2026-11-24 04:00:00
        assert_eq!(p("hourly").last_slot(T0), Some(T0));
        assert_eq!(p("hourly at :30").last_slot(T0), Some(T0 - 1_800));
        assert_eq!(p("daily at 04:00").last_slot(T0), Some(T0));
        assert_eq!(p("daily at 04:01").last_slot(T0), Some(T0 - DAY + 60));
        // Monday 2026-11-23 02:00
        assert_eq!(
            p("weekly on mon at 02:00").last_slot(T0),
            Some(T0 - DAY - 2 * HOUR)
        );
        // Wednesday 2026-11-18 04:00 (next is Wed 25th)
        assert_eq!(
            p("weekly on wed at 04:00").last_slot(T0),
            Some(T0 - 6 * DAY)
        );
        // Monthly on 24 at 04:00 is exactly T0; on 25 is October's.
        assert_eq!(p("monthly on 24 at 04:00").last_slot(T0), Some(T0));
        assert_eq!(
            p("monthly on 25 at 04:00").last_slot(T0),
            Some(T0 - 30 * DAY) // 2026-10-25 04:00 (31-day October)
        );
        assert_eq!(p("monthly on 25 at 04:00").next_slot(T0), Some(T0 + DAY));
        // Before the first slot after the epoch there is none.
        assert_eq!(p("daily at 01:00").last_slot(0), None);
        assert_eq!(p("monthly on 2").last_slot(DAY - 1), None);
        assert_eq!(p("monthly on 2").next_slot(0), Some(DAY));
        // Across a year boundary.
        let dec31 = 1_798_675_200 + 23 * HOUR; // 2026-12-31 23:00
        assert_eq!(p("monthly on 1").next_slot(dec31), Some(dec31 + HOUR));
        assert_eq!(
            p("monthly on 28").last_slot(dec31 + HOUR),
            Some(dec31 - 3 * DAY - 23 * HOUR)
        );
    }

    #[test]
    fn never_run_is_due_at_once() {
        for s in [
            "every 15m",
            "hourly",
            "daily at 23:59",
            "weekly on sun",
            "monthly on 28",
        ] {
            let s = p(s);
            assert!(s.due(None, T0), "{s}");
            assert_eq!(s.next_run(None, T0), T0);
        }
    }

    #[test]
    fn every_cadence() {
        let s = p("every 15m");
        assert!(!s.due(Some(T0), T0));
        assert!(!s.due(Some(T0), T0 + 899));
        assert!(s.due(Some(T0), T0 + 900));
        assert_eq!(s.next_run(Some(T0), T0 + 10), T0 + 900);
        // Overdue: due now, once.
        assert!(s.due(Some(T0), T0 + 10_000));
        assert_eq!(s.next_run(Some(T0), T0 + 10_000), T0 + 10_000);
        assert!(!s.due(Some(T0 + 10_000), T0 + 10_000));
        assert_eq!(s.next_run(Some(T0 + 10_000), T0 + 10_000), T0 + 10_900);
        // Overflow near the end of time is not due, not a panic.
        assert!(!s.due(Some(u64::MAX - 1), u64::MAX));
        assert_eq!(s.next_run(Some(u64::MAX - 1), u64::MAX), u64::MAX);
    }

    #[test]
    fn calendar_cadence() {
        let s = p("daily at 02:00");
        let slot = T0 - 2 * HOUR; // today 02:00
        assert!(s.due(Some(slot - 1), T0));
        assert!(!s.due(Some(slot), T0));
        assert_eq!(s.next_run(Some(slot), T0), slot + DAY);
        assert!(s.due(Some(slot), slot + DAY));
        assert!(!s.due(Some(slot), slot + DAY - 1));
    }

    #[test]
    fn future_last_run_waits_for_next_slot_then_resumes() {
        // Clock stepped back by a year: last_run is far in the future.
        let last = T0 + 365 * DAY;
        let s = p("hourly");
        let now = T0 + 17 * MINUTE;
        assert!(!s.due(Some(last), now));
        let next = s.next_run(Some(last), now);
        assert_eq!(next, T0 + HOUR);
        assert!(s.due(Some(last), next));
        // A late wake-up inside the grace window still counts.
        assert!(s.due(Some(last), next + CLOCK_STEP_GRACE_SECS - 1));
        // After the run (last_run = next) the normal cadence resumes.
        assert!(!s.due(Some(next), next + 1));
        assert_eq!(s.next_run(Some(next), next + 1), next + HOUR);

        let e = p("every 15m");
        let now = T0 + 7 * MINUTE;
        assert!(!e.due(Some(last), now));
        let next = e.next_run(Some(last), now);
        assert_eq!(next, T0 + 15 * MINUTE);
        assert!(e.due(Some(last), next));
        assert_eq!(e.next_run(Some(next), next), next + 15 * MINUTE);
    }

    #[test]
    fn invalid_schedule_is_never_due() {
        let bad = Schedule::Daily {
            hour: 24,
            minute: 0,
        };
        assert!(bad.validate().is_err());
        assert!(!bad.due(None, T0));
        assert_eq!(bad.next_run(None, T0), u64::MAX);
        assert_eq!(bad.last_slot(T0), None);
        assert!(!Schedule::Every { secs: 0 }.due(None, T0));
        assert!(Schedule::Weekly {
            weekday: 7,
            hour: 0,
            minute: 0
        }
        .validate()
        .is_err());
        assert!(Schedule::Monthly {
            day: 29,
            hour: 0,
            minute: 0
        }
        .validate()
        .is_err());
    }

    pub(crate) fn arb_schedule() -> impl Strategy<Value = Schedule> {
        prop_oneof![
            (MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).prop_map(|secs| Schedule::Every { secs }),
            (0u8..60).prop_map(|minute| Schedule::Hourly { minute }),
            (0u8..24, 0u8..60).prop_map(|(hour, minute)| Schedule::Daily { hour, minute }),
            (0u8..7, 0u8..24, 0u8..60).prop_map(|(weekday, hour, minute)| Schedule::Weekly {
                weekday,
                hour,
                minute
            }),
            (1u8..=28, 0u8..24, 0u8..60).prop_map(|(day, hour, minute)| Schedule::Monthly {
                day,
                hour,
                minute
            }),
        ]
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(s in arb_schedule()) {
            prop_assert_eq!(s.to_string().parse::<Schedule>(), Ok(s));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Schedule>();
        }

        #[test]
        fn slots_bracket_now(s in arb_schedule(), now in 0u64..=u64::MAX / 2) {
            if let Some(le) = s.last_slot(now) {
                prop_assert!(le <= now);
                prop_assert_eq!(s.next_slot(le.saturating_sub(1)), Some(le));
            }
            let gt = s.next_slot(now).unwrap();
            prop_assert!(gt > now);
            prop_assert_eq!(s.last_slot(gt), Some(gt));
            prop_assert!(s.last_slot(gt - 1) < Some(gt));
        }

        /// From any state, waking at `next_run` leads to a due run within two
        /// wake-ups, and nothing is due before `next_run`.
        #[test]
        fn never_stalls(
            s in arb_schedule(),
            now in 0u64..=1u64 << 40,
            last in proptest::option::of(0u64..=1u64 << 41),
        ) {
            let t1 = s.next_run(last, now);
            prop_assert!(t1 >= now);
            if t1 > now {
                prop_assert!(!s.due(last, now));
                prop_assert!(!s.due(last, t1 - 1));
            }
            let t2 = s.next_run(last, t1);
            prop_assert!(s.due(last, t1) || s.due(last, t2));
        }

        /// After a catch-up run at `now`, nothing is due until the next slot
        /// or interval.
        #[test]
        fn one_catch_up_run(
            s in arb_schedule(),
            last in 0u64..=1u64 << 40,
            downtime in 0u64..=1u64 << 30,
        ) {
            let now = last + downtime;
            if s.due(Some(last), now) {
                prop_assert!(!s.due(Some(now), now));
                let next = s.next_run(Some(now), now);
                prop_assert!(next > now);
                prop_assert!(!s.due(Some(now), next - 1));
                prop_assert!(s.due(Some(now), next));
                prop_assert!(next - now <= s.period_secs());
            }
        }
    }
}
