//! The snapshot monitor's policy layer: pure, sans-I/O decision logic.
//!
//! A snapshot *policy* says which volumes are snapshotted, when
//! ([`schedule::Schedule`]), under which names ([`names`]), and how many of
//! those snapshots are kept ([`retention::Retention`]). This crate turns a
//! policy plus a description of the current state into decisions:
//!
//! * [`schedule::Schedule::due`] / [`schedule::Schedule::next_run`] — is a
//!   snapshot due now, and when should the daemon wake up next;
//! * [`names::snapshot_name`] / [`names::unique`] — what to call it;
//! * [`prune::plan`] / [`prune::space_aware`] — which policy snapshots to
//!   destroy, and why every other snapshot is kept;
//! * [`tick`] — one policy's turn of a monitor tick as a plan: the group
//!   snapshot due now and its name, whether it prunes, each volume's
//!   prune plan; and the outcome of the plan the daemon carried out;
//! * [`listing::Listing`] — the pool's volumes and snapshots from one
//!   listing: a policy's snapshots and its last run;
//! * [`policy::Policy`] — the versioned, size-bounded JSON encoding of a
//!   policy, with validation;
//! * [`scrub`] — the pool's scrub schedule: its stored form, and whether
//!   a scrub starts now.
//!
//! Nothing here but [`engine`] performs I/O or depends on the engine, and
//! nothing reads a clock. Every
//! time-dependent function takes `now` as Unix seconds (UTC), so tests drive
//! the logic with a fake clock. The daemon above this layer supplies the
//! clock, the snapshot lists (creation times, holds, replication needs,
//! exclusive sizes, read through [`engine`]) and pool usage, and carries
//! out the snapshots and destroys this layer plans.
//!
//! All functions are total: they never panic, whatever the input, and all
//! untrusted numbers are handled with checked or saturating arithmetic.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod civil;
mod duration;
pub mod engine;
pub mod error;
pub mod listing;
pub mod names;
pub mod policy;
pub mod prune;
pub mod retention;
pub mod schedule;
pub mod scrub;
pub mod tick;

pub use error::PolicyError;
pub use policy::Policy;
pub use prune::{Candidate, Decision, Newest, PrunePlan, Reason};
pub use retention::{GridInterval, Keep, Retention};
pub use schedule::Schedule;
