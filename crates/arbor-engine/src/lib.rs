//! arbor storage engine (in progress).
