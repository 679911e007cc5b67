//! Who a client is and what it may do with each export: the mechanism of
//! per-export access control, without policy (the daemon builds the
//! [`AccessList`] from its configuration).
//!
//! A client is known by its transport, whether TLS is active, and the
//! identity of the certificate it presented (verified against the CA by the
//! TLS layer before it gets here). An [`AccessList`] grants each client, per
//! export, one of [`Access::List`] (the export shows in `NBD_OPT_LIST` but
//! cannot be opened), [`Access::Read`] or [`Access::Write`], or nothing, in
//! which case the export is hidden: it is not listed, and opening it fails
//! exactly as for an export that does not exist.

/// What the server knows of the client of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// TLS is active on the connection.
    pub tls: bool,
    /// The identity of the client's certificate (see `arbor_tls::identity_of`),
    /// if it presented one.
    pub identity: Option<String>,
}

impl Client {
    /// A client without TLS and without identity.
    pub fn anonymous() -> Self {
        Self {
            tls: false,
            identity: None,
        }
    }
}

/// What a client may do with an export, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Listed by `NBD_OPT_LIST`, but not opened.
    List,
    /// Opened read-only, whatever the export allows.
    Read,
    /// Opened as the export allows (a read-only export stays read-only).
    Write,
}

/// Whom a [`Rule`] applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Clients whose certificate has this identity.
    Identity(String),
    /// Clients with any certificate the CA signed.
    AnyCertificate,
    /// Clients without a certificate (plaintext, or TLS without one).
    Anonymous,
}

impl Principal {
    fn matches(&self, client: &Client) -> bool {
        match (self, &client.identity) {
            (Self::Identity(wanted), Some(identity)) => wanted == identity,
            (Self::AnyCertificate, Some(_)) => true,
            (Self::Anonymous, None) => true,
            _ => false,
        }
    }
}

/// Export names a [`Rule`] covers: `*` (all), `prefix*` (names starting
/// with `prefix`) or an exact name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Any text is a pattern; a `*` anywhere but at the end is taken
    /// literally.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, name: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.0 == name,
        }
    }
}

/// One grant: `principal` may do `access` with the exports `exports` match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub principal: Principal,
    pub exports: Vec<Pattern>,
    pub access: Access,
}

/// The grants of one listener. A client's access to an export is the
/// greatest access any rule that applies to it grants, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessList {
    rules: Vec<Rule>,
}

impl AccessList {
    /// Every client may write every export (that allows writes): for
    /// listeners whose reach alone decides who connects, such as a Unix
    /// socket only the server's owner can open.
    pub fn unrestricted() -> Self {
        Self::new(vec![
            Rule {
                principal: Principal::Anonymous,
                exports: vec![Pattern::new("*")],
                access: Access::Write,
            },
            Rule {
                principal: Principal::AnyCertificate,
                exports: vec![Pattern::new("*")],
                access: Access::Write,
            },
        ])
    }

    pub fn new(rules: Vec<Rule>) -> Self {
        Self { rules }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// What `client` may do with `export`; `None`: the export is hidden.
    pub fn access(&self, client: &Client, export: &str) -> Option<Access> {
        self.rules
            .iter()
            .filter(|rule| rule.principal.matches(client))
            .filter(|rule| rule.exports.iter().any(|p| p.matches(export)))
            .map(|rule| rule.access)
            .max()
    }

    /// Whether some client with a certificate could be granted `export`:
    /// what a plaintext client is told (`NBD_REP_ERR_TLS_REQD`) when the
    /// export is hidden from it, on a listener that offers TLS.
    pub fn granted_with_certificate(&self, export: &str) -> bool {
        self.rules
            .iter()
            .filter(|rule| rule.principal != Principal::Anonymous)
            .any(|rule| rule.exports.iter().any(|p| p.matches(export)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(identity: Option<&str>) -> Client {
        Client {
            tls: identity.is_some(),
            identity: identity.map(str::to_owned),
        }
    }

    fn rule(principal: Principal, exports: &[&str], access: Access) -> Rule {
        Rule {
            principal,
            exports: exports.iter().map(|e| Pattern::new(*e)).collect(),
            access,
        }
    }

    #[test]
    fn patterns_match_exact_names_prefixes_and_everything() {
        assert!(Pattern::new("*").matches(""));
        assert!(Pattern::new("*").matches("vm"));
        assert!(Pattern::new("ci-*").matches("ci-"));
        assert!(Pattern::new("ci-*").matches("ci-17@base"));
        assert!(!Pattern::new("ci-*").matches("c"));
        assert!(!Pattern::new("ci-*").matches("prod"));
        assert!(Pattern::new("vm").matches("vm"));
        assert!(!Pattern::new("vm").matches("vm2"));
        assert!(!Pattern::new("vm").matches("v"));
        // Only a trailing star is a wildcard.
        assert!(Pattern::new("a*b").matches("a*b") && !Pattern::new("a*b").matches("axb"));
    }

    #[test]
    fn the_greatest_grant_of_the_rules_that_apply_wins() {
        let list = AccessList::new(vec![
            rule(Principal::AnyCertificate, &["*"], Access::List),
            rule(Principal::Identity("ci".into()), &["ci-*"], Access::Write),
            rule(Principal::Identity("ci".into()), &["golden"], Access::Read),
            rule(Principal::Anonymous, &["public"], Access::Read),
        ]);
        let ci = client(Some("ci"));
        let other = client(Some("backup"));
        let nobody = client(None);
        assert_eq!(list.access(&ci, "ci-1"), Some(Access::Write));
        assert_eq!(list.access(&ci, "golden"), Some(Access::Read));
        assert_eq!(list.access(&ci, "prod"), Some(Access::List));
        assert_eq!(list.access(&ci, "public"), Some(Access::List));
        assert_eq!(list.access(&other, "ci-1"), Some(Access::List));
        assert_eq!(list.access(&nobody, "ci-1"), None);
        assert_eq!(list.access(&nobody, "public"), Some(Access::Read));
        assert!(list.granted_with_certificate("ci-1"));
        assert!(
            !AccessList::new(vec![rule(Principal::Anonymous, &["*"], Access::Write)])
                .granted_with_certificate("x")
        );
    }

    #[test]
    fn identities_are_matched_exactly_and_empty_lists_grant_nothing() {
        let list = AccessList::new(vec![rule(
            Principal::Identity("ops".into()),
            &["*"],
            Access::Write,
        )]);
        assert_eq!(list.access(&client(Some("ops")), "vm"), Some(Access::Write));
        assert_eq!(list.access(&client(Some("ops2")), "vm"), None);
        assert_eq!(list.access(&client(Some("OPS")), "vm"), None);
        assert_eq!(list.access(&client(None), "vm"), None);
        assert_eq!(
            AccessList::new(Vec::new()).access(&client(Some("ops")), "vm"),
            None
        );
        let open = AccessList::unrestricted();
        assert_eq!(open.access(&client(None), "vm"), Some(Access::Write));
        assert_eq!(open.access(&client(Some("x")), "vm"), Some(Access::Write));
    }
}
