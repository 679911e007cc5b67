//! Interoperability tests: the server in-process, real NBD clients
//! (libnbd's nbdinfo/nbdcopy and Python bindings, qemu-img, qemu-io) and
//! raw sockets as subprocesses or peers.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod copy;
mod extended;
mod libnbd;
mod nbdinfo;
mod raw;
