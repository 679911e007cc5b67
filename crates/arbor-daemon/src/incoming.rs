//! What a target's replication listener has in force (its certificates
//! and `replication_allow`) and the sessions running under it, behind one
//! lock: a reload replaces the one and checks the others in a single step,
//! so every session is either checked at its start under the new
//! configuration or found running by the reload and, if it is no longer
//! allowed, withdrawn (its source told why; a receive keeps what it
//! committed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use arbor_replica::proto::{Refusal, RefusalCode};
use arbor_replica::session::Withdrawal;
use arbor_replica::target::{allowing, Allow};
use arbor_tls::Tls;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// A session running from a source, as a reload checks it.
struct Running {
    peer: String,
    volume: String,
    /// The certificates the source presented (none on loopback).
    chain: Vec<CertificateDer<'static>>,
    withdrawal: Withdrawal,
}

struct State {
    tls: Option<Tls>,
    allow: Vec<Allow>,
    /// Counts reloads: a session accepted under the certificates of an
    /// older generation has its chain verified again when it starts.
    generation: u64,
    next_id: u64,
    running: HashMap<u64, Running>,
}

/// The listener's configuration in force and its sessions.
pub struct InForce {
    state: Mutex<State>,
}

/// A session a reload withdrew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withdrawn {
    pub peer: String,
    pub volume: String,
    pub reason: String,
}

/// A session's place among the running, given up when dropped.
pub struct Entered {
    id: u64,
    in_force: Arc<InForce>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.in_force.lock().running.remove(&self.id);
    }
}

/// Why `peer` may not replicate `volume` under `allow` and `tls` (`chain`
/// checked only when `verify_chain`), or None if it may.
fn refused(
    state: &State,
    peer: &str,
    volume: &str,
    chain: &[CertificateDer<'static>],
    verify_chain: bool,
) -> Option<String> {
    if allowing(&state.allow, peer, volume).is_none() {
        return Some(
            "its replication allow list no longer names that source for that volume".into(),
        );
    }
    match &state.tls {
        Some(tls) if verify_chain && !chain.is_empty() => tls
            .verify_peer(chain)
            .err()
            .map(|e| format!("its certificate is no longer trusted: {e}")),
        _ => None,
    }
}

impl InForce {
    pub fn new(tls: Option<Tls>, allow: Vec<Allow>) -> Self {
        Self {
            state: Mutex::new(State {
                tls,
                allow,
                generation: 0,
                next_id: 0,
                running: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is a single assignment or map
        // insert or removal: a poisoned lock still holds whole values.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The certificates in force, and the generation they belong to.
    pub fn tls(&self) -> (Option<Tls>, u64) {
        let state = self.lock();
        (state.tls.clone(), state.generation)
    }

    /// The allow list in force.
    pub fn allow(&self) -> Vec<Allow> {
        self.lock().allow.clone()
    }

    /// Enters a session from `peer` for `volume` (its hello has come),
    /// accepted under the certificates of generation `accepted`: refused
    /// (as the source is told, by `identity`) if the configuration in
    /// force no longer allows it, else withdrawn through `withdrawal` by a
    /// later reload that does not.
    pub fn enter(
        self: &Arc<Self>,
        identity: &str,
        accepted: u64,
        peer: &str,
        volume: &str,
        chain: Vec<CertificateDer<'static>>,
        withdrawal: Withdrawal,
    ) -> Result<Entered, Refusal> {
        let mut state = self.lock();
        let reloaded = state.generation != accepted;
        if let Some(why) = refused(&state, peer, volume, &chain, reloaded) {
            return Err(not_allowed(identity, peer, volume, &why));
        }
        let id = state.next_id;
        state.next_id = state.next_id.wrapping_add(1);
        state.running.insert(
            id,
            Running {
                peer: peer.to_owned(),
                volume: volume.to_owned(),
                chain,
                withdrawal,
            },
        );
        Ok(Entered {
            id,
            in_force: Arc::clone(self),
        })
    }

    /// Puts a reload's certificates (if given: never taken away, that is
    /// a restart's) and allow list in force, and withdraws each running
    /// session they no longer allow. Returns those.
    pub fn replace(&self, identity: &str, tls: Option<Tls>, allow: Vec<Allow>) -> Vec<Withdrawn> {
        let mut state = self.lock();
        let new_tls = tls.is_some();
        if let Some(tls) = tls {
            state.tls = Some(tls);
        }
        state.allow = allow;
        state.generation = state.generation.wrapping_add(1);
        let mut withdrawn = Vec::new();
        for running in state.running.values() {
            let Some(why) = refused(
                &state,
                &running.peer,
                &running.volume,
                &running.chain,
                new_tls,
            ) else {
                continue;
            };
            running.withdrawal.withdraw(not_allowed(
                identity,
                &running.peer,
                &running.volume,
                &why,
            ));
            withdrawn.push(Withdrawn {
                peer: running.peer.clone(),
                volume: running.volume.clone(),
                reason: why,
            });
        }
        withdrawn.sort_by(|a, b| (&a.volume, &a.peer).cmp(&(&b.volume, &b.peer)));
        withdrawn
    }

    /// Sessions running.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.lock().running.len()
    }
}

fn not_allowed(identity: &str, peer: &str, volume: &str, why: &str) -> Refusal {
    Refusal {
        code: RefusalCode::NotAllowed,
        message: format!(
            "{identity} no longer accepts {volume} from {peer}: {why} (its configuration was \
             reloaded)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(source: &str, volumes: &[&str]) -> Allow {
        Allow {
            source: source.into(),
            volumes: volumes.iter().map(|v| (*v).to_owned()).collect(),
            keep: None,
        }
    }

    #[tokio::test]
    async fn a_reload_withdraws_exactly_the_sessions_it_no_longer_allows() {
        let in_force = Arc::new(InForce::new(
            None,
            vec![allow("alpha", &["*"]), allow("beta", &["vm1"])],
        ));
        let (w1, s1) = arbor_replica::session::withdrawal();
        let (w2, mut s2) = arbor_replica::session::withdrawal();
        let (w3, s3) = arbor_replica::session::withdrawal();
        let one = in_force
            .enter("tgt", 0, "alpha", "vm1", Vec::new(), w1)
            .unwrap();
        let two = in_force
            .enter("tgt", 0, "alpha", "vm2", Vec::new(), w2)
            .unwrap();
        let three = in_force
            .enter("tgt", 0, "beta", "vm1", Vec::new(), w3)
            .unwrap();
        let refused = in_force
            .enter(
                "tgt",
                0,
                "beta",
                "vm2",
                Vec::new(),
                arbor_replica::session::withdrawal().0,
            )
            .err()
            .unwrap();
        assert_eq!(refused.code, RefusalCode::NotAllowed);
        assert_eq!(in_force.running(), 3);

        // alpha keeps vm1 only; beta keeps vm1.
        let withdrawn = in_force.replace(
            "tgt",
            None,
            vec![allow("alpha", &["vm1"]), allow("beta", &["vm1"])],
        );
        assert_eq!(
            withdrawn
                .iter()
                .map(|w| (w.peer.as_str(), w.volume.as_str()))
                .collect::<Vec<_>>(),
            [("alpha", "vm2")]
        );
        let told = s2.wait().await;
        assert_eq!(told.code, RefusalCode::NotAllowed);
        assert!(
            told.message
                .contains("tgt no longer accepts vm2 from alpha"),
            "{told:?}"
        );
        assert!(s1.refusal().is_none());
        assert!(s3.refusal().is_none());

        // A session that was accepted before a reload and only now says
        // hello is checked under the new list.
        assert!(in_force
            .enter(
                "tgt",
                0,
                "alpha",
                "vm2",
                Vec::new(),
                arbor_replica::session::withdrawal().0
            )
            .is_err());
        drop((one, two, three));
        assert_eq!(in_force.running(), 0);
    }
}
