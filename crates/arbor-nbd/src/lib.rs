//! NBD server library for arbor (see README.md for the feature list, limits,
//! error mapping and concurrency model).
//!
//! Layers, bottom up:
//! * [`proto`], [`handshake`], [`transmission`]: the protocol, sans I/O;
//! * [`access`]: who a client is and which exports it may see, read, write;
//!   [`live`]: a listener's security replaced while it serves, closing
//!   the sessions it no longer grants;
//! * [`export`]: the blocking [`Export`] / [`ExportProvider`] traits served;
//! * [`dispatch`]: runs one validated command against an export;
//! * [`qos`]: rate limits on an export's requests (token buckets);
//! * [`buffers`]: recycled buffers for large payloads and read replies;
//! * `connection`, [`server`]: the tokio server ([`serve`]).

pub mod access;
pub mod buffers;
mod connection;
pub mod dispatch;
pub mod export;
pub mod handshake;
pub mod live;
pub mod memory;
pub mod poll;
pub mod proto;
pub mod qos;
pub mod server;
pub mod transmission;

pub use access::{Access, AccessList, Client, Pattern, Principal, Rule};
pub use connection::{NoCertificates, Security};
pub use export::{Export, ExportError, ExportListing, ExportProvider, StatusRun};
pub use handshake::TlsMode;
pub use live::{Closed, LiveSecurity};
pub use poll::PollLimits;
pub use server::{serve, Listener, ServerConfig, DEFAULT_TCP_ADDR};
pub use tokio_util::sync::CancellationToken;
