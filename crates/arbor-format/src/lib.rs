//! arbor on-disk format (in progress).
