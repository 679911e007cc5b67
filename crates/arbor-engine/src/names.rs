//! Volume naming, following ZFS conventions: `vm1` is a volume, `vm1@monday`
//! a snapshot of it.

use arbor_format::MAX_NAME_LEN;

use crate::error::{Error, Result};

fn invalid(name: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        name: name.to_owned(),
        reason,
    }
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
        return Err(invalid(name, "longer than 184 bytes"));
    }
    Ok(())
}

/// Validates a volume name (no `@`).
pub fn check_volume_name(name: &str) -> Result<()> {
    check_len(name)?;
    check_component(name, name)
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
        assert_eq!(
            split_snapshot_name("vm1@monday").unwrap(),
            ("vm1", "monday")
        );
        assert!(split_snapshot_name("vm1").is_err());
        assert!(split_snapshot_name("vm1@a@b").is_err());
        assert!(split_snapshot_name("@a").is_err());
    }
}
