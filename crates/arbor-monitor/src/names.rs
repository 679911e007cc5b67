//! Names of policy snapshots.
//!
//! A policy snapshot is named `{prefix}-{YYYY}-{MM}-{DD}T{HH}:{MM}:{SS}Z`
//! after its UTC creation time, e.g. `auto-2026-11-24T04:00:00Z`. When two
//! runs fall in the same second the later one gets a `.N` suffix
//! (`auto-2026-11-24T04:00:00Z.1`, N = 1..=[`MAX_SUFFIX`]).
//!
//! These are names of the *snapshot part* only (what follows `volume@`);
//! callers strip the volume. Snapshot names may only use
//! `[A-Za-z0-9._:-]` and must start with a letter or digit; the prefix must
//! itself be such a word of at most [`MAX_PREFIX_LEN`] bytes.

use crate::civil::{self, Civil};
use crate::error::PolicyError;

/// The prefix used when a policy names none.
pub const DEFAULT_PREFIX: &str = "auto";
/// Longest prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 32;
/// Largest `.N` collision suffix.
pub const MAX_SUFFIX: u32 = 999;
/// Latest time a name can express: 9999-12-31T23:59:59Z. Later times are
/// clamped to it by [`snapshot_name`].
pub const MAX_NAME_TIME: u64 = 253_402_300_799;
/// Length of the `YYYY-MM-DDTHH:MM:SSZ` part.
const STAMP_LEN: usize = 20;
/// Longest policy snapshot name (the snapshot part), in bytes: the
/// longest prefix, `-`, the time and `.999`. New volume names leave room
/// for it (`arbor_engine::MAX_VOLUME_NAME_LEN`).
pub const MAX_SNAPSHOT_NAME_LEN: usize = MAX_PREFIX_LEN + 1 + STAMP_LEN + ".999".len();
const _: () = assert!(MAX_SUFFIX == 999);
const _: () = assert!(MAX_SNAPSHOT_NAME_LEN <= arbor_engine::MAX_GENERATED_SNAPSHOT_LEN);

/// Whether `c` may appear in a snapshot name: the engine's name rule.
pub use arbor_engine::is_name_char;

/// Checks that `prefix` is a valid name prefix: 1..=[`MAX_PREFIX_LEN`]
/// bytes of `[A-Za-z0-9._:-]`, starting with a letter or digit.
pub fn validate_prefix(prefix: &str) -> Result<(), PolicyError> {
    let err = |why: &str| PolicyError::Prefix(format!("{prefix:?}: {why}"));
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(err("longer than 32 bytes"));
    }
    let Some(first) = prefix.chars().next() else {
        return Err(err("empty"));
    };
    if !first.is_ascii_alphanumeric() {
        return Err(err("must start with a letter or digit"));
    }
    if !prefix.chars().all(is_name_char) {
        return Err(err(
            "only letters, digits, '-', '_', '.' and ':' are allowed",
        ));
    }
    Ok(())
}

/// The name of a policy snapshot taken at Unix time `t` (UTC), e.g.
/// `auto-2026-11-24T04:00:00Z`. `t` beyond [`MAX_NAME_TIME`] is clamped to
/// it. The prefix is used as given; check it with [`validate_prefix`].
pub fn snapshot_name(prefix: &str, t: u64) -> String {
    let c = civil::from_unix(t.min(MAX_NAME_TIME));
    format!(
        "{prefix}-{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Parses exactly `digits` ASCII digits.
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The UTC creation time encoded in a policy snapshot name (the snapshot
/// part, without `volume@`), or `None` unless `name` is exactly
/// `{prefix}-YYYY-MM-DDTHH:MM:SSZ` with a real calendar time, optionally
/// followed by `.N` (N = 1..=[`MAX_SUFFIX`], no leading zeros).
pub fn parse(prefix: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let stamp = rest.get(..STAMP_LEN)?;
    let suffix = rest.get(STAMP_LEN..)?;
    if !suffix.is_empty() {
        let n = suffix.strip_prefix('.')?;
        if n.len() > 3 || n.starts_with('0') || !(1..=MAX_SUFFIX).contains(&digits(n)?) {
            return None;
        }
    }
    let b = stamp.as_bytes();
    let seps = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'Z'),
    ];
    if seps.iter().any(|&(i, c)| b.get(i) != Some(&c)) {
        return None;
    }
    let field = |from: usize, to: usize| stamp.get(from..to).and_then(digits);
    let c = Civil {
        year: i64::from(field(0, 4)?),
        month: field(5, 7)?,
        day: field(8, 10)?,
        hour: field(11, 13)?,
        minute: field(14, 16)?,
        second: field(17, 19)?,
    };
    civil::to_unix(c)
}

/// The first name not `taken` among `base`, `base.1`, ... `base.999`,
/// where `base = snapshot_name(prefix, t)`; `None` if all are taken.
pub fn unique(prefix: &str, t: u64, taken: impl Fn(&str) -> bool) -> Option<String> {
    let base = snapshot_name(prefix, t);
    if !taken(&base) {
        return Some(base);
    }
    (1..=MAX_SUFFIX)
        .map(|n| format!("{base}.{n}"))
        .find(|name| !taken(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_795_492_800;

    #[test]
    fn formats_and_parses() {
        assert_eq!(snapshot_name("auto", T0), "auto-2026-11-24T04:00:00Z");
        assert_eq!(snapshot_name("auto", 0), "auto-1970-01-01T00:00:00Z");
        assert_eq!(snapshot_name("x", u64::MAX), "x-9999-12-31T23:59:59Z");
        assert_eq!(parse("auto", "auto-2026-11-24T04:00:00Z"), Some(T0));
        assert_eq!(parse("auto", "auto-2026-11-24T04:00:00Z.1"), Some(T0));
        assert_eq!(parse("auto", "auto-2026-11-24T04:00:00Z.999"), Some(T0));
        assert_eq!(parse("a-b", "a-b-2026-11-24T04:00:00Z"), Some(T0));
    }

    #[test]
    fn rejects_near_misses() {
        for bad in [
            "auto-2026-11-24T04:00:00",
            "auto-2026-11-24T04:00:00Z.0",
            "auto-2026-11-24T04:00:00Z.01",
            "auto-2026-11-24T04:00:00Z.1000",
            "auto-2026-11-24T04:00:00Z.",
            "auto-2026-11-24T04:00:00Z.x",
            "auto-2026-11-24T04:00:00Zx",
            "auto-2026-11-24 04:00:00Z",
            "auto-2026-13-24T04:00:00Z",
            "auto-2026-02-29T04:00:00Z",
            "auto-2026-11-31T04:00:00Z",
            "auto-2026-11-24T24:00:00Z",
            "auto-2026-11-24T04:60:00Z",
            "auto-2026-11-24T04:00:60Z",
            "auto-1969-12-31T23:59:59Z",
            "auto-+026-11-24T04:00:00Z",
            "auto-2026-1-124T04:00:00Z",
            "other-2026-11-24T04:00:00Z",
            "auto2026-11-24T04:00:00Z",
            "vm@auto-2026-11-24T04:00:00Z",
            "auto-2026-11-24T04:00:00Zé",
            "auto-",
            "",
        ] {
            assert_eq!(parse("auto", bad), None, "{bad:?}");
        }
        assert_eq!(
            parse("auto", "auto-2024-02-29T00:00:00Z"),
            Some(1_709_164_800)
        );
    }

    #[test]
    fn unique_picks_first_free() {
        let base = snapshot_name("auto", T0);
        assert_eq!(unique("auto", T0, |_| false), Some(base.clone()));
        let taken = [base.clone(), format!("{base}.1")];
        assert_eq!(
            unique("auto", T0, |n| taken.iter().any(|t| t == n)),
            Some(format!("{base}.2"))
        );
        assert_eq!(unique("auto", T0, |_| true), None);
    }

    #[test]
    fn the_longest_name_is_as_long_as_said() {
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        let last = unique(&prefix, MAX_NAME_TIME, |n| !n.ends_with(".999")).unwrap();
        assert_eq!(last.len(), MAX_SNAPSHOT_NAME_LEN);
    }

    #[test]
    fn prefixes() {
        assert!(validate_prefix("auto").is_ok());
        assert!(validate_prefix("hourly.v2:x_y-z").is_ok());
        assert!(validate_prefix(&"a".repeat(32)).is_ok());
        assert!(validate_prefix(&"a".repeat(33)).is_err());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("-auto").is_err());
        assert!(validate_prefix("au to").is_err());
        assert!(validate_prefix("au@to").is_err());
        assert!(validate_prefix("autó").is_err());
    }

    proptest! {
        #[test]
        fn round_trip(t in 0u64..=MAX_NAME_TIME, prefix in "[a-z0-9][a-z0-9._:-]{0,31}", n in 0u32..=MAX_SUFFIX) {
            let name = snapshot_name(&prefix, t);
            prop_assert!(name.chars().all(is_name_char));
            prop_assert_eq!(parse(&prefix, &name), Some(t));
            let suffixed = if n == 0 { name } else { format!("{name}.{n}") };
            prop_assert_eq!(parse(&prefix, &suffixed), Some(t));
        }

        #[test]
        fn parse_never_panics(name in "\\PC{0,64}") {
            let _ = parse("auto", &name);
        }

        #[test]
        fn names_sort_by_time(a in 0u64..=MAX_NAME_TIME, b in 0u64..=MAX_NAME_TIME) {
            prop_assert_eq!(a.cmp(&b), snapshot_name("p", a).cmp(&snapshot_name("p", b)));
        }
    }
}
