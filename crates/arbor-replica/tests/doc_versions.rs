//! Ties the version numbers the documents state to the code's: the pool
//! format (`arbor_format::FORMAT_VERSION`, `OLDEST_FORMAT_VERSION`), the
//! send stream (`arbor_stream::format::FORMAT_VERSION`), and replication's
//! session protocol and state file. Each sentence below must be in its
//! document (whitespace as in the text, line breaks included, counts as one
//! space) with the code's number: a version bump that leaves a document
//! behind, or a document that names another version, fails here. (The
//! format's tables are checked by crates/arbor-format/tests/golden.rs.)
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_format::{FORMAT_VERSION as POOL, OLDEST_FORMAT_VERSION as OLDEST};
use arbor_replica::proto::PROTOCOL_VERSION;
use arbor_replica::state::STATE_VERSION;
use arbor_stream::format::FORMAT_VERSION as STREAM;

/// `file` (from the repository's root), its whitespace runs made single
/// spaces.
fn doc(file: &str) -> String {
    let path = format!("{}/../../{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every sentence in `says` is in `file`; else the failure shows what the
/// document says where the sentence starts.
fn check(file: &str, says: &[String]) {
    let text = doc(file);
    let wrong: Vec<String> = says
        .iter()
        .filter(|s| !text.contains(s.as_str()))
        .map(|s| {
            let lead = s.split(|c: char| c.is_ascii_digit()).next().unwrap_or(s);
            let found = text.find(lead).map(|at| {
                text[at..]
                    .chars()
                    .take(s.chars().count() + 16)
                    .collect::<String>()
            });
            format!("  should say {s:?}; says {found:?}")
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{file} disagrees with the code's versions:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn documents_state_the_codes_version_numbers() {
    check(
        "README.md",
        &[
            format!("the on-disk format (version {POOL})"),
            format!("`pool upgrade` makes an older pool version {POOL}"),
        ],
    );
    check(
        "docs/FORMAT.md",
        &[
            format!("# arbor on-disk format, version {POOL}"),
            format!("arbor reads and writes versions {OLDEST} to {POOL}."),
            format!("New pools are version {POOL}."),
        ],
    );
    check(
        "docs/CLI.md",
        &[
            format!("converts an older pool to the newest format version ({POOL})"),
            format!("Nothing to do for a version {POOL} pool"),
            format!("`--format-version`: {OLDEST} to {POOL} (default {POOL}, the newest)"),
        ],
    );
    check(
        "docs/STREAM.md",
        &[
            format!("# arbor send stream, version {STREAM}"),
            format!("stream format version: {STREAM}"),
        ],
    );
    check(
        "docs/REPLICATION.md",
        &[
            format!("## Session protocol, version {PROTOCOL_VERSION}"),
            format!("## State file, version {STATE_VERSION}"),
        ],
    );
}
