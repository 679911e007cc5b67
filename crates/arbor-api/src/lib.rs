//! arbor's control API as a library, for any client of a daemon (the
//! `arbor` command line, a control plane): the request and response
//! model (`model`, serde only), the error codes (`error_code`), sizes as
//! the API writes them (`size`), the token form (`token`), and a
//! blocking HTTP client (`client` over `endpoint`: the data directory's
//! Unix socket, or TCP with TLS and a token). It knows nothing of the
//! daemon or the engine.

pub mod client;
pub mod endpoint;
pub mod error;
pub mod error_code;
pub mod model;
pub mod size;
pub mod token;
