//! The error type of this crate.

use thiserror::Error;

/// Why a schedule, retention rule, name prefix or encoded policy was
/// rejected. Every variant carries a message meant for the operator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A schedule string or value is malformed or out of range.
    #[error("invalid schedule: {0}")]
    Schedule(String),
    /// A retention string or value is malformed or out of range.
    #[error("invalid retention: {0}")]
    Retention(String),
    /// A snapshot name prefix is not a valid name word.
    #[error("invalid snapshot name prefix: {0}")]
    Prefix(String),
    /// An encoded policy is larger than [`crate::policy::MAX_POLICY_BYTES`].
    #[error("policy is {len} bytes, more than the limit of {max} bytes")]
    TooLarge {
        /// Size of the rejected encoding.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An encoded policy has a version this build does not understand.
    #[error("unsupported policy version {found} (this build understands version {supported})")]
    UnsupportedVersion {
        /// The version found in the encoding.
        found: u64,
        /// The only version this build reads.
        supported: u32,
    },
    /// An encoded policy is not well-formed JSON of the expected shape.
    #[error("malformed policy: {0}")]
    Malformed(String),
    /// A policy is well-formed but its values are inconsistent or out of
    /// range.
    #[error("invalid policy: {0}")]
    Invalid(String),
}
