//! A listener's [`Security`] that a reload replaces while it serves, and
//! the sessions it granted: a client keeps its connection only as long as
//! the security in force still grants what it opened.
//!
//! Each new connection negotiates under the security current when it was
//! accepted. Once it reaches transmission it is admitted here, under the
//! security current then (a reload between the two is not missed; without
//! one, the handshake's own checks stand and nothing is checked twice), with
//! what it was granted: its export, whether it opened it writable, and
//! its certificate chain. [`LiveSecurity::replace`] puts a new security in
//! force and closes every session it no longer grants: the export hidden
//! or only listed, a writable session only readable, a plaintext session
//! where TLS is now required, or a certificate that no longer verifies (a
//! new CA bundle, a revocation list that lists it). A closed session
//! answers the requests it has in flight and reads no more (as at
//! shutdown); the client can connect again and gets what the new grants
//! say.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;

use crate::access::{Access, Client};
use crate::connection::Security;
use crate::handshake::TlsMode;

/// A listener's security, replaceable while it serves.
pub struct LiveSecurity {
    current: RwLock<Security>,
    /// The sessions in transmission, by a number of their own. Held while
    /// the security is replaced and while a session is admitted, so that
    /// every session is checked against the security in force.
    sessions: Mutex<HashMap<u64, Granted>>,
    next: AtomicU64,
    /// Replacements so far (changed with `sessions` held): a session
    /// negotiated under the security still in force needs no second check
    /// (its handshake just made it, certificate chain included).
    generation: AtomicU64,
}

impl std::fmt::Debug for LiveSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSecurity")
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

/// What one session was granted.
pub(crate) struct Granted {
    pub client: Client,
    /// The certificate chain the client presented (empty: none).
    pub chain: Vec<CertificateDer<'static>>,
    pub export: String,
    /// It opened the export writable.
    pub writable: bool,
    /// The [`LiveSecurity::negotiating`] generation it negotiated under.
    pub generation: u64,
    /// Cancelled to close it.
    pub close: CancellationToken,
}

/// A session the new security no longer grants, closed by
/// [`LiveSecurity::replace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The identity of its certificate, if it presented one.
    pub identity: Option<String>,
    pub export: String,
    /// Why, in words.
    pub why: String,
}

/// A session's place among those admitted; leaving it (dropped) removes
/// the session.
pub(crate) struct Admitted {
    live: Arc<LiveSecurity>,
    id: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.live.sessions().remove(&self.id);
    }
}

impl LiveSecurity {
    pub fn new(security: Security) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(security),
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            generation: AtomicU64::new(0),
        })
    }

    /// The security in force (what a new connection negotiates under).
    pub fn current(&self) -> Security {
        // A poisoned lock still holds a whole value: replacing it is one
        // assignment.
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The security a new connection negotiates under, and its
    /// generation (for [`Granted::generation`]).
    pub(crate) fn negotiating(&self) -> (Security, u64) {
        let _sessions = self.sessions();
        (self.current(), self.generation.load(Ordering::Acquire))
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<u64, Granted>> {
        // Each change of the map is one insert or remove.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions in transmission.
    pub fn sessions_open(&self) -> usize {
        self.sessions().len()
    }

    /// Puts `security` in force and closes the sessions it no longer
    /// grants; which, and why.
    pub fn replace(&self, security: Security) -> Vec<Closed> {
        let sessions = self.sessions();
        let mut closed = Vec::new();
        // One closing already (an earlier reload) is not told of again.
        for granted in sessions.values().filter(|g| !g.close.is_cancelled()) {
            if let Err(why) = still_granted(&security, granted) {
                granted.close.cancel();
                closed.push(Closed {
                    identity: granted.client.identity.clone(),
                    export: granted.export.clone(),
                    why,
                });
            }
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = security;
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop(sessions);
        for c in &closed {
            tracing::info!(
                identity = c.identity.as_deref().unwrap_or("(none)"),
                export = %c.export,
                why = %c.why,
                "NBD session closed: the reloaded configuration no longer grants it"
            );
        }
        closed
    }

    /// Admits a session that reached transmission, if the security in
    /// force grants it; else why not.
    pub(crate) fn admit(self: &Arc<Self>, granted: Granted) -> Result<Admitted, String> {
        let mut sessions = self.sessions();
        if granted.generation != self.generation.load(Ordering::Acquire) {
            still_granted(&self.current(), &granted)?;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        sessions.insert(id, granted);
        Ok(Admitted {
            live: Arc::clone(self),
            id,
        })
    }
}

/// Whether `security` grants what `granted` holds; else why not.
fn still_granted(security: &Security, granted: &Granted) -> Result<(), String> {
    let client = &granted.client;
    if security.mode() == TlsMode::Require && !client.tls {
        return Err("TLS is now required".to_owned());
    }
    if !granted.chain.is_empty() {
        if let Some(tls) = security.tls() {
            tls.verify_peer(&granted.chain).map_err(|e| e.to_string())?;
        }
    }
    let needed = if granted.writable {
        Access::Write
    } else {
        Access::Read
    };
    match security.access().access(client, &granted.export) {
        Some(access) if access >= needed => Ok(()),
        Some(Access::Read) => Err(format!(
            "{} may now only read {}",
            who(client),
            granted.export
        )),
        _ => Err(format!(
            "{} is no longer granted {}",
            who(client),
            granted.export
        )),
    }
}

fn who(client: &Client) -> String {
    match &client.identity {
        Some(identity) => format!("certificate {identity:?}"),
        None => "an anonymous client".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{AccessList, Pattern, Principal, Rule};

    fn grants(rules: &[(Principal, &str, Access)]) -> Security {
        let rules = rules
            .iter()
            .map(|(principal, export, access)| Rule {
                principal: principal.clone(),
                exports: vec![Pattern::new(*export)],
                access: *access,
            })
            .collect();
        Security::new(TlsMode::Off, None, AccessList::new(rules)).unwrap()
    }

    fn session(identity: Option<&str>, export: &str, writable: bool) -> Granted {
        Granted {
            client: Client {
                tls: identity.is_some(),
                identity: identity.map(str::to_owned),
            },
            chain: Vec::new(),
            export: export.to_owned(),
            writable,
            // Negotiated before any replacement: checked at admission.
            generation: u64::MAX,
            close: CancellationToken::new(),
        }
    }

    fn ops(access: Access) -> (Principal, &'static str, Access) {
        (Principal::Identity("ops".into()), "vm*", access)
    }

    /// A reload closes exactly the sessions it no longer grants (hidden,
    /// listed only, writable but now read-only), keeps the others, and
    /// drops a session from the list when it ends.
    #[test]
    fn a_replacement_closes_the_sessions_it_no_longer_grants() {
        let live = LiveSecurity::new(grants(&[
            ops(Access::Write),
            (Principal::Anonymous, "public", Access::Read),
        ]));
        let writer = session(Some("ops"), "vm1", true);
        let reader = session(Some("ops"), "vm2", false);
        let anonymous = session(None, "public", false);
        let (w, r, a) = (
            writer.close.clone(),
            reader.close.clone(),
            anonymous.close.clone(),
        );
        let admitted = [
            live.admit(writer).unwrap(),
            live.admit(reader).unwrap(),
            live.admit(anonymous).unwrap(),
        ];
        assert_eq!(live.sessions_open(), 3);
        // ops may now only read: its writable session goes, its reader
        // stays; the anonymous grant is unchanged.
        let closed = live.replace(grants(&[
            ops(Access::Read),
            (Principal::Anonymous, "public", Access::Read),
        ]));
        assert_eq!(closed.len(), 1, "{closed:?}");
        assert_eq!(closed[0].export, "vm1");
        assert!(
            closed[0].why.contains("may now only read vm1"),
            "{closed:?}"
        );
        assert!(w.is_cancelled() && !r.is_cancelled() && !a.is_cancelled());
        // The anonymous grant withdrawn, ops listed only.
        let closed = live.replace(grants(&[ops(Access::List)]));
        assert_eq!(closed.len(), 2, "{closed:?}");
        assert!(r.is_cancelled() && a.is_cancelled());
        assert!(closed.iter().all(|c| c.why.contains("no longer granted")));
        drop(admitted);
        assert_eq!(live.sessions_open(), 0);
        // A session negotiated under the old grants is not admitted
        // under the new ones.
        let late = live.admit(session(Some("ops"), "vm1", false));
        let Err(why) = late else {
            panic!("admitted under grants that withdrew it")
        };
        assert!(why.contains("no longer granted vm1"), "{why}");
    }

    /// A plaintext session closes when TLS becomes required; a TLS one
    /// stays.
    #[test]
    fn plaintext_sessions_close_when_tls_becomes_required() {
        let ca = {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap()
        };
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &*ca)
            .unwrap();
        let tls = arbor_tls::Tls::from_pem(
            ca.pem().as_bytes(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let open =
            |mode| Security::new(mode, Some(tls.clone()), AccessList::unrestricted()).unwrap();
        let live = LiveSecurity::new(open(TlsMode::On));
        let plain = session(None, "vm", true);
        let mut secured = session(None, "vm", true);
        secured.client.tls = true;
        let (p, s) = (plain.close.clone(), secured.close.clone());
        let _kept = (live.admit(plain).unwrap(), live.admit(secured).unwrap());
        let closed = live.replace(open(TlsMode::Require));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].why, "TLS is now required");
        assert!(p.is_cancelled() && !s.is_cancelled());
    }
}
