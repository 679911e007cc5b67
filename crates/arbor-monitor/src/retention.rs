//! How many policy snapshots are kept.
//!
//! Two kinds of rule, both evaluated over the policy's own snapshots only
//! (a snapshot is kept if the rule keeps it; everything else is a prune
//! candidate, subject to the protections in [`crate::prune`]):
//!
//! # Classes (sanoid/borg-style)
//!
//! `Retention::Classes { frequent, hourly, daily, weekly, monthly, yearly }`,
//! written `hourly=24,daily=7,weekly=4,monthly=6` (any subset, any order).
//!
//! * `frequent = N` keeps the newest N snapshots outright.
//! * Each other class splits time into UTC buckets — the hour, the day, the
//!   ISO week (starting Monday 00:00), the calendar month, the calendar
//!   year — and keeps the newest snapshot in each of the newest N buckets
//!   *that contain a snapshot*. Empty buckets (downtime) do not use up the
//!   count, so a long outage never wipes out history.
//!
//! A snapshot is kept if any class keeps it; its reason names the first
//! class (in the order above) that does.
//!
//! # Grid (zrepl-style)
//!
//! `Retention::Grid`, written like zrepl's `grid` rule:
//! `1x1h(keep=all) | 24x1h | 14x1d` — `COUNTxDURATION(keep=K)`, units
//! `s m h d w`, `keep` defaults to 1.
//!
//! Semantics follow zrepl's documentation ("Pruning Policies", policy
//! `grid`, <https://zrepl.github.io/configuration/prune.html>, source
//! `docs/configuration/prune.rst` in github.com/zrepl/zrepl):
//!
//! 1. The snapshots are placed on a time axis, youngest first.
//! 2. The first bucket's young edge is aligned with the **youngest**
//!    snapshot's creation time (not with `now`); each further bucket is
//!    placed adjacent to, and older than, its predecessor. A term `24x1h`
//!    is 24 adjacent one-hour buckets.
//! 3. Buckets are inclusive at their young edge and exclusive at their old
//!    edge ("left-inclusive and right-exclusive", so a snapshot on the edge
//!    between two buckets falls into the older one). In terms of
//!    `age = youngest.created - created`, bucket *i* holds the ages
//!    `[start_i, start_i + length_i)`.
//! 4. Snapshots older than the last bucket are not kept.
//! 5. "For each bucket, we only keep the `keep` oldest snapshots" — newer
//!    snapshots in a bucket are destroyed first.
//!
//! (zrepl's `pruning/retentiongrid` implementation agrees with the
//! documentation on these points.) Because the youngest snapshot falls into
//! the first bucket, a first bucket with `keep=1` keeps that bucket's
//! *oldest* snapshot; the planner's separate "never destroy the newest
//! policy snapshot" rule keeps the youngest regardless.
//!
//! # Limits
//!
//! At most [`MAX_GRID_TERMS`] grid terms; counts and keep values at most
//! [`MAX_COUNT`]; a grid spans at most [`MAX_GRID_SECS`] (100 years).

use std::cmp::Reverse;
use std::fmt;
use std::str::FromStr;

use crate::civil::{self, HOUR};
use crate::duration;
use crate::error::PolicyError;

/// Most terms in a grid.
pub const MAX_GRID_TERMS: usize = 16;
/// Largest count of any class, grid term repetition, or grid `keep`.
pub const MAX_COUNT: u32 = 100_000;
/// Longest total span of a grid: 100 years of 365.25 days.
pub const MAX_GRID_SECS: u64 = 3_155_760_000;
/// Longest retention string accepted by the parser, in bytes.
pub const MAX_RETENTION_LEN: usize = 1_024;

/// How many snapshots one grid bucket keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Keep {
    /// Every snapshot in the bucket (`keep=all`).
    All,
    /// The N oldest snapshots in the bucket (`keep=N`; 1 if unspecified).
    N(u32),
}

/// One term of a grid: `count` adjacent buckets of `length_secs` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GridInterval {
    /// Number of adjacent buckets (1..=[`MAX_COUNT`]).
    pub count: u32,
    /// Length of each bucket in seconds (at least 1).
    pub length_secs: u64,
    /// How many snapshots each bucket keeps.
    pub keep: Keep,
}

/// A retention rule. See the module docs for the semantics.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Retention {
    /// Sanoid/borg-style classes.
    Classes {
        /// Keep the newest N snapshots outright.
        frequent: u32,
        /// Keep the newest snapshot in each of the newest N hours.
        hourly: u32,
        /// ... days.
        daily: u32,
        /// ... ISO weeks (Monday to Sunday).
        weekly: u32,
        /// ... calendar months.
        monthly: u32,
        /// ... calendar years.
        yearly: u32,
    },
    /// zrepl-style grid, youngest term first.
    Grid(Vec<GridInterval>),
}

/// The class names, in evaluation (and `Display`) order.
const CLASS_NAMES: [&str; 6] = ["frequent", "hourly", "daily", "weekly", "monthly", "yearly"];

fn ret_err(msg: impl Into<String>) -> PolicyError {
    PolicyError::Retention(msg.into())
}

impl GridInterval {
    /// `count * length_secs`, saturating.
    fn span(&self) -> u128 {
        u128::from(self.count) * u128::from(self.length_secs)
    }

    /// Checks the term against the limits.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(1..=MAX_COUNT).contains(&self.count) {
            return Err(ret_err(format!(
                "grid term {self}: count must be 1..={MAX_COUNT}"
            )));
        }
        if self.length_secs == 0 {
            return Err(ret_err(format!(
                "grid term {self}: interval length must be at least 1s"
            )));
        }
        if let Keep::N(n) = self.keep {
            if !(1..=MAX_COUNT).contains(&n) {
                return Err(ret_err(format!(
                    "grid term {self}: keep must be `all` or 1..={MAX_COUNT}"
                )));
            }
        }
        Ok(())
    }
}

impl Retention {
    /// The class counts in [`CLASS_NAMES`] order, or `None` for a grid.
    fn class_counts(&self) -> Option<[u32; 6]> {
        match *self {
            Retention::Classes {
                frequent,
                hourly,
                daily,
                weekly,
                monthly,
                yearly,
            } => Some([frequent, hourly, daily, weekly, monthly, yearly]),
            Retention::Grid(_) => None,
        }
    }

    /// Checks the rule against the limits: class counts at most
    /// [`MAX_COUNT`] and not all zero; 1..=[`MAX_GRID_TERMS`] valid grid
    /// terms spanning at most [`MAX_GRID_SECS`].
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            Retention::Classes { .. } => {
                let counts = self.class_counts().unwrap_or_default();
                for (name, n) in CLASS_NAMES.iter().zip(counts) {
                    if n > MAX_COUNT {
                        return Err(ret_err(format!("{name}={n} exceeds {MAX_COUNT}")));
                    }
                }
                if counts.iter().all(|&n| n == 0) {
                    return Err(ret_err(
                        "every class count is zero; keep at least one (e.g. frequent=1)",
                    ));
                }
                Ok(())
            }
            Retention::Grid(terms) => {
                if terms.is_empty() {
                    return Err(ret_err("a grid needs at least one term"));
                }
                if terms.len() > MAX_GRID_TERMS {
                    return Err(ret_err(format!(
                        "a grid has at most {MAX_GRID_TERMS} terms, found {}",
                        terms.len()
                    )));
                }
                let mut total: u128 = 0;
                for t in terms {
                    t.validate()?;
                    total = total.saturating_add(t.span());
                }
                if total > u128::from(MAX_GRID_SECS) {
                    return Err(ret_err(format!(
                        "the grid spans {}, more than 100 years",
                        duration::format(u64::try_from(total).unwrap_or(u64::MAX), true)
                    )));
                }
                Ok(())
            }
        }
    }

    /// For each `(created, name)` item, the label of the first rule that
    /// keeps it (`"hourly"`, `"grid 24x1h"`, ...), or `None`. Total for any
    /// input, including invalid hand-built rules.
    pub(crate) fn labels(&self, items: &[(u64, &str)]) -> Vec<Option<String>> {
        let mut out = vec![None; items.len()];
        match self {
            Retention::Classes { .. } => {
                let counts = self.class_counts().unwrap_or_default();
                // Newest first; ties broken by name then position so the
                // choice is deterministic. Indexing is in bounds: `order`
                // and `keep_class` yield positions in `items`, and `out`
                // has one slot per item.
                let mut order: Vec<usize> = (0..items.len()).collect();
                order.sort_by_key(|&i| Reverse((items[i].0, items[i].1, i)));
                for (class, (&name, &n)) in CLASS_NAMES.iter().zip(counts.iter()).enumerate() {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    for i in keep_class(class, n, &order, items) {
                        if out[i].is_none() {
                            out[i] = Some(name.to_owned());
                        }
                    }
                }
            }
            Retention::Grid(terms) => grid_labels(terms, items, &mut out),
        }
        out
    }
}

/// The bucket of time `t` for class index `class` (1 = hourly ..= 5 =
/// yearly).
fn bucket(class: usize, t: u64) -> i64 {
    match class {
        1 => i64::try_from(t / HOUR).unwrap_or(i64::MAX),
        2 => civil::days(t),
        // Weeks starting on Monday: day 0 (1970-01-01) was a Thursday.
        3 => (civil::days(t) + 3).div_euclid(7),
        4 => {
            let (y, m, _) = civil::civil_from_days(civil::days(t));
            y.saturating_mul(12).saturating_add(i64::from(m))
        }
        _ => civil::civil_from_days(civil::days(t)).0,
    }
}

/// Positions kept by one class, given `order` (newest first), a
/// permutation of the positions in `items`.
fn keep_class(class: usize, n: usize, order: &[usize], items: &[(u64, &str)]) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    if class == 0 {
        return order.iter().take(n).copied().collect();
    }
    let mut kept = Vec::new();
    let mut last_bucket = None;
    for &i in order {
        let b = bucket(class, items[i].0);
        if last_bucket != Some(b) {
            // Newest-first order visits each bucket's newest snapshot first.
            last_bucket = Some(b);
            kept.push(i);
            if kept.len() >= n {
                break;
            }
        }
    }
    kept
}

/// Grid evaluation (see the module docs).
fn grid_labels(terms: &[GridInterval], items: &[(u64, &str)], out: &mut [Option<String>]) {
    let Some(anchor) = items.iter().map(|it| it.0).max() else {
        return;
    };
    // (term index, bucket index within the term, created, name, position)
    let mut placed: Vec<(usize, u128, u64, &str, usize)> = Vec::with_capacity(items.len());
    for (pos, &(created, name)) in items.iter().enumerate() {
        let age = u128::from(anchor - created);
        let mut start: u128 = 0;
        for (ti, term) in terms.iter().enumerate() {
            let span = term.span();
            if term.length_secs > 0 && age < start.saturating_add(span) {
                let idx = (age - start) / u128::from(term.length_secs);
                placed.push((ti, idx, created, name, pos));
                break;
            }
            start = start.saturating_add(span);
        }
    }
    // Group by bucket, oldest first within a bucket.
    placed.sort_unstable();
    let mut labels: Vec<Option<String>> = vec![None; terms.len()];
    let mut run_bucket = None;
    let mut kept_in_bucket: u64 = 0;
    for &(ti, idx, _, _, pos) in &placed {
        if run_bucket != Some((ti, idx)) {
            run_bucket = Some((ti, idx));
            kept_in_bucket = 0;
        }
        let (Some(term), Some(label), Some(slot)) =
            (terms.get(ti), labels.get_mut(ti), out.get_mut(pos))
        else {
            continue;
        };
        let keeps = match term.keep {
            Keep::All => true,
            Keep::N(n) => kept_in_bucket < u64::from(n),
        };
        if keeps {
            kept_in_bucket = kept_in_bucket.saturating_add(1);
            *slot = Some(label.get_or_insert_with(|| format!("grid {term}")).clone());
        }
    }
}

impl fmt::Display for GridInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}",
            self.count,
            duration::format(self.length_secs, true)
        )?;
        match self.keep {
            Keep::All => write!(f, "(keep=all)"),
            Keep::N(1) => Ok(()),
            Keep::N(n) => write!(f, "(keep={n})"),
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Classes { .. } => {
                let counts = self.class_counts().unwrap_or_default();
                let mut first = true;
                for (name, n) in CLASS_NAMES.iter().zip(counts) {
                    if n > 0 {
                        if !first {
                            f.write_str(",")?;
                        }
                        first = false;
                        write!(f, "{name}={n}")?;
                    }
                }
                if first {
                    // All zero: not a valid rule, but still printable.
                    f.write_str("frequent=0")?;
                }
                Ok(())
            }
            Retention::Grid(terms) => {
                for (i, t) in terms.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{t}")?;
                }
                Ok(())
            }
        }
    }
}

fn parse_count(what: &str, s: &str) -> Result<u32, PolicyError> {
    let n = duration::parse_u64(s).map_err(|e| ret_err(format!("{what}: {e}")))?;
    u32::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_COUNT)
        .ok_or_else(|| ret_err(format!("{what}: {n} exceeds {MAX_COUNT}")))
}

fn parse_classes(s: &str) -> Result<Retention, PolicyError> {
    let mut counts: [Option<u32>; 6] = [None; 6];
    for part in s.split(',') {
        let part = part.trim();
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| ret_err(format!("expected CLASS=N (e.g. hourly=24), found {part:?}")))?;
        let key = key.trim();
        let idx = CLASS_NAMES.iter().position(|c| *c == key).ok_or_else(|| {
            ret_err(format!(
                "unknown class {key:?} (use frequent, hourly, daily, weekly, monthly or yearly)"
            ))
        })?;
        let slot = &mut counts[idx];
        if slot.is_some() {
            return Err(ret_err(format!("class {key} is given twice")));
        }
        *slot = Some(parse_count(key, value.trim())?);
    }
    let [frequent, hourly, daily, weekly, monthly, yearly] = counts.map(|c| c.unwrap_or(0));
    let r = Retention::Classes {
        frequent,
        hourly,
        daily,
        weekly,
        monthly,
        yearly,
    };
    r.validate()?;
    Ok(r)
}

fn parse_term(term: &str) -> Result<GridInterval, PolicyError> {
    let compact: String = term.chars().filter(|c| !c.is_whitespace()).collect();
    let bad = |why: &str| {
        ret_err(format!(
            "grid term {:?}: {why} (expected COUNTxDURATION or COUNTxDURATION(keep=N|all), e.g. 24x1h)",
            term.trim()
        ))
    };
    let (head, keep) = match compact.split_once('(') {
        None => (compact.as_str(), Keep::N(1)),
        Some((head, tail)) => {
            let inner = tail
                .strip_suffix(')')
                .and_then(|t| t.strip_prefix("keep="))
                .ok_or_else(|| bad("malformed (keep=...)"))?;
            let keep = if inner == "all" {
                Keep::All
            } else {
                Keep::N(parse_count("keep", inner)?)
            };
            (head, keep)
        }
    };
    let (count, dur) = head.split_once('x').ok_or_else(|| bad("missing `x`"))?;
    let t = GridInterval {
        count: parse_count("count", count)?,
        length_secs: duration::parse(dur, true).map_err(|e| bad(&e))?,
        keep,
    };
    t.validate()?;
    Ok(t)
}

impl FromStr for Retention {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        if s.len() > MAX_RETENTION_LEN {
            return Err(ret_err(format!(
                "retention is {} bytes, more than {MAX_RETENTION_LEN}",
                s.len()
            )));
        }
        let s = s.trim().to_ascii_lowercase();
        if s.is_empty() {
            return Err(ret_err(
                "empty retention; expected e.g. `hourly=24,daily=7` or `1x1h(keep=all) | 24x1h | 14x1d`",
            ));
        }
        if !s.starts_with(|c: char| c.is_ascii_digit()) {
            return parse_classes(&s);
        }
        let parts: Vec<&str> = s.split('|').collect();
        if parts.len() > MAX_GRID_TERMS {
            return Err(ret_err(format!(
                "a grid has at most {MAX_GRID_TERMS} terms, found {}",
                parts.len()
            )));
        }
        let terms = parts
            .into_iter()
            .map(parse_term)
            .collect::<Result<Vec<_>, _>>()?;
        let r = Retention::Grid(terms);
        r.validate()?;
        Ok(r)
    }
}

impl serde::Serialize for Retention {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::civil::{DAY, WEEK};
    use proptest::prelude::*;

    fn p(s: &str) -> Retention {
        s.parse().unwrap()
    }

    fn classes(
        frequent: u32,
        hourly: u32,
        daily: u32,
        weekly: u32,
        monthly: u32,
        yearly: u32,
    ) -> Retention {
        Retention::Classes {
            frequent,
            hourly,
            daily,
            weekly,
            monthly,
            yearly,
        }
    }

    fn kept(r: &Retention, times: &[u64]) -> Vec<u64> {
        let names: Vec<String> = times.iter().map(|t| t.to_string()).collect();
        let items: Vec<(u64, &str)> = times
            .iter()
            .zip(&names)
            .map(|(&t, n)| (t, n.as_str()))
            .collect();
        let mut k: Vec<u64> = r
            .labels(&items)
            .iter()
            .zip(times)
            .filter(|(l, _)| l.is_some())
            .map(|(_, &t)| t)
            .collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn parses_classes() {
        assert_eq!(
            p("hourly=24,daily=7,weekly=4,monthly=6"),
            classes(0, 24, 7, 4, 6, 0)
        );
        assert_eq!(
            p(" monthly = 6 , frequent=3,yearly=1 "),
            classes(3, 0, 0, 0, 6, 1)
        );
        assert_eq!(p("hourly=24,daily=7").to_string(), "hourly=24,daily=7");
        assert_eq!(p("daily=7,hourly=24").to_string(), "hourly=24,daily=7");
        for bad in [
            "hourly=24,hourly=1",
            "hourly",
            "hourly=",
            "hourly=-1",
            "hourly=100001",
            "minutely=5",
            "hourly=0",
            "hourly=24,,daily=1",
            "",
        ] {
            assert!(bad.parse::<Retention>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_grid() {
        let g = p("1x1h(keep=all) | 24x1h | 14x1d");
        assert_eq!(
            g,
            Retention::Grid(vec![
                GridInterval {
                    count: 1,
                    length_secs: HOUR,
                    keep: Keep::All
                },
                GridInterval {
                    count: 24,
                    length_secs: HOUR,
                    keep: Keep::N(1)
                },
                GridInterval {
                    count: 14,
                    length_secs: DAY,
                    keep: Keep::N(1)
                },
            ])
        );
        assert_eq!(g.to_string(), "1x1h(keep=all) | 24x1h | 14x1d");
        assert_eq!(p("2x7d(keep=3)|1x90m").to_string(), "2x1w(keep=3) | 1x90m");
        assert_eq!(p("4 x 1w ( keep = 1 )").to_string(), "4x1w");
        for bad in [
            "0x1h",
            "1x0h",
            "1x1h(keep=0)",
            "1x1h(keep=)",
            "1x1h(keep=all",
            "1x1h(kept=all)",
            "1h",
            "1x1y",
            "1x1h |",
            "100001x1s",
            "101x1w | 100000x1w",
            "1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h|1x1h",
            "1x18446744073709551615w",
        ] {
            assert!(bad.parse::<Retention>().is_err(), "{bad:?}");
        }
        // Exactly 100 years is allowed.
        assert!("1x3155760000s".parse::<Retention>().is_ok());
        assert!("1x3155760001s".parse::<Retention>().is_err());
    }

    #[test]
    fn frequent_keeps_newest_n() {
        assert_eq!(
            kept(&classes(2, 0, 0, 0, 0, 0), &[10, 30, 20, 40]),
            vec![30, 40]
        );
    }

    #[test]
    fn hourly_buckets() {
        // 2026-11-24 04:00 .. ; three snapshots in 04:xx, one in 03:xx, one in 01:xx.
        let h = 1_795_492_800;
        let times = [h + 100, h + 1_000, h + 3_599, h - 1, h - 2 * HOUR - 10];
        assert_eq!(
            kept(&classes(0, 2, 0, 0, 0, 0), &times),
            vec![h - 1, h + 3_599]
        );
        // Empty hours do not count: three non-empty hours are 04, 03, 01.
        assert_eq!(
            kept(&classes(0, 3, 0, 0, 0, 0), &times),
            vec![h - 2 * HOUR - 10, h - 1, h + 3_599]
        );
    }

    #[test]
    fn weekly_buckets_start_monday() {
        // Sunday 2026-11-22 23:59:59 and Monday 2026-11-23 00:00:00 are in
        // different ISO weeks; Monday and the following Sunday are not.
        let mon = 1_795_392_000;
        let times = [mon - 1, mon, mon + 6 * DAY + 86_399];
        assert_eq!(
            kept(&classes(0, 0, 0, 2, 0, 0), &times),
            vec![mon - 1, mon + 6 * DAY + 86_399]
        );
        assert_eq!(
            kept(&classes(0, 0, 0, 1, 0, 0), &times),
            vec![mon + 6 * DAY + 86_399]
        );
        // ISO week spanning a year boundary: Mon 2029-12-31 .. Sun 2030-01-06.
        let mon = 1_893_369_600; // 2029-12-31 00:00:00
        assert_eq!(civil::weekday(mon), 0);
        let times = [mon + HOUR, mon + 2 * DAY, mon + WEEK];
        assert_eq!(
            kept(&classes(0, 0, 0, 2, 0, 0), &times),
            vec![mon + 2 * DAY, mon + WEEK]
        );
    }

    #[test]
    fn monthly_and_yearly_buckets() {
        let jan1_2027 = 1_798_761_600;
        let times = [
            jan1_2027 - 1,
            jan1_2027,
            jan1_2027 - 31 * DAY + 5,
            jan1_2027 - 31 * DAY - 5,
        ];
        // Buckets: 2027-01 {jan1}, 2026-12 {dec31 23:59:59, dec1 00:00:05}, 2026-11 {nov30 ...}.
        assert_eq!(
            kept(&classes(0, 0, 0, 0, 3, 0), &times),
            vec![jan1_2027 - 31 * DAY - 5, jan1_2027 - 1, jan1_2027]
        );
        assert_eq!(kept(&classes(0, 0, 0, 0, 0, 1), &times), vec![jan1_2027]);
        assert_eq!(
            kept(&classes(0, 0, 0, 0, 0, 2), &times),
            vec![jan1_2027 - 1, jan1_2027]
        );
    }

    #[test]
    fn grid_follows_zrepl_example() {
        // zrepl's documented example: grid 1x1h(keep=all) | 2x2h | 1x3h
        // with snapshots a (youngest) .. D; here every 20 minutes over 10h.
        let g = p("1x1h(keep=all) | 2x2h | 1x3h");
        let youngest = 100 * DAY;
        let times: Vec<u64> = (0..30).map(|i| youngest - i * 20 * 60).collect();
        let k = kept(&g, &times);
        let ages: Vec<u64> = k.iter().rev().map(|t| (youngest - t) / 60).collect();
        // Bucket 1 [0,60m): all (0, 20, 40). Bucket 2 [60,180): oldest = 160.
        // Bucket 3 [180,300): oldest 280. Bucket 4 [300,480): oldest 460.
        // Older than 480m: gone.
        assert_eq!(ages, vec![0, 20, 40, 160, 280, 460]);
    }

    #[test]
    fn grid_edges_fall_into_older_bucket() {
        let g = p("1x1h | 1x1h");
        let y = 10 * DAY;
        // Ages 0, 1h (edge → second bucket), 2h (edge → beyond grid).
        let k = kept(&g, &[y, y - HOUR, y - 2 * HOUR]);
        assert_eq!(k, vec![y - HOUR, y]);
        // keep=1 in the first bucket keeps its OLDEST snapshot, not the youngest.
        let k = kept(&p("1x1h"), &[y, y - 10, y - 20]);
        assert_eq!(k, vec![y - 20]);
        let k = kept(&p("1x1h(keep=2)"), &[y, y - 10, y - 20]);
        assert_eq!(k, vec![y - 20, y - 10]);
    }

    #[test]
    fn labels_name_first_keeping_rule() {
        let r = p("hourly=1,daily=2");
        let items = [(2 * DAY, "b"), (DAY + 5, "a")];
        let l = r.labels(&items);
        assert_eq!(l, vec![Some("hourly".to_owned()), Some("daily".to_owned())]);
        let g = p("1x1h(keep=all) | 24x1h");
        let items = [(10 * DAY, "a"), (10 * DAY - 2 * HOUR, "b"), (5 * DAY, "c")];
        assert_eq!(
            g.labels(&items),
            vec![
                Some("grid 1x1h(keep=all)".to_owned()),
                Some("grid 24x1h".to_owned()),
                None
            ]
        );
    }

    #[test]
    fn invalid_rules_are_total() {
        let weird = Retention::Grid(vec![
            GridInterval {
                count: 0,
                length_secs: 0,
                keep: Keep::N(0),
            },
            GridInterval {
                count: u32::MAX,
                length_secs: u64::MAX,
                keep: Keep::N(0),
            },
            GridInterval {
                count: u32::MAX,
                length_secs: u64::MAX,
                keep: Keep::All,
            },
        ]);
        assert!(weird.validate().is_err());
        let _ = kept(&weird, &[0, 1, u64::MAX]);
        let all = classes(u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX);
        assert_eq!(kept(&all, &[0, u64::MAX]), vec![0, u64::MAX]);
        assert!(Retention::Grid(vec![]).validate().is_err());
        assert_eq!(kept(&Retention::Grid(vec![]), &[1, 2]), Vec::<u64>::new());
    }

    pub(crate) fn arb_duration() -> impl Strategy<Value = u64> {
        prop_oneof![
            1u64..=100_000,
            (1u64..=30).prop_map(|d| d * DAY),
            (1u64..=8).prop_map(|w| w * WEEK)
        ]
    }

    pub(crate) fn arb_retention() -> impl Strategy<Value = Retention> {
        let classes =
            proptest::array::uniform6(prop_oneof![Just(0u32), 0u32..=40, 0u32..=MAX_COUNT])
                .prop_filter("not all zero", |c| c.iter().any(|&n| n > 0))
                .prop_map(|[frequent, hourly, daily, weekly, monthly, yearly]| {
                    Retention::Classes {
                        frequent,
                        hourly,
                        daily,
                        weekly,
                        monthly,
                        yearly,
                    }
                });
        let term = (
            1u32..=24,
            arb_duration(),
            prop_oneof![Just(Keep::All), (1u32..=5).prop_map(Keep::N)],
        )
            .prop_map(|(count, length_secs, keep)| GridInterval {
                count,
                length_secs,
                keep,
            });
        let grid = proptest::collection::vec(term, 1..=MAX_GRID_TERMS)
            .prop_map(Retention::Grid)
            .prop_filter("within limits", |r| r.validate().is_ok());
        prop_oneof![classes, grid]
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(r in arb_retention()) {
            prop_assert_eq!(r.to_string().parse::<Retention>(), Ok(r));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,80}") {
            let _ = s.parse::<Retention>();
        }

        #[test]
        fn parse_grid_like_never_panics(s in "[0-9x|()kepal= smhdw]{0,60}") {
            let _ = s.parse::<Retention>();
        }
    }
}
