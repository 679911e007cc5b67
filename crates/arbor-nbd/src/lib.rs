//! NBD protocol crate (in progress).
