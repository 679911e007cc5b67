//! Compact durations: `90s`, `15m`, `2h`, `1d`, `1w`.

use crate::civil::{DAY, HOUR, MINUTE, WEEK};

/// Longest digit string accepted in a duration or count (`u64::MAX` has 20
/// digits).
pub(crate) const MAX_DIGITS: usize = 20;

/// Parses a decimal integer made only of ASCII digits (no sign, no
/// whitespace), with overflow checking.
pub(crate) fn parse_u64(s: &str) -> Result<u64, String> {
    if s.is_empty() {
        return Err("expected a number".to_owned());
    }
    if s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a number in range"));
    }
    s.parse::<u64>()
        .map_err(|_| format!("{s:?} is not a number in range"))
}

/// Parses `<digits><unit>` where unit is one of `s m h d` (and `w` if
/// `weeks`), returning seconds.
pub(crate) fn parse(s: &str, weeks: bool) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let units = if weeks {
        "s, m, h, d or w"
    } else {
        "s, m, h or d"
    };
    if digits.is_empty() {
        return Err(format!(
            "duration {s:?} must be a number followed by a unit ({units})"
        ));
    }
    let n = parse_u64(digits)?;
    let mult = match unit {
        "s" => 1,
        "m" => MINUTE,
        "h" => HOUR,
        "d" => DAY,
        "w" if weeks => WEEK,
        "" => return Err(format!("duration {s:?} lacks a unit ({units})")),
        _ => {
            return Err(format!(
                "duration {s:?} has unknown unit {unit:?} (use {units})"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// Formats `secs` with the largest unit that divides it evenly.
pub(crate) fn format(secs: u64, weeks: bool) -> String {
    if secs == 0 {
        return "0s".to_owned();
    }
    if weeks && secs.is_multiple_of(WEEK) {
        format!("{}w", secs / WEEK)
    } else if secs.is_multiple_of(DAY) {
        format!("{}d", secs / DAY)
    } else if secs.is_multiple_of(HOUR) {
        format!("{}h", secs / HOUR)
    } else if secs.is_multiple_of(MINUTE) {
        format!("{}m", secs / MINUTE)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("90s", false), Ok(90));
        assert_eq!(parse("15m", false), Ok(900));
        assert_eq!(parse("2h", false), Ok(7_200));
        assert_eq!(parse("1d", false), Ok(86_400));
        assert_eq!(parse("2w", true), Ok(1_209_600));
        assert!(parse("2w", false).is_err());
        assert!(parse("15", false).is_err());
        assert!(parse("m", false).is_err());
        assert!(parse("-1m", false).is_err());
        assert!(parse("1.5h", false).is_err());
        assert!(parse("99999999999999999999d", false).is_err());
        assert!(parse("999999999999999999999999s", false).is_err());
        assert!(parse("", false).is_err());
    }

    #[test]
    fn formats_largest_unit() {
        assert_eq!(format(90, false), "90s");
        assert_eq!(format(900, false), "15m");
        assert_eq!(format(7 * DAY, false), "7d");
        assert_eq!(format(7 * DAY, true), "1w");
        assert_eq!(format(0, true), "0s");
    }

    proptest! {
        #[test]
        fn round_trips(secs in 1u64..=u64::MAX, weeks in any::<bool>()) {
            prop_assert_eq!(parse(&format(secs, weeks), weeks), Ok(secs));
        }

        #[test]
        fn never_panics(s in "\\PC{0,24}", weeks in any::<bool>()) {
            let _ = parse(&s, weeks);
        }
    }
}
