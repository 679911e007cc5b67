//! Volume naming, following ZFS conventions: `vm1` is a volume, `vm1@monday`
//! a snapshot of it.
//!
//! The one length rule: a record's full name (`vol@snap`, or a hidden
//! record's `…%…` name) holds at most [`MAX_NAME_LEN`] bytes (the format's
//! field). A *new* volume name holds at most [`MAX_VOLUME_NAME_LEN`] bytes,
//! which leaves room for `@` and the longest snapshot name arbor generates
//! itself ([`MAX_GENERATED_SNAPSHOT_LEN`]): every replication and policy
//! snapshot of every volume fits. Names given by an older version, longer
//! than that, stay readable, writable, renamable and destroyable; only new
//! names are held to the rule.

use arbor_format::MAX_NAME_LEN;

use crate::error::{Error, Refusal, Result};

/// The longest snapshot part (after `@`) arbor generates itself, in bytes:
/// a policy snapshot `{prefix}-YYYY-MM-DDTHH:MM:SSZ.NNN` (a prefix of at
/// most 32 bytes, 20 of time, `.999` at most: 57). Replication's
/// `repl-YYYY-MM-DDTHH:MM:SSZ.N` is 36 at most (N a `u32`). The monitor
/// and replication check at compile time that their names fit.
pub const MAX_GENERATED_SNAPSHOT_LEN: usize = 57;

/// The longest new volume name, in bytes (126): `{volume}@{snapshot}` with
/// any generated snapshot part still fits [`MAX_NAME_LEN`] (184), and so
/// does a receive's hidden `{volume}%recv`.
pub const MAX_VOLUME_NAME_LEN: usize = MAX_NAME_LEN - 1 - MAX_GENERATED_SNAPSHOT_LEN;

/// The longest hidden record name prefix of a hold: `{snapshot id}%hold%`,
/// the id a `u64` of up to 20 digits.
const HOLD_RECORD_PREFIX_LEN: usize = 20 + "%hold%".len();

/// The longest hold tag, in bytes (158): the hold's hidden record name
/// `{snapshot id}%hold%{tag}` fits [`MAX_NAME_LEN`].
pub const MAX_HOLD_TAG_LEN: usize = MAX_NAME_LEN - HOLD_RECORD_PREFIX_LEN;

// A receive's hidden record `{volume}%recv` fits wherever a snapshot does.
const _: () = assert!("%recv".len() <= 1 + MAX_GENERATED_SNAPSHOT_LEN);

fn invalid(name: &str, reason: impl Into<String>) -> Error {
    Refusal::InvalidName {
        name: name.to_owned(),
        reason: reason.into(),
    }
    .into()
}

fn check_component(full: &str, part: &str) -> Result<()> {
    let Some(first) = part.chars().next() else {
        return Err(invalid(full, "empty name component"));
    };
    if !first.is_ascii_alphanumeric() {
        return Err(invalid(full, "must start with a letter or digit"));
    }
    if !part.chars().all(is_name_char) {
        return Err(invalid(
            full,
            "only letters, digits, '-', '_', '.' and ':' are allowed",
        ));
    }
    Ok(())
}

/// Whether `c` may appear in a name (or a hold tag): letters, digits and
/// `- _ . :`.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

fn check_len(name: &str) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(
            name,
            format!("longer than {MAX_NAME_LEN} bytes, the most a full name may have"),
        ));
    }
    Ok(())
}

/// Validates a new volume name (no `@`): at most [`MAX_VOLUME_NAME_LEN`]
/// bytes, so that every snapshot arbor generates of it has a valid name.
pub fn check_volume_name(name: &str) -> Result<()> {
    if name.len() > MAX_VOLUME_NAME_LEN {
        return Err(invalid(
            name,
            format!(
                "{} bytes: a volume name has at most {MAX_VOLUME_NAME_LEN}, leaving room in \
                 a full name's {MAX_NAME_LEN} for '@' and the {MAX_GENERATED_SNAPSHOT_LEN}-byte \
                 snapshot names arbor generates (replication, policies); rename a longer one \
                 an older version allowed",
                name.len()
            ),
        ));
    }
    check_existing_volume_name(name)
}

/// Validates the name of a volume that may already exist (no `@`): the
/// characters, and at most [`MAX_NAME_LEN`] bytes, as older versions
/// allowed. New names go through [`check_volume_name`].
pub fn check_existing_volume_name(name: &str) -> Result<()> {
    check_len(name)?;
    check_component(name, name)
}

/// Validates a hold tag: a name's characters, at most
/// [`MAX_HOLD_TAG_LEN`] bytes.
pub fn check_hold_tag(tag: &str) -> Result<()> {
    if tag.len() > MAX_HOLD_TAG_LEN {
        return Err(invalid(
            tag,
            format!(
                "a hold tag has at most {MAX_HOLD_TAG_LEN} bytes (its record's name \
                 `{{snapshot id}}%hold%{{tag}}` has at most {MAX_NAME_LEN})"
            ),
        ));
    }
    check_component(tag, tag)
}

/// Splits and validates a snapshot name `volume@snapshot`.
pub fn split_snapshot_name(name: &str) -> Result<(&str, &str)> {
    check_len(name)?;
    let Some((volume, snap)) = name.split_once('@') else {
        return Err(invalid(
            name,
            "a snapshot name has the form volume@snapshot",
        ));
    };
    check_component(name, volume)?;
    check_component(name, snap)?;
    Ok((volume, snap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_volume_name("vm1").is_ok());
        assert!(check_volume_name("db-prod_2.img:x").is_ok());
        assert!(check_volume_name("").is_err());
        assert!(check_volume_name("-x").is_err());
        assert!(check_volume_name("a@b").is_err());
        assert!(check_volume_name("a/b").is_err());
        assert!(check_volume_name(&"a".repeat(185)).is_err());
        assert!(check_volume_name(&"a".repeat(MAX_VOLUME_NAME_LEN)).is_ok());
        assert!(check_volume_name(&"a".repeat(MAX_VOLUME_NAME_LEN + 1)).is_err());
        assert!(check_existing_volume_name(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert!(check_existing_volume_name(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(check_hold_tag(&"a".repeat(MAX_HOLD_TAG_LEN)).is_ok());
        assert!(check_hold_tag(&"a".repeat(MAX_HOLD_TAG_LEN + 1)).is_err());
        assert!(check_hold_tag("bad tag").is_err());
        assert_eq!(
            (MAX_VOLUME_NAME_LEN, MAX_HOLD_TAG_LEN),
            (126, 158),
            "docs/CLI.md states these numbers"
        );
        assert_eq!(
            split_snapshot_name("vm1@monday").unwrap(),
            ("vm1", "monday")
        );
        assert!(split_snapshot_name("vm1").is_err());
        assert!(split_snapshot_name("vm1@a@b").is_err());
        assert!(split_snapshot_name("@a").is_err());
    }
}
