//! What a cycle does, decided from the two sides' snapshot lists alone (no
//! I/O): which snapshot both sides share, whether the target diverged, and
//! which streams bring the target up to date.

use arbor_stream::format::Guid;

use crate::proto::{Hello, Refusal, RefusalCode};

/// One of the target volume's snapshots, oldest first in [`Local`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalSnapshot {
    pub guid: Guid,
    pub name: String,
}

/// The target volume as the target sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    /// No such volume: a full stream creates it.
    Absent,
    Volume {
        /// Its snapshots, oldest first.
        snapshots: Vec<LocalSnapshot>,
        /// Written since its newest snapshot (or never snapshotted).
        written: bool,
    },
}

/// What the target does before answering a hello.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// The newest snapshot both sides have.
    pub common: Option<Guid>,
    /// Snapshots of the target's own, after the common one, that a forced
    /// resync deletes (newest first).
    pub delete: Vec<String>,
    /// The snapshot a forced resync rolls the volume back to.
    pub roll_back_to: Option<String>,
}

/// Most snapshot names a divergence message lists.
const LISTED: usize = 5;

fn listing(names: &[&str]) -> String {
    let mut text = names
        .iter()
        .take(LISTED)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > LISTED {
        text += &format!(" and {} more", names.len() - LISTED);
    }
    text
}

/// The target's decision on `hello` for its volume `local`.
pub fn decide(hello: &Hello, local: &Local) -> Result<Decision, Refusal> {
    let refuse = |code, message: String| Refusal { code, message };
    let (snapshots, written) = match local {
        Local::Absent if hello.seeded => {
            return Err(refuse(
                RefusalCode::Diverged,
                format!(
                    "{} does not exist here, but the source says it was seeded by hand: \
                     receive the seed stream here first, or add the replica without --seeded",
                    hello.volume
                ),
            ))
        }
        Local::Absent => return Ok(Decision::default()),
        Local::Volume { snapshots, written } => (snapshots, *written),
    };
    let theirs: std::collections::HashSet<Guid> =
        hello.snapshots.iter().map(|s| s.guid.0).collect();
    let common_at = snapshots.iter().rposition(|s| theirs.contains(&s.guid));
    let Some(at) = common_at else {
        return Err(refuse(
            RefusalCode::Diverged,
            format!(
                "{} exists here and shares no snapshot with the source: it is not a copy of \
                 the source's volume (delete it here to seed it afresh)",
                hello.volume
            ),
        ));
    };
    let common = &snapshots[at];
    let ours: Vec<&str> = snapshots[at + 1..]
        .iter()
        .rev()
        .map(|s| s.name.as_str())
        .collect();
    if ours.is_empty() && !written {
        return Ok(Decision {
            common: Some(common.guid),
            ..Decision::default()
        });
    }
    if !hello.force {
        let mut what = Vec::new();
        if !ours.is_empty() {
            what.push(format!(
                "snapshots not from its source ({})",
                listing(&ours)
            ));
        }
        if written {
            what.push(format!(
                "writes since {}",
                snapshots.last().map_or("its creation", |s| s.name.as_str())
            ));
        }
        return Err(refuse(
            RefusalCode::Diverged,
            format!(
                "{} diverged from its source: it has {}; `arbor replica resync {} --force` at \
                 the source rolls it back to {}, discarding them",
                hello.volume,
                what.join(" and "),
                hello.volume,
                common.name
            ),
        ));
    }
    Ok(Decision {
        common: Some(common.guid),
        delete: ours.iter().map(|s| s.to_string()).collect(),
        roll_back_to: Some(common.name.clone()),
    })
}

/// One stream of a cycle: `target`, as a delta against `base` (a full
/// stream without).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub target: Guid,
    pub base: Option<Guid>,
}

/// The streams that bring a target whose newest shared snapshot is
/// `common` up to the source's newest, given the source's snapshots oldest
/// first: every snapshot after the common one, each against the one
/// before (so the target keeps the same history); without a common one,
/// the newest snapshot in full. None if `common` is not the source's.
pub fn steps(source: &[Guid], common: Option<Guid>) -> Option<Vec<Step>> {
    let Some(common) = common else {
        return Some(
            source
                .last()
                .map(|&target| Step { target, base: None })
                .into_iter()
                .collect(),
        );
    };
    let at = source.iter().position(|&g| g == common)?;
    Some(
        source[at..]
            .windows(2)
            .map(|w| Step {
                target: w[1],
                base: Some(w[0]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{SnapshotEntry, WireGuid};
    use proptest::prelude::*;

    fn g(n: u8) -> Guid {
        Guid([n; 16])
    }

    fn hello(source: &[u8], force: bool) -> Hello {
        Hello {
            volume: "vm1".into(),
            snapshots: source
                .iter()
                .rev()
                .map(|&n| SnapshotEntry {
                    guid: WireGuid(g(n)),
                    name: format!("vm1@s{n}"),
                    created: 0,
                })
                .collect(),
            path: vec!["a".into()],
            seeded: false,
            force,
            heal: false,
        }
    }

    fn local(snaps: &[u8], written: bool) -> Local {
        Local::Volume {
            snapshots: snaps
                .iter()
                .map(|&n| LocalSnapshot {
                    guid: g(n),
                    name: format!("vm1@s{n}"),
                })
                .collect(),
            written,
        }
    }

    #[test]
    fn a_target_behind_gets_every_missing_snapshot_in_order() {
        let d = decide(&hello(&[1, 2, 3, 4], false), &local(&[1, 2], false)).unwrap();
        assert_eq!(d.common, Some(g(2)));
        assert!(d.delete.is_empty() && d.roll_back_to.is_none());
        let s = steps(&[g(1), g(2), g(3), g(4)], d.common).unwrap();
        assert_eq!(
            s,
            vec![
                Step {
                    target: g(3),
                    base: Some(g(2))
                },
                Step {
                    target: g(4),
                    base: Some(g(3))
                }
            ]
        );
        assert_eq!(steps(&[g(1), g(2)], Some(g(2))).unwrap(), vec![]);
        assert_eq!(
            steps(&[g(1), g(2)], None).unwrap(),
            vec![Step {
                target: g(2),
                base: None
            }]
        );
        assert_eq!(steps(&[g(1)], Some(g(9))), None);
    }

    #[test]
    fn divergence_is_refused_unless_forced_and_then_rolled_back() {
        let err = decide(&hello(&[1, 2, 3], false), &local(&[1, 2, 7], true)).unwrap_err();
        assert_eq!(err.code, RefusalCode::Diverged);
        assert!(err.message.contains("vm1@s7") && err.message.contains("writes since"));
        assert!(
            err.message.contains("resync vm1 --force"),
            "{}",
            err.message
        );
        let d = decide(&hello(&[1, 2, 3], true), &local(&[1, 2, 7, 8], true)).unwrap();
        assert_eq!(d.common, Some(g(2)));
        assert_eq!(d.delete, vec!["vm1@s8", "vm1@s7"]);
        assert_eq!(d.roll_back_to.as_deref(), Some("vm1@s2"));
        // Writes alone diverge too.
        assert!(decide(&hello(&[1], false), &local(&[1], true)).is_err());
    }

    #[test]
    fn unrelated_volumes_and_missing_seeds_are_refused_even_forced() {
        assert!(decide(&hello(&[1, 2], true), &local(&[5], false)).is_err());
        assert!(decide(&hello(&[1, 2], true), &local(&[], true)).is_err());
        let mut seeded = hello(&[1], false);
        seeded.seeded = true;
        assert!(decide(&seeded, &Local::Absent).is_err());
        assert_eq!(
            decide(&hello(&[1], false), &Local::Absent).unwrap(),
            Decision::default()
        );
    }

    proptest! {
        /// Whatever the two histories, a target that is a prefix of the
        /// source is never refused, a decision's common snapshot is on
        /// both sides and the newest such, and applying the steps leaves
        /// the target with the source's newest snapshot.
        #[test]
        fn decisions_match_the_histories(
            source in proptest::collection::vec(0u8..40, 1..12),
            take in 0usize..12,
            extra in proptest::collection::vec(40u8..60, 0..3),
            written: bool,
            force: bool,
        ) {
            let mut source = source;
            source.dedup();
            let mut seen = std::collections::HashSet::new();
            source.retain(|n| seen.insert(*n));
            let take = take.min(source.len());
            let mut mine: Vec<u8> = source[..take].to_vec();
            mine.extend(&extra);
            let decision = decide(&hello(&source, force), &local(&mine, written));
            let clean = extra.is_empty() && !written;
            if take == 0 {
                prop_assert!(decision.is_err());
                return Ok(());
            }
            if clean {
                prop_assert!(decision.is_ok());
            }
            if !clean && !force {
                prop_assert!(decision.is_err());
            }
            if let Ok(d) = decision {
                prop_assert_eq!(d.common, Some(g(source[take - 1])));
                prop_assert_eq!(d.delete.len(), extra.len());
                let src: Vec<Guid> = source.iter().map(|&n| g(n)).collect();
                let s = steps(&src, d.common).unwrap();
                let mut have = d.common;
                for step in &s {
                    prop_assert_eq!(step.base, have);
                    have = Some(step.target);
                }
                prop_assert_eq!(have, src.last().copied());
            }
        }
    }
}
