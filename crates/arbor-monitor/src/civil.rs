//! Proleptic Gregorian calendar arithmetic on Unix seconds (UTC).
//!
//! Hand-written (after Howard Hinnant's `days_from_civil` /
//! `civil_from_days`) rather than delegated to a date library so that it is
//! total over the whole `u64` range: no input makes it fail or panic. All
//! intermediate values are `i64` and stay far below its range for any day
//! count derived from a `u64` of seconds (`u64::MAX / 86_400 < 2^48`).

/// Seconds per minute.
pub(crate) const MINUTE: u64 = 60;
/// Seconds per hour.
pub(crate) const HOUR: u64 = 3_600;
/// Seconds per day.
pub(crate) const DAY: u64 = 86_400;
/// Seconds per week.
pub(crate) const WEEK: u64 = 7 * DAY;

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Civil {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    /// 0..=23
    pub hour: u32,
    /// 0..=59
    pub minute: u32,
    /// 0..=59
    pub second: u32,
}

/// Whole days since 1970-01-01 of Unix time `t`.
pub(crate) fn days(t: u64) -> i64 {
    // u64::MAX / 86_400 < 2^48, so the conversion cannot fail.
    i64::try_from(t / DAY).unwrap_or(i64::MAX)
}

/// `(year, month, day)` of the day `z` days after 1970-01-01.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    // month and day are in the small ranges noted above.
    (year, month as u32, day as u32)
}

/// Days since 1970-01-01 of `(year, month, day)`; `month` in 1..=12, `day`
/// in 1..=31 (not checked against the month length).
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400); // [0, 399]
    let m = i64::from(month);
    let mp = if m > 2 { m - 3 } else { m + 9 }; // [0, 11]
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// Whether `year` is a Gregorian leap year.
pub(crate) fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

/// Number of days in `month` (1..=12) of `year`; 0 for an invalid month.
pub(crate) fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Breaks Unix time `t` down into UTC calendar fields.
pub(crate) fn from_unix(t: u64) -> Civil {
    let (year, month, day) = civil_from_days(days(t));
    let secs = t % DAY;
    // All three are < 86_400 and fit in u32.
    Civil {
        year,
        month,
        day,
        hour: (secs / HOUR) as u32,
        minute: (secs % HOUR / MINUTE) as u32,
        second: (secs % MINUTE) as u32,
    }
}

/// Unix time of the given UTC calendar fields, or `None` if the fields are
/// out of range or the instant is before 1970 or after `u64::MAX`.
pub(crate) fn to_unix(c: Civil) -> Option<u64> {
    if !(1..=12).contains(&c.month)
        || c.day == 0
        || c.day > days_in_month(c.year, c.month)
        || c.hour > 23
        || c.minute > 59
        || c.second > 59
    {
        return None;
    }
    // Reject years whose day count could overflow the i128 math below
    // (far beyond any u64 of seconds anyway).
    if c.year.unsigned_abs() > 1 << 40 {
        return None;
    }
    let d = i128::from(days_from_civil(c.year, c.month, c.day));
    let t = d * i128::from(DAY)
        + i128::from(c.hour) * i128::from(HOUR)
        + i128::from(c.minute) * i128::from(MINUTE)
        + i128::from(c.second);
    u64::try_from(t).ok()
}

/// Weekday of Unix time `t`, 0 = Monday ..= 6 = Sunday.
#[cfg(test)]
pub(crate) fn weekday(t: u64) -> u32 {
    // 1970-01-01 was a Thursday (3); rem_euclid(7) is in 0..7.
    ((days(t) + 3).rem_euclid(7)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let c = from_unix(1_795_492_800); // 2026-11-24T04:00:00Z
        assert_eq!((c.year, c.month, c.day, c.hour), (2026, 11, 24, 4));
        assert_eq!(to_unix(c), Some(1_795_492_800));
        assert_eq!(weekday(0), 3);
        assert_eq!(weekday(1_795_492_800), 1); // a Tuesday
        assert_eq!(days_in_month(1900, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2024, 2), 29);
        assert_eq!(days_in_month(2024, 13), 0);
    }

    #[test]
    fn extremes_do_not_panic() {
        let c = from_unix(u64::MAX);
        assert_eq!(to_unix(c), Some(u64::MAX));
        let _ = weekday(u64::MAX);
        let _ = civil_from_days(i64::MAX);
        let _ = civil_from_days(i64::MIN);
        assert_eq!(
            to_unix(Civil {
                year: 1969,
                month: 12,
                day: 31,
                hour: 23,
                minute: 59,
                second: 59
            }),
            None
        );
    }

    proptest! {
        /// Cross-check against the `time` crate over its whole default range.
        #[test]
        fn matches_time_crate(t in 0u64..=253_402_300_799) {
            let c = from_unix(t);
            let odt = time::OffsetDateTime::from_unix_timestamp(t as i64).unwrap();
            prop_assert_eq!(c.year, i64::from(odt.year()));
            prop_assert_eq!(c.month, u8::from(odt.month()) as u32);
            prop_assert_eq!(c.day, u32::from(odt.day()));
            prop_assert_eq!(c.hour, u32::from(odt.hour()));
            prop_assert_eq!(c.minute, u32::from(odt.minute()));
            prop_assert_eq!(c.second, u32::from(odt.second()));
            prop_assert_eq!(weekday(t), u32::from(odt.weekday().number_days_from_monday()));
            prop_assert_eq!(to_unix(c), Some(t));
        }

        #[test]
        fn round_trips_whole_range(t in any::<u64>()) {
            prop_assert_eq!(to_unix(from_unix(t)), Some(t));
        }
    }
}
