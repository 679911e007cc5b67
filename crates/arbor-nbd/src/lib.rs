//! NBD server library for arbor (see README.md for the feature list, limits,
//! error mapping and concurrency model).

pub mod dispatch;
pub mod export;
pub mod handshake;
pub mod memory;
pub mod proto;
pub mod transmission;

pub use export::{Export, ExportError, ExportListing, ExportProvider, StatusRun};
