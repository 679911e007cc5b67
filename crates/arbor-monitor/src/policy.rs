//! A snapshot policy and its on-disk encoding.
//!
//! A policy is stored as compact JSON:
//!
//! ```json
//! {"version":1,"volumes":[3,7],"schedule":"hourly at :00",
//!  "retention":"hourly=24,daily=7","prefix":"auto",
//!  "warn_age_secs":7200,"crit_age_secs":14400,"space_prune_percent":90}
//! ```
//!
//! `schedule` and `retention` are the `Display` strings of [`Schedule`] and
//! [`Retention`]. `prefix` defaults to [`DEFAULT_PREFIX`]; the three
//! optional fields may be omitted (or `null`). [`Policy::decode`] rejects
//! input over [`MAX_POLICY_BYTES`], unknown versions (with a message saying
//! so before anything else is looked at), unknown fields, and values that
//! fail [`Policy::validate`].

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::names::{self, DEFAULT_PREFIX};
use crate::retention::Retention;
use crate::schedule::Schedule;

/// The only encoding version this build reads and writes.
pub const POLICY_VERSION: u32 = 1;
/// Largest encoded policy accepted by [`Policy::decode`], in bytes.
pub const MAX_POLICY_BYTES: usize = 4_096;
/// Most volumes one policy may cover.
pub const MAX_VOLUMES: usize = 64;
/// Largest explicit age alert threshold: ten years.
pub const MAX_AGE_SECS: u64 = 10 * 366 * 86_400;
/// Smallest `space_prune_percent`.
pub const MIN_SPACE_PRUNE_PERCENT: u8 = 50;
/// Largest `space_prune_percent`.
pub const MAX_SPACE_PRUNE_PERCENT: u8 = 99;
/// Default warning age, in schedule periods.
pub const WARN_PERIODS: u64 = 2;
/// Default critical age, in schedule periods.
pub const CRIT_PERIODS: u64 = 4;

fn default_prefix() -> String {
    DEFAULT_PREFIX.to_owned()
}

/// A snapshot policy: which volumes, when, under which names, and how many
/// snapshots are kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Encoding version; always [`POLICY_VERSION`].
    pub version: u32,
    /// Volume ids the policy covers: 1..=[`MAX_VOLUMES`], unique.
    pub volumes: Vec<u64>,
    /// When snapshots are taken.
    pub schedule: Schedule,
    /// How many are kept.
    pub retention: Retention,
    /// Snapshot name prefix (see [`crate::names`]).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Warn when the newest policy snapshot is older than this; derived
    /// from the schedule if unset (see [`Policy::ages`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_age_secs: Option<u64>,
    /// Alert critically when the newest policy snapshot is older than this;
    /// derived from the schedule if unset (see [`Policy::ages`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crit_age_secs: Option<u64>,
    /// If set (50..=99), prune beyond retention while the pool is fuller
    /// than this percentage (see [`crate::prune::space_aware`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_prune_percent: Option<u8>,
}

/// Just enough of an encoding to check its version first.
#[derive(Deserialize)]
struct VersionProbe {
    version: Option<serde_json::Value>,
}

fn invalid(msg: impl Into<String>) -> PolicyError {
    PolicyError::Invalid(msg.into())
}

impl Policy {
    /// A policy with the default prefix and no optional settings.
    pub fn new(volumes: Vec<u64>, schedule: Schedule, retention: Retention) -> Policy {
        Policy {
            version: POLICY_VERSION,
            volumes,
            schedule,
            retention,
            prefix: default_prefix(),
            warn_age_secs: None,
            crit_age_secs: None,
            space_prune_percent: None,
        }
    }

    /// The effective `(warn, crit)` age thresholds in seconds.
    ///
    /// Unset values derive from the schedule's period
    /// ([`Schedule::period_secs`]: the interval, or 1h / 1d / 7d / 31d for
    /// calendar specs): warn = [`WARN_PERIODS`] × period and crit =
    /// [`CRIT_PERIODS`] × period. If only one is set, the other is derived
    /// so the pair stays ordered: crit = max(4 × period, 2 × warn), or
    /// warn = min(2 × period, crit / 2). Saturating.
    pub fn ages(&self) -> (u64, u64) {
        let period = self.schedule.period_secs();
        let warn_default = period.saturating_mul(WARN_PERIODS);
        let crit_default = period.saturating_mul(CRIT_PERIODS);
        match (self.warn_age_secs, self.crit_age_secs) {
            (Some(w), Some(c)) => (w, c),
            (Some(w), None) => (w, crit_default.max(w.saturating_mul(2))),
            (None, Some(c)) => (warn_default.min(c / 2), c),
            (None, None) => (warn_default, crit_default),
        }
    }

    /// Checks every field: version, 1..=64 unique volumes, a valid schedule,
    /// retention and prefix, ages in 1..=[`MAX_AGE_SECS`] with warn < crit,
    /// and `space_prune_percent` in 50..=99.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.version != POLICY_VERSION {
            return Err(PolicyError::UnsupportedVersion {
                found: u64::from(self.version),
                supported: POLICY_VERSION,
            });
        }
        if self.volumes.is_empty() {
            return Err(invalid("a policy must cover at least one volume"));
        }
        if self.volumes.len() > MAX_VOLUMES {
            return Err(invalid(format!(
                "a policy covers at most {MAX_VOLUMES} volumes, found {}",
                self.volumes.len()
            )));
        }
        let mut sorted = self.volumes.clone();
        sorted.sort_unstable();
        // `windows(2)` yields slices of exactly two elements.
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!("volume {} is listed twice", w[0])));
        }
        self.schedule.validate()?;
        self.retention.validate()?;
        names::validate_prefix(&self.prefix)?;
        for (name, v) in [
            ("warn_age_secs", self.warn_age_secs),
            ("crit_age_secs", self.crit_age_secs),
        ] {
            if let Some(v) = v {
                if !(1..=MAX_AGE_SECS).contains(&v) {
                    return Err(invalid(format!(
                        "{name} = {v} is out of range 1..={MAX_AGE_SECS}"
                    )));
                }
            }
        }
        let (warn, crit) = self.ages();
        if warn == 0 {
            return Err(invalid(format!(
                "crit_age_secs = {crit} leaves no room for a warning age; set warn_age_secs"
            )));
        }
        if warn >= crit {
            return Err(invalid(format!(
                "warning age {warn}s must be less than critical age {crit}s"
            )));
        }
        if let Some(p) = self.space_prune_percent {
            if !(MIN_SPACE_PRUNE_PERCENT..=MAX_SPACE_PRUNE_PERCENT).contains(&p) {
                return Err(invalid(format!(
                    "space_prune_percent = {p} is out of range {MIN_SPACE_PRUNE_PERCENT}..={MAX_SPACE_PRUNE_PERCENT}"
                )));
            }
        }
        Ok(())
    }

    /// The compact JSON encoding. A valid policy always encodes within
    /// [`MAX_POLICY_BYTES`] (64 volume ids, a short schedule, at most 16
    /// grid terms and a 32-byte prefix come to well under 2 KiB).
    pub fn encode(&self) -> Vec<u8> {
        // Invariant: serialization cannot fail — the struct holds only
        // integers, strings (Schedule and Retention serialize through
        // Display), options and a vector; no maps, no non-string keys.
        #[allow(clippy::expect_used)]
        serde_json::to_vec(self).expect("Policy serializes infallibly")
    }

    /// Decodes and validates an encoded policy.
    pub fn decode(bytes: &[u8]) -> Result<Policy, PolicyError> {
        if bytes.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge {
                len: bytes.len(),
                max: MAX_POLICY_BYTES,
            });
        }
        let probe: VersionProbe =
            serde_json::from_slice(bytes).map_err(|e| PolicyError::Malformed(e.to_string()))?;
        match probe.version {
            None => return Err(PolicyError::Malformed("missing field `version`".to_owned())),
            Some(v) => match v.as_u64() {
                Some(found) if found == u64::from(POLICY_VERSION) => {}
                Some(found) => {
                    return Err(PolicyError::UnsupportedVersion {
                        found,
                        supported: POLICY_VERSION,
                    })
                }
                None => {
                    return Err(PolicyError::Malformed(format!(
                        "`version` must be a non-negative integer, found {v}"
                    )))
                }
            },
        }
        let policy: Policy =
            serde_json::from_slice(bytes).map_err(|e| PolicyError::Malformed(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::civil::{DAY, HOUR};
    use proptest::prelude::*;

    fn sample() -> Policy {
        Policy::new(
            vec![3, 7],
            "hourly".parse().unwrap(),
            "hourly=24,daily=7,weekly=4,monthly=6".parse().unwrap(),
        )
    }

    #[test]
    fn encodes_and_decodes() {
        let p = sample();
        let bytes = p.encode();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"version":1,"volumes":[3,7],"schedule":"hourly at :00","retention":"hourly=24,daily=7,weekly=4,monthly=6","prefix":"auto"}"#
        );
        assert_eq!(Policy::decode(&bytes), Ok(p));
        let mut full = sample();
        full.warn_age_secs = Some(3 * HOUR);
        full.crit_age_secs = Some(DAY);
        full.space_prune_percent = Some(90);
        full.prefix = "hourly".to_owned();
        assert_eq!(Policy::decode(&full.encode()), Ok(full));
    }

    #[test]
    fn decode_accepts_defaults_and_nulls() {
        let p = Policy::decode(
            br#"{"version":1,"volumes":[1],"schedule":"every 15m","retention":"1x1h(keep=all)|24x1h","warn_age_secs":null}"#,
        )
        .unwrap();
        assert_eq!(p.prefix, "auto");
        assert_eq!(p.schedule, Schedule::Every { secs: 900 });
        assert_eq!(p.ages(), (1_800, 3_600));
    }

    #[test]
    fn decode_rejects() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"version":2,"volumes":[1],"bogus":true}"#, "unsupported policy version 2"),
            (br#"{"volumes":[1]}"#, "missing field `version`"),
            (br#"{"version":"1"}"#, "must be a non-negative integer"),
            (br#"{"version":-1}"#, "must be a non-negative integer"),
            (b"not json", "malformed"),
            (b"", "malformed"),
            (br#"[1]"#, "malformed"),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","extra":1}"#,
                "unknown field `extra`",
            ),
            (
                br#"{"version":1,"volumes":[],"schedule":"hourly","retention":"daily=1"}"#,
                "at least one volume",
            ),
            (
                br#"{"version":1,"volumes":[1,1],"schedule":"hourly","retention":"daily=1"}"#,
                "listed twice",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly at 5","retention":"daily=1"}"#,
                "minute",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=0"}"#,
                "zero",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","prefix":"-x"}"#,
                "prefix",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","warn_age_secs":100,"crit_age_secs":100}"#,
                "must be less than",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","crit_age_secs":1}"#,
                "no room",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","warn_age_secs":0}"#,
                "out of range",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","space_prune_percent":100}"#,
                "space_prune_percent",
            ),
            (
                br#"{"version":1,"volumes":[1],"schedule":"hourly","retention":"daily=1","space_prune_percent":300}"#,
                "malformed",
            ),
            (
                br#"{"version":1,"volumes":[-1],"schedule":"hourly","retention":"daily=1"}"#,
                "malformed",
            ),
        ];
        for (bytes, want) in cases {
            let err = Policy::decode(bytes).unwrap_err().to_string();
            assert!(
                err.to_lowercase().contains(&want.to_lowercase()),
                "{}: {err}",
                String::from_utf8_lossy(bytes)
            );
        }
        let vols: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        let many = format!(
            r#"{{"version":1,"volumes":[{}],"schedule":"hourly","retention":"daily=1"}}"#,
            vols.join(",")
        );
        assert!(Policy::decode(many.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("at most 64"));
        let huge = vec![b' '; MAX_POLICY_BYTES + 1];
        assert_eq!(
            Policy::decode(&huge),
            Err(PolicyError::TooLarge {
                len: MAX_POLICY_BYTES + 1,
                max: MAX_POLICY_BYTES
            })
        );
    }

    #[test]
    fn ages_derive_from_schedule() {
        let mut p = sample();
        assert_eq!(p.ages(), (2 * HOUR, 4 * HOUR));
        p.schedule = "daily".parse().unwrap();
        assert_eq!(p.ages(), (2 * DAY, 4 * DAY));
        p.schedule = "weekly".parse().unwrap();
        assert_eq!(p.ages(), (14 * DAY, 28 * DAY));
        p.schedule = "monthly".parse().unwrap();
        assert_eq!(p.ages(), (62 * DAY, 124 * DAY));
        p.schedule = "every 90s".parse().unwrap();
        assert_eq!(p.ages(), (180, 360));
        p.warn_age_secs = Some(1_000);
        assert_eq!(p.ages(), (1_000, 2_000));
        p.warn_age_secs = None;
        p.crit_age_secs = Some(100);
        assert_eq!(p.ages(), (50, 100));
        assert!(p.validate().is_ok());
    }

    #[test]
    fn largest_valid_policy_fits() {
        let mut p = Policy::new(
            (u64::MAX - 63..=u64::MAX).collect(),
            "weekly on wed at 23:59".parse().unwrap(),
            std::iter::repeat_n("99999x1s(keep=99999)", 16)
                .collect::<Vec<_>>()
                .join(" | ")
                .parse()
                .unwrap(),
        );
        p.prefix = "p".repeat(32);
        p.warn_age_secs = Some(MAX_AGE_SECS - 1);
        p.crit_age_secs = Some(MAX_AGE_SECS);
        p.space_prune_percent = Some(99);
        let bytes = p.encode();
        assert!(bytes.len() <= MAX_POLICY_BYTES, "{}", bytes.len());
        assert_eq!(Policy::decode(&bytes), Ok(p));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Policy::decode(&bytes);
        }

        #[test]
        fn decode_json_like_never_panics(s in r#"\{("[a-z_]{1,12}":(1|"[a-z0-9 :=|()]{0,20}"|\[[0-9,]{0,10}\]|null|[0-9]{1,25}),?){0,8}\}"#) {
            let _ = Policy::decode(s.as_bytes());
        }
    }
}
