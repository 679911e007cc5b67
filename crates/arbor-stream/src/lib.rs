//! arbor's snapshot delta streams: the format (sans-I/O) and, over the
//! engine, send and receive.
//!
//! [`format`](mod@format) is the wire format of `arbor send` / `arbor receive`, version
//! [`format::FORMAT_VERSION`], as a codec that does no I/O: an
//! [`format::Encoder`] appends records to a byte buffer, a
//! [`format::Decoder`] takes bytes as they arrive and hands back records
//! only once they are fully verified. `docs/STREAM.md` describes the same
//! format in prose, exactly enough to write a second reader.

pub mod format;

pub mod busy;
mod failure;
pub mod heal;
pub mod rbd;
pub mod receive;
pub mod send;

pub use failure::StreamFailure;
