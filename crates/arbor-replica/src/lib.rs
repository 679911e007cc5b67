//! Replication between hosts (docs/REPLICATION.md): a source sends the
//! snapshots a target lacks as delta streams (`arbor-stream`), over one
//! session per cycle on a mutually authenticated TLS connection.

pub mod heal;
pub mod local;
pub mod plan;
pub mod proto;
pub mod session;
pub mod source;
pub mod state;
pub mod target;
