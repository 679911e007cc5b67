//! Interoperability tests: the server in-process, real NBD clients
//! (libnbd's nbdinfo/nbdcopy and Python bindings, qemu-img, qemu-io) and
//! raw sockets as subprocesses or peers.

mod common;
mod copy;
mod extended;
mod libnbd;
mod nbdinfo;
mod raw;
