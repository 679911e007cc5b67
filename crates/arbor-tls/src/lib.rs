//! TLS for every arbor listener and client: replication, NBD and the API.
//!
//! Every host has a CA bundle, a certificate chain and a private key, all PEM.
//! The replication listener requires a client certificate issued by the CA
//! ([`Tls::acceptor`]); the NBD and API listeners accept clients without one,
//! but a certificate that is presented must verify against the CA
//! ([`Tls::acceptor_client_optional`]), and its identity then decides what
//! the client may do. A client of such a listener (the CLI over the API)
//! builds its side from a CA bundle and an optional certificate
//! ([`client_connector`]). A certificate's identity is its first DNS
//! subjectAltName, else its first IP address subjectAltName, else its subject
//! Common Name.
//!
//! The `aws-lc-rs` crypto provider is passed explicitly, so no process-wide
//! provider needs to be installed. It signs with RSA keys of 2048 to 8192
//! bits ([`MIN_RSA_BITS`], [`MAX_RSA_BITS`]), ECDSA keys on P-256, P-384 and
//! P-521 and Ed25519 keys; a key it refuses gets an error that says its type
//! and size (`keys`).
//!
//! [`handshakes`] is the one rule for connections still in their handshake,
//! shared by the listeners: bounded slots, the oldest dropped for a new one.

pub mod handshakes;

use std::fmt;
use std::io::{self, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, ClientConfig, InconsistentKeys, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

mod keys;

pub use keys::{MAX_RSA_BITS, MIN_RSA_BITS};

/// The largest CA, certificate or key file [`Tls::load`] will read (1 MiB).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

const WHAT_CA: &str = "CA bundle";
const WHAT_CERT: &str = "certificate";
const WHAT_KEY: &str = "private key";
const WHAT_CRL: &str = "revocation list";

/// Paths of the PEM files a host needs for mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle: one or more PEM certificates trusted to issue host certificates.
    pub ca: PathBuf,
    /// This host's certificate chain (PEM), its own certificate first.
    pub cert: PathBuf,
    /// This host's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Certificate revocation lists (PEM, one or more), each issued by a
    /// CA of the bundle: a peer certificate they list is refused.
    pub crl: Option<PathBuf>,
}

/// Errors from loading TLS material or checking identities.
///
/// `what` is "CA bundle", "certificate" or "private key"; `path` is the file,
/// or "(in memory)" for [`Tls::from_pem`].
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file does not exist.
    #[error("{what} {}: file not found", path.display())]
    Missing {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("{what} {}: cannot read: {source}", path.display())]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{what} {}: file is larger than the {} MiB limit", path.display(), limit / (1024 * 1024))]
    TooLarge {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
    /// The contents are not well-formed PEM.
    #[error("{what} {}: not valid PEM: {reason}", path.display())]
    NotPem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What the PEM parser reported.
        reason: String,
    },
    /// The file holds no PEM certificate.
    #[error("{what} {}: no certificate found (expected a PEM \"BEGIN CERTIFICATE\" block)", path.display())]
    NoCertificate {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
    },
    /// A certificate in the file could not be parsed or used.
    #[error("{what} {}: bad certificate: {reason}", path.display())]
    BadCertificate {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key file holds no PEM private key.
    #[error(
        "private key {}: no private key found (expected an unencrypted PEM \"PRIVATE KEY\", \
         \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block)",
        path.display()
    )]
    NoPrivateKey {
        /// The key file.
        path: PathBuf,
    },
    /// The private key could not be loaded (unsupported or corrupt).
    #[error("private key {}: unusable: {reason}", path.display())]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The private key is not the key of the certificate.
    #[error("private key {} does not match the certificate {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// The certificate does not verify against the CA bundle.
    #[error("certificate {} does not verify against the CA bundle {}: {reason}", cert.display(), ca.display())]
    NotTrusted {
        /// The certificate file.
        cert: PathBuf,
        /// The CA bundle file.
        ca: PathBuf,
        /// Why verification failed.
        reason: String,
    },
    /// A certificate (ours or a peer's) has no name to identify it by.
    #[error("certificate has no usable identity: {0}")]
    NoIdentity(String),
    /// The peer of a connection presented no certificate.
    #[error("peer presented no certificate")]
    NoPeerCertificate,
    /// A host to connect to is neither a DNS name nor an IP address.
    #[error("invalid server name {0:?}: not a DNS name or an IP address")]
    InvalidServerName(String),
    /// A revocation list could not be parsed, or no CA of the bundle
    /// issued it (it would revoke nothing).
    #[error("revocation list {}: {reason}", path.display())]
    BadCrl {
        /// The revocation list file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A peer's certificate no longer verifies (against a CA bundle or a
    /// revocation list loaded since it connected).
    #[error("the peer's certificate is no longer trusted: {0}")]
    PeerNotTrusted(String),
    /// rustls refused to build a configuration from checked material.
    #[error("building the TLS configuration failed: {0}")]
    Config(String),
}

/// Mutual-TLS configuration for one host: server and client sides, plus
/// this host's identity. Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    server: Arc<ServerConfig>,
    server_client_optional: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// What [`Tls::verify_peer`] checks a peer's chain with: the CA
    /// bundle and the revocation lists.
    peers: Arc<dyn ClientCertVerifier>,
    identity: String,
    dns_names: Vec<String>,
    /// Certificates the revocation lists list, across them all.
    revoked: usize,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Where a piece of PEM came from, for error messages.
struct Origin<'a> {
    ca: &'a Path,
    cert: &'a Path,
    key: &'a Path,
    crl: &'a Path,
}

impl Tls {
    /// Loads the CA bundle (one or more PEM certificates), this host's
    /// certificate chain (PEM) and private key (PEM: PKCS#8, PKCS#1 or SEC1).
    /// Checks that the key matches the certificate and that the certificate
    /// verifies against the CA. Each file may be at most [`MAX_FILE_BYTES`].
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let ca = read_limited(WHAT_CA, &files.ca)?;
        let cert = read_limited(WHAT_CERT, &files.cert)?;
        let key = read_limited(WHAT_KEY, &files.key)?;
        let crl = match &files.crl {
            Some(path) => Some(read_limited(WHAT_CRL, path)?),
            None => None,
        };
        let origin = Origin {
            ca: &files.ca,
            cert: &files.cert,
            key: &files.key,
            crl: files.crl.as_deref().unwrap_or(Path::new("(none)")),
        };
        build(&ca, &cert, &key, crl.as_deref(), &origin)
    }

    /// Same as [`Tls::load`], from PEM bytes in memory: CA bundle,
    /// certificate chain, private key.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Tls, TlsError> {
        Self::from_pem_with_crl(ca, cert, key, None)
    }

    /// [`Tls::from_pem`] with revocation lists (PEM).
    pub fn from_pem_with_crl(
        ca: &[u8],
        cert: &[u8],
        key: &[u8],
        crl: Option<&[u8]>,
    ) -> Result<Tls, TlsError> {
        let memory = Path::new("(in memory)");
        let origin = Origin {
            ca: memory,
            cert: memory,
            key: memory,
            crl: memory,
        };
        build(ca, cert, key, crl, &origin)
    }

    /// Server side: TLS 1.3 (1.2 allowed); requires a client certificate
    /// that verifies against the CA. Anonymous clients are refused.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.server))
    }

    /// Server side for listeners that serve anonymous clients too (NBD, the
    /// API): a client may present no certificate, but one it presents must
    /// verify against the CA, or the handshake fails. [`peer_identity`]
    /// then tells the two apart.
    pub fn acceptor_client_optional(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.server_client_optional))
    }

    /// Client side: verifies the server's certificate against the CA (not
    /// the system roots) for the server name given to `connect`, and
    /// presents this host's certificate.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(Arc::clone(&self.client))
    }

    /// This host's identity, from its certificate (see [`identity_of`]).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Every DNS name (subjectAltName) of this host's certificate, in
    /// lower case: the names clients may reach it by and verify.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// How many certificates the revocation lists list.
    pub fn revoked_certificates(&self) -> usize {
        self.revoked
    }

    /// Whether a peer's certificate chain (its own first), accepted by an
    /// earlier configuration, verifies under this one: issued by a CA of
    /// this bundle, not listed by a revocation list, not expired. What a
    /// reload checks the connections it keeps with.
    pub fn verify_peer(&self, chain: &[CertificateDer<'static>]) -> Result<(), TlsError> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(TlsError::NoPeerCertificate);
        };
        self.peers
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| TlsError::PeerNotTrusted(describe_cert_error(&e)))
    }
}

/// The chain a connection's peer presented (empty: none).
pub fn peer_chain(conn: &rustls::CommonState) -> Vec<CertificateDer<'static>> {
    conn.peer_certificates()
        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default()
}

/// What a client of a server needs: the CA bundle that signs the server's
/// certificate, and optionally the client's own certificate chain and key
/// (for servers that accept or require client certificates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    /// CA bundle (PEM) the server's certificate must verify against.
    pub ca: PathBuf,
    /// This client's certificate chain and private key (PEM), if any.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A client-side TLS connector: verifies the server's certificate against
/// `files.ca` (not the system roots) for the name given to `connect`, and
/// presents `files.identity` when given. Errors are those of
/// [`Tls::load`], naming the file: missing, unreadable, too large, not
/// PEM, no certificate, no key, or a key that is not the certificate's.
pub fn client_connector(files: &ClientFiles) -> Result<TlsConnector, TlsError> {
    let provider = provider();
    let ca = read_limited(WHAT_CA, &files.ca)?;
    let roots = root_store(&ca, &files.ca)?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_webpki_verifier(verifier);
    let config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let cert = read_limited(WHAT_CERT, cert_path)?;
            let key = read_limited(WHAT_KEY, key_path)?;
            let chain = parse_certs(WHAT_CERT, cert_path, &cert)?;
            let key = parse_key(key_path, &key)?;
            check_key_matches(&provider, &chain, &key, cert_path, key_path)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::Config(e.to_string()))?
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The identity of a DER certificate: its first subjectAltName DNS name,
/// else its first subjectAltName IP address (as text), else its subject
/// Common Name. Errors if it has none of these or cannot be parsed.
pub fn identity_of(cert_der: &[u8]) -> Result<String, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| TlsError::NoIdentity(format!("cannot parse certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::NoIdentity(format!("bad subjectAltName extension: {e}")))?;
    if let Some(san) = san {
        let names = &san.value.general_names;
        let dns = names.iter().find_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(s) if !s.is_empty() => Some(*s),
            _ => None,
        });
        if let Some(dns) = dns {
            return Ok(dns.to_string());
        }
        let ip = names.iter().find_map(|n| match n {
            x509_parser::extensions::GeneralName::IPAddress(b) => ip_from_bytes(b),
            _ => None,
        });
        if let Some(ip) = ip {
            return Ok(ip.to_string());
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            if !s.is_empty() {
                return Ok(s.to_string());
            }
        }
    }
    Err(TlsError::NoIdentity(
        "no subjectAltName DNS name or IP address, and no subject Common Name".to_string(),
    ))
}

/// The verified identity of the peer of an established connection (either
/// side): [`identity_of`] its first certificate. Errors if it presented none.
pub fn peer_identity(conn: &rustls::CommonState) -> Result<String, TlsError> {
    let first = conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .ok_or(TlsError::NoPeerCertificate)?;
    identity_of(first.as_ref())
}

/// A rustls server name for connecting to `host`: a DNS name or an IP
/// address (an IPv6 address may be in brackets).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string())
        .map_err(|_| TlsError::InvalidServerName(host.to_string()))
}

fn ip_from_bytes(b: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(b) {
        return Some(IpAddr::from(v4));
    }
    if let Ok(v6) = <[u8; 16]>::try_from(b) {
        return Some(IpAddr::from(v6));
    }
    None
}

fn read_limited(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = std::fs::File::open(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            TlsError::Missing {
                what,
                path: path.to_path_buf(),
            }
        } else {
            TlsError::Read {
                what,
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|source| TlsError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(TlsError::TooLarge {
            what,
            path: path.to_path_buf(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(buf)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn pem_reason(e: &pem::Error) -> String {
    match e {
        pem::Error::Base64Decode(s) => format!("bad base64: {s}"),
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "missing end line \"-----END {}-----\"",
            String::from_utf8_lossy(end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => {
            format!("malformed BEGIN line {:?}", String::from_utf8_lossy(line))
        }
        other => other.to_string(),
    }
}

/// Parses every certificate in a PEM blob; at least one is required.
fn parse_certs(
    what: &'static str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NotPem {
            what,
            path: path.to_path_buf(),
            reason: pem_reason(&e),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn parse_key(path: &Path, pem_bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem_bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_path_buf(),
        },
        other => TlsError::NotPem {
            what: WHAT_KEY,
            path: path.to_path_buf(),
            reason: pem_reason(&other),
        },
    })
}

fn describe_cert_error(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "not issued by a certificate in the CA bundle (unknown issuer)".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => {
            "bad signature".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::BadEncoding) => {
            "malformed certificate".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::Revoked) => {
            "revoked (a revocation list, tls_crl, lists it)".to_string()
        }
        rustls::Error::InvalidCertificate(c) => c.to_string(),
        other => other.to_string(),
    }
}

fn is_purpose_error(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. }
        )
    )
}

/// The CA bundle's certificates as trust roots (at least one).
fn root_store(ca: &[u8], path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let ca_certs = parse_certs(WHAT_CA, path, ca)?;
    let mut roots = RootCertStore::empty();
    for (i, der) in ca_certs.into_iter().enumerate() {
        roots.add(der).map_err(|e| TlsError::BadCertificate {
            what: WHAT_CA,
            path: path.to_path_buf(),
            reason: format!("certificate #{}: {}", i + 1, describe_cert_error(&e)),
        })?;
    }
    Ok(Arc::new(roots))
}

/// The key must be usable and belong to the chain's first certificate.
fn check_key_matches(
    provider: &CryptoProvider,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), TlsError> {
    let signing_key = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| TlsError::BadKey {
            path: key_path.to_path_buf(),
            reason: keys::refusal(key, &e),
        })?;
    match CertifiedKey::new(chain.to_vec(), signing_key).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(()),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                key: key_path.to_path_buf(),
                cert: cert_path.to_path_buf(),
            })
        }
        Err(e) => Err(TlsError::BadCertificate {
            what: WHAT_CERT,
            path: cert_path.to_path_buf(),
            reason: describe_cert_error(&e),
        }),
    }
}

/// Every non-empty DNS subjectAltName of a DER certificate, in lower case.
fn dns_names_of(cert_der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert_der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(s) if !s.is_empty() => {
                Some(s.to_ascii_lowercase())
            }
            _ => None,
        })
        .collect()
}

/// The revocation lists of a PEM file (at least one), each issued by a
/// CA of the bundle `ca` (its issuer is one of their subjects; its
/// signature is checked where it is used), and how many certificates they
/// list.
fn parse_crls(
    path: &Path,
    pem_bytes: &[u8],
    ca: &[u8],
) -> Result<(Vec<CertificateRevocationListDer<'static>>, usize), TlsError> {
    let bad = |reason: String| TlsError::BadCrl {
        path: path.to_path_buf(),
        reason,
    };
    let crls = CertificateRevocationListDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not valid PEM: {}", pem_reason(&e))))?;
    if crls.is_empty() {
        return Err(bad(
            "no revocation list found (expected a PEM \"BEGIN X509 CRL\" block)".into(),
        ));
    }
    // The CA bundle parsed already (root_store).
    let subjects: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(ca)
        .filter_map(Result::ok)
        .filter_map(|der| {
            x509_parser::parse_x509_certificate(der.as_ref())
                .ok()
                .map(|(_, c)| c.subject().as_raw().to_vec())
        })
        .collect();
    let mut revoked = 0;
    for (i, der) in crls.iter().enumerate() {
        let (_, crl) = x509_parser::parse_x509_crl(der.as_ref())
            .map_err(|e| bad(format!("list #{}: malformed: {e}", i + 1)))?;
        if !subjects.iter().any(|s| s == crl.issuer().as_raw()) {
            return Err(bad(format!(
                "list #{} is issued by {}, which is no CA of the bundle: it would revoke nothing",
                i + 1,
                crl.issuer()
            )));
        }
        revoked += crl.iter_revoked_certificates().count();
    }
    Ok((crls, revoked))
}

fn build(
    ca: &[u8],
    cert: &[u8],
    key: &[u8],
    crl: Option<&[u8]>,
    origin: &Origin<'_>,
) -> Result<Tls, TlsError> {
    let provider = provider();

    let roots = root_store(ca, origin.ca)?;
    let (crls, revoked) = match crl {
        Some(pem_bytes) => parse_crls(origin.crl, pem_bytes, ca)?,
        None => (Vec::new(), 0),
    };

    let chain = parse_certs(WHAT_CERT, origin.cert, cert)?;
    let key = parse_key(origin.key, key)?;

    let (leaf, intermediates) = match chain.split_first() {
        Some(split) => split,
        None => {
            return Err(TlsError::NoCertificate {
                what: WHAT_CERT,
                path: origin.cert.to_path_buf(),
            })
        }
    };
    let identity = identity_of(leaf.as_ref()).map_err(|e| TlsError::BadCertificate {
        what: WHAT_CERT,
        path: origin.cert.to_path_buf(),
        reason: e.to_string(),
    })?;
    let dns_names = dns_names_of(leaf.as_ref());

    check_key_matches(&provider, &chain, &key, origin.cert, origin.key)?;

    let config_err = |e: &dyn fmt::Display| TlsError::Config(e.to_string());
    // Every certificate of a chain is checked against the lists of its
    // issuer; one whose issuer has no list passes (lists are optional per
    // CA), and an out-of-date list still revokes what it lists.
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .with_crls(crls.clone())
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| config_err(&e))?;
    let optional_client_verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .with_crls(crls.clone())
            .allow_unknown_revocation_status()
            .allow_unauthenticated()
            .build()
            .map_err(|e| config_err(&e))?;
    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .with_crls(crls)
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| config_err(&e))?;

    // The certificate must chain to the CA. Check it as a client
    // certificate; if its extended key usage rules that out, accept it as a
    // server certificate for its own identity instead.
    let now = UnixTime::now();
    if let Err(client_err) = client_verifier.verify_client_cert(leaf, intermediates, now) {
        let not_trusted = |reason: String| TlsError::NotTrusted {
            cert: origin.cert.to_path_buf(),
            ca: origin.ca.to_path_buf(),
            reason,
        };
        if !is_purpose_error(&client_err) {
            return Err(not_trusted(describe_cert_error(&client_err)));
        }
        let name = server_name(&identity).map_err(|_| {
            not_trusted(format!(
                "not valid for client authentication ({}), and its identity {identity:?} \
                 is not a server name",
                describe_cert_error(&client_err)
            ))
        })?;
        server_verifier
            .verify_server_cert(leaf, intermediates, &name, &[], now)
            .map_err(|server_err| {
                not_trusted(format!(
                    "not valid for client authentication ({}) nor as server {identity:?} ({})",
                    describe_cert_error(&client_err),
                    describe_cert_error(&server_err)
                ))
            })?;
    }

    let server_config = |verifier| {
        ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| config_err(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| config_err(&e))
    };
    let server = server_config(Arc::clone(&client_verifier))?;
    let server_client_optional = server_config(optional_client_verifier)?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_err(&e))?
        .with_webpki_verifier(server_verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| config_err(&e))?;

    tracing::debug!(identity = %identity, "loaded TLS identity");
    Ok(Tls {
        server: Arc::new(server),
        server_client_optional: Arc::new(server_client_optional),
        client: Arc::new(client),
        peers: client_verifier,
        identity,
        dns_names,
        revoked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
        ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    type Ca = CertifiedIssuer<'static, KeyPair>;

    fn new_ca(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    struct Leaf {
        cert_pem: String,
        key_pem: String,
        der: Vec<u8>,
    }

    fn leaf_with(
        ca: &Ca,
        sans: &[&str],
        cn: Option<&str>,
        eku: &[ExtendedKeyUsagePurpose],
    ) -> Leaf {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.extended_key_usages = eku.to_vec();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &**ca).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    fn leaf(ca: &Ca, sans: &[&str], cn: Option<&str>) -> Leaf {
        leaf_with(ca, sans, cn, &[])
    }

    fn tls_for(ca: &Ca, l: &Leaf) -> Tls {
        Tls::from_pem(
            ca.pem().as_bytes(),
            l.cert_pem.as_bytes(),
            l.key_pem.as_bytes(),
        )
        .unwrap()
    }

    fn err_of(r: Result<Tls, TlsError>) -> TlsError {
        match r {
            Ok(t) => panic!("expected an error, got {t:?}"),
            Err(e) => e,
        }
    }

    /// A revocation list of `ca` listing `revoked`.
    fn crl_of(ca: &Ca, revoked: &[&Leaf]) -> String {
        let now = time::OffsetDateTime::now_utc();
        let params = rcgen::CertificateRevocationListParams {
            this_update: now - time::Duration::hours(1),
            next_update: now + time::Duration::days(7),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|l| {
                    let (_, cert) = x509_parser::parse_x509_certificate(&l.der).unwrap();
                    rcgen::RevokedCertParams {
                        serial_number: rcgen::SerialNumber::from_slice(cert.raw_serial()),
                        revocation_time: now - time::Duration::minutes(1),
                        reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                        invalidity_date: None,
                    }
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        params.signed_by(&**ca).unwrap().pem().unwrap()
    }

    fn chain_of(l: &Leaf) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from(l.der.clone())]
    }

    /// A certificate a revocation list lists is refused in the handshake
    /// and by `verify_peer`; others pass; the list must be PEM, and
    /// issued by a CA of the bundle; a host whose own certificate is
    /// listed cannot load it.
    #[tokio::test]
    async fn revocation_lists_refuse_the_certificates_they_list() {
        let ca = new_ca("arbor test CA");
        let server = leaf(&ca, &["localhost"], None);
        let alpha = leaf(&ca, &["alpha"], None);
        let beta = leaf(&ca, &["beta"], None);
        let crl = crl_of(&ca, &[&alpha]);
        let with_crl = |l: &Leaf, crl: &str| {
            Tls::from_pem_with_crl(
                ca.pem().as_bytes(),
                l.cert_pem.as_bytes(),
                l.key_pem.as_bytes(),
                Some(crl.as_bytes()),
            )
        };
        let host = with_crl(&server, &crl).unwrap();
        assert_eq!(host.revoked_certificates(), 1);
        // verify_peer: a reload checks the connections it keeps.
        let err = host.verify_peer(&chain_of(&alpha)).unwrap_err();
        assert!(matches!(err, TlsError::PeerNotTrusted(_)), "{err}");
        assert!(err.to_string().contains("revoked"), "{err}");
        host.verify_peer(&chain_of(&beta)).unwrap();
        tls_for(&ca, &server)
            .verify_peer(&chain_of(&alpha))
            .unwrap();
        let other = new_ca("other CA");
        let stranger = leaf(&other, &["alpha"], None);
        assert!(host.verify_peer(&chain_of(&stranger)).is_err());
        assert!(matches!(
            host.verify_peer(&[]),
            Err(TlsError::NoPeerCertificate)
        ));
        // The handshakes: alpha refused, beta served, on both acceptors.
        let alpha_tls = tls_for(&ca, &alpha);
        let beta_tls = tls_for(&ca, &beta);
        for optional in [false, true] {
            let acceptor = |h: &Tls| {
                if optional {
                    h.acceptor_client_optional()
                } else {
                    h.acceptor()
                }
            };
            let (s, _) = handshake_with(acceptor(&host), alpha_tls.connector(), "localhost").await;
            assert!(s.is_err(), "alpha served (optional {optional})");
            let (s, _) = handshake_with(acceptor(&host), beta_tls.connector(), "localhost").await;
            assert_eq!(peer_identity(s.unwrap().get_ref().1).unwrap(), "beta");
        }
        // As a client (a replication source), a revoked server is refused.
        let revoked_server = tls_for(&ca, &alpha);
        let (_, c) = handshake(&revoked_server, host.connector(), "alpha").await;
        assert!(c.is_err(), "a revoked server was trusted");
        // Bad lists.
        let err = err_of(with_crl(&server, "garbage"));
        assert!(matches!(err, TlsError::BadCrl { .. }), "{err}");
        assert!(
            err.to_string().contains("no revocation list found"),
            "{err}"
        );
        let err = err_of(with_crl(&server, &crl_of(&other, &[])));
        assert!(err.to_string().contains("no CA of the bundle"), "{err}");
        let err = err_of(with_crl(
            &server,
            &format!("{crl}\n-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"),
        ));
        assert!(err.to_string().contains("malformed"), "{err}");
        // Our own certificate listed: not loaded.
        let err = err_of(with_crl(&alpha, &crl));
        assert!(matches!(err, TlsError::NotTrusted { .. }), "{err}");
        assert!(err.to_string().contains("revoked"), "{err}");
    }

    #[test]
    fn from_pem_good_set_and_identity() {
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha", "alpha.example"], Some("alpha-cn"));
        let tls = tls_for(&ca, &alpha);
        assert_eq!(tls.identity(), "alpha");
        assert!(format!("{tls:?}").contains("alpha"));
        let _ = tls.clone().acceptor();
        let _ = tls.connector();
    }

    #[test]
    fn ca_bundle_with_several_certificates() {
        let other = new_ca("other CA");
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let bundle = format!("{}\n{}", other.pem(), ca.pem());
        let tls = Tls::from_pem(
            bundle.as_bytes(),
            alpha.cert_pem.as_bytes(),
            alpha.key_pem.as_bytes(),
        )
        .unwrap();
        assert_eq!(tls.identity(), "alpha");
    }

    #[test]
    fn identity_of_falls_back_to_ip_then_cn() {
        let ca = new_ca("arbor test CA");
        let dns_and_ip = leaf(&ca, &["10.77.0.2", "beta"], Some("beta-cn"));
        assert_eq!(identity_of(&dns_and_ip.der).unwrap(), "beta");
        let ip = leaf(&ca, &["10.77.0.2"], Some("ip-cn"));
        assert_eq!(identity_of(&ip.der).unwrap(), "10.77.0.2");
        let ip6 = leaf(&ca, &["fd00::2"], None);
        assert_eq!(identity_of(&ip6.der).unwrap(), "fd00::2");
        let cn = leaf(&ca, &[], Some("gamma"));
        assert_eq!(identity_of(&cn.der).unwrap(), "gamma");
        // A CN-only certificate is still a valid host certificate.
        assert_eq!(tls_for(&ca, &cn).identity(), "gamma");
        let ip_tls = tls_for(&ca, &ip);
        assert_eq!(ip_tls.identity(), "10.77.0.2");
    }

    #[test]
    fn identity_of_errors_without_names() {
        let ca = new_ca("arbor test CA");
        let none = leaf(&ca, &[], None);
        let err = identity_of(&none.der).unwrap_err();
        assert!(matches!(err, TlsError::NoIdentity(_)), "{err}");
        let err = identity_of(b"not a certificate").unwrap_err();
        assert!(matches!(err, TlsError::NoIdentity(_)), "{err}");
        // Loading such a certificate as our own fails too.
        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            none.cert_pem.as_bytes(),
            none.key_pem.as_bytes(),
        ));
        assert!(matches!(err, TlsError::BadCertificate { .. }), "{err}");
    }

    #[test]
    fn key_not_matching_cert() {
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let beta = leaf(&ca, &["beta"], None);
        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            alpha.cert_pem.as_bytes(),
            beta.key_pem.as_bytes(),
        ));
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn cert_from_other_ca() {
        let ca = new_ca("arbor test CA");
        let other = new_ca("other CA");
        let alpha = leaf(&other, &["alpha"], None);
        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            alpha.cert_pem.as_bytes(),
            alpha.key_pem.as_bytes(),
        ));
        assert!(matches!(err, TlsError::NotTrusted { .. }), "{err}");
        assert!(err.to_string().contains("unknown issuer"), "{err}");
    }

    #[test]
    fn server_only_eku_is_accepted_client_only_too() {
        let ca = new_ca("arbor test CA");
        let server_only = leaf_with(
            &ca,
            &["alpha"],
            None,
            &[ExtendedKeyUsagePurpose::ServerAuth],
        );
        assert_eq!(tls_for(&ca, &server_only).identity(), "alpha");
        let client_only = leaf_with(&ca, &["beta"], None, &[ExtendedKeyUsagePurpose::ClientAuth]);
        assert_eq!(tls_for(&ca, &client_only).identity(), "beta");
        let neither = leaf_with(
            &ca,
            &["gamma"],
            None,
            &[ExtendedKeyUsagePurpose::CodeSigning],
        );
        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            neither.cert_pem.as_bytes(),
            neither.key_pem.as_bytes(),
        ));
        assert!(matches!(err, TlsError::NotTrusted { .. }), "{err}");
    }

    #[test]
    fn garbage_pem() {
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let bad_base64 =
            b"-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n";
        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            bad_base64,
            alpha.key_pem.as_bytes(),
        ));
        assert!(
            matches!(
                err,
                TlsError::NotPem {
                    what: "certificate",
                    ..
                }
            ),
            "{err}"
        );

        let unterminated = b"-----BEGIN CERTIFICATE-----\nAAAA\n";
        let err = err_of(Tls::from_pem(
            unterminated,
            alpha.cert_pem.as_bytes(),
            alpha.key_pem.as_bytes(),
        ));
        assert!(
            matches!(
                err,
                TlsError::NotPem {
                    what: "CA bundle",
                    ..
                }
            ),
            "{err}"
        );

        let not_der = b"-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n";
        let err = err_of(Tls::from_pem(
            not_der,
            alpha.cert_pem.as_bytes(),
            alpha.key_pem.as_bytes(),
        ));
        assert!(
            matches!(
                err,
                TlsError::BadCertificate {
                    what: "CA bundle",
                    ..
                }
            ),
            "{err}"
        );

        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            b"hello, not pem at all",
            alpha.key_pem.as_bytes(),
        ));
        assert!(
            matches!(
                err,
                TlsError::NoCertificate {
                    what: "certificate",
                    ..
                }
            ),
            "{err}"
        );

        let err = err_of(Tls::from_pem(
            ca.pem().as_bytes(),
            alpha.cert_pem.as_bytes(),
            alpha.cert_pem.as_bytes(),
        ));
        assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err}");
    }

    #[test]
    fn empty_ca_file() {
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let err = err_of(Tls::from_pem(
            b"",
            alpha.cert_pem.as_bytes(),
            alpha.key_pem.as_bytes(),
        ));
        assert!(
            matches!(
                err,
                TlsError::NoCertificate {
                    what: "CA bundle",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().starts_with("CA bundle"), "{err}");
    }

    fn write_set(dir: &Path, ca: &Ca, l: &Leaf) -> TlsFiles {
        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("host.pem"),
            key: dir.join("host.key"),
            crl: None,
        };
        std::fs::write(&files.ca, ca.pem()).unwrap();
        std::fs::write(&files.cert, &l.cert_pem).unwrap();
        std::fs::write(&files.key, &l.key_pem).unwrap();
        files
    }

    #[test]
    fn load_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let files = write_set(dir.path(), &ca, &alpha);
        assert_eq!(Tls::load(&files).unwrap().identity(), "alpha");

        // Errors name the file.
        let beta = leaf(&ca, &["beta"], None);
        std::fs::write(&files.key, &beta.key_pem).unwrap();
        let err = err_of(Tls::load(&files));
        let msg = err.to_string();
        assert!(msg.contains(&*files.key.to_string_lossy()), "{msg}");
        assert!(msg.contains(&*files.cert.to_string_lossy()), "{msg}");
    }

    #[test]
    fn load_missing_file_names_path() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let mut files = write_set(dir.path(), &ca, &alpha);
        files.cert = dir.path().join("no-such-cert.pem");
        let err = err_of(Tls::load(&files));
        assert!(
            matches!(
                err,
                TlsError::Missing {
                    what: "certificate",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("no-such-cert.pem"), "{err}");
    }

    #[test]
    fn load_rejects_oversized_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca("arbor test CA");
        let alpha = leaf(&ca, &["alpha"], None);
        let files = write_set(dir.path(), &ca, &alpha);
        let mut big = ca.pem().into_bytes();
        big.resize(MAX_FILE_BYTES as usize + 1, b'\n');
        std::fs::write(&files.ca, big).unwrap();
        let err = err_of(Tls::load(&files));
        assert!(
            matches!(
                err,
                TlsError::TooLarge {
                    what: "CA bundle",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("1 MiB"), "{err}");
    }

    #[test]
    fn server_name_parsing() {
        assert!(matches!(server_name("alpha"), Ok(ServerName::DnsName(_))));
        assert!(matches!(
            server_name("alpha.example."),
            Ok(ServerName::DnsName(_))
        ));
        assert!(matches!(
            server_name("10.77.0.2"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(server_name("::1"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            server_name("[fd00::2]"),
            Ok(ServerName::IpAddress(_))
        ));
        for bad in ["", "not a name", "bad_name!", "[alpha]"] {
            let err = server_name(bad).unwrap_err();
            assert!(
                matches!(err, TlsError::InvalidServerName(_)),
                "{bad}: {err}"
            );
        }
    }

    type Handshake = (
        io::Result<tokio_rustls::server::TlsStream<tokio::io::DuplexStream>>,
        io::Result<tokio_rustls::client::TlsStream<tokio::io::DuplexStream>>,
    );

    async fn handshake(server: &Tls, client: TlsConnector, name: &str) -> Handshake {
        handshake_with(server.acceptor(), client, name).await
    }

    async fn handshake_with(acceptor: TlsAcceptor, client: TlsConnector, name: &str) -> Handshake {
        let (s_io, c_io) = tokio::io::duplex(64 * 1024);
        let name = server_name(name).unwrap();
        tokio::join!(acceptor.accept(s_io), client.connect(name, c_io))
    }

    #[tokio::test]
    async fn handshake_mutual_identities() {
        let ca = new_ca("arbor test CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        let client = tls_for(&ca, &leaf(&ca, &["10.77.0.3"], Some("beta")));
        let (s, c) = handshake(&server, client.connector(), "alpha").await;
        let mut s = s.unwrap();
        let mut c = c.unwrap();
        assert_eq!(peer_identity(s.get_ref().1).unwrap(), "10.77.0.3");
        assert_eq!(peer_identity(c.get_ref().1).unwrap(), "alpha");

        c.write_all(b"ping").await.unwrap();
        c.flush().await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[tokio::test]
    async fn handshake_by_ip_address_and_tls12() {
        let ca = new_ca("arbor test CA");
        let server_leaf = leaf(&ca, &["10.77.0.2"], None);
        let server = tls_for(&ca, &server_leaf);
        let client_leaf = leaf(&ca, &["beta"], None);
        let client = tls_for(&ca, &client_leaf);
        let (s, c) = handshake(&server, client.connector(), "10.77.0.2").await;
        assert_eq!(peer_identity(s.unwrap().get_ref().1).unwrap(), "beta");
        assert_eq!(peer_identity(c.unwrap().get_ref().1).unwrap(), "10.77.0.2");

        // A TLS 1.2-only client is still accepted.
        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let chain = vec![CertificateDer::from(client_leaf.der.clone())];
        let key = PrivateKeyDer::from_pem_slice(client_leaf.key_pem.as_bytes()).unwrap();
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        let (s, c) = handshake(&server, TlsConnector::from(Arc::new(config)), "10.77.0.2").await;
        let s = s.unwrap();
        assert_eq!(
            s.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        assert_eq!(peer_identity(s.get_ref().1).unwrap(), "beta");
        assert_eq!(peer_identity(c.unwrap().get_ref().1).unwrap(), "10.77.0.2");
    }

    #[tokio::test]
    async fn handshake_refuses_client_from_other_ca() {
        let ca = new_ca("arbor test CA");
        let other = new_ca("other CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        // The intruder trusts our CA (so it accepts the server) but its own
        // certificate comes from another CA.
        let intruder_leaf = leaf(&other, &["mallory"], None);
        let bundle = format!("{}{}", ca.pem(), other.pem());
        let intruder = Tls::from_pem(
            bundle.as_bytes(),
            intruder_leaf.cert_pem.as_bytes(),
            intruder_leaf.key_pem.as_bytes(),
        )
        .unwrap();
        let (s, _c) = handshake(&server, intruder.connector(), "alpha").await;
        let Err(err) = s else {
            panic!("server must refuse the client")
        };
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    }

    #[tokio::test]
    async fn handshake_refuses_client_without_certificate() {
        let ca = new_ca("arbor test CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (s, _c) = handshake(&server, TlsConnector::from(Arc::new(config)), "alpha").await;
        let Err(err) = s else {
            panic!("server must refuse an anonymous client")
        };
        assert!(err.to_string().contains("no certificates"), "{err}");
    }

    #[tokio::test]
    async fn handshake_fails_for_wrong_server_name() {
        let ca = new_ca("arbor test CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        let client = tls_for(&ca, &leaf(&ca, &["beta"], None));
        let (s, c) = handshake(&server, client.connector(), "gamma").await;
        let Err(err) = c else {
            panic!("client must reject the server's name")
        };
        assert!(err.to_string().contains("not valid for name"), "{err}");
        assert!(s.is_err());
    }

    #[tokio::test]
    async fn handshake_client_rejects_server_from_other_ca() {
        let ca = new_ca("arbor test CA");
        let other = new_ca("other CA");
        let server = tls_for(&other, &leaf(&other, &["alpha"], None));
        let client = tls_for(&ca, &leaf(&ca, &["beta"], None));
        let (s, c) = handshake(&server, client.connector(), "alpha").await;
        let Err(err) = c else {
            panic!("client must reject an untrusted server")
        };
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
        assert!(s.is_err());
    }

    #[test]
    fn peer_identity_without_peer_certificate() {
        let ca = new_ca("arbor test CA");
        let tls = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        let conn =
            rustls::ClientConnection::new(Arc::clone(&tls.client), server_name("alpha").unwrap())
                .unwrap();
        let err = peer_identity(&conn).unwrap_err();
        assert!(matches!(err, TlsError::NoPeerCertificate), "{err}");
    }

    #[tokio::test]
    async fn client_optional_acceptor_serves_anonymous_and_verified_clients_only() {
        let ca = new_ca("arbor test CA");
        let other = new_ca("other CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha"], None));
        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let anonymous = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (s, c) = handshake_with(
            server.acceptor_client_optional(),
            TlsConnector::from(Arc::new(anonymous)),
            "alpha",
        )
        .await;
        assert!(matches!(
            peer_identity(s.unwrap().get_ref().1),
            Err(TlsError::NoPeerCertificate)
        ));
        c.unwrap();

        let client = tls_for(&ca, &leaf(&ca, &["beta"], None));
        let (s, c) = handshake_with(
            server.acceptor_client_optional(),
            client.connector(),
            "alpha",
        )
        .await;
        assert_eq!(peer_identity(s.unwrap().get_ref().1).unwrap(), "beta");
        c.unwrap();

        let intruder_leaf = leaf(&other, &["mallory"], None);
        let bundle = format!("{}{}", ca.pem(), other.pem());
        let intruder = Tls::from_pem(
            bundle.as_bytes(),
            intruder_leaf.cert_pem.as_bytes(),
            intruder_leaf.key_pem.as_bytes(),
        )
        .unwrap();
        let (s, _c) = handshake_with(
            server.acceptor_client_optional(),
            intruder.connector(),
            "alpha",
        )
        .await;
        let Err(err) = s else {
            panic!("a certificate from another CA must be refused")
        };
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    }

    #[tokio::test]
    async fn client_connector_from_files_with_and_without_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca("arbor test CA");
        let server = tls_for(&ca, &leaf(&ca, &["alpha", "Alpha.Example"], None));
        assert_eq!(server.dns_names(), ["alpha", "alpha.example"]);
        let beta = leaf(&ca, &["beta"], None);
        let files = write_set(dir.path(), &ca, &beta);

        let anonymous = client_connector(&ClientFiles {
            ca: files.ca.clone(),
            identity: None,
        })
        .unwrap();
        let (s, c) = handshake_with(server.acceptor_client_optional(), anonymous, "alpha").await;
        c.unwrap();
        assert!(matches!(
            peer_identity(s.unwrap().get_ref().1),
            Err(TlsError::NoPeerCertificate)
        ));

        let with_cert = ClientFiles {
            ca: files.ca.clone(),
            identity: Some((files.cert.clone(), files.key.clone())),
        };
        let connector = client_connector(&with_cert).unwrap();
        let (s, c) = handshake_with(server.acceptor_client_optional(), connector, "alpha").await;
        c.unwrap();
        assert_eq!(peer_identity(s.unwrap().get_ref().1).unwrap(), "beta");

        // The server's name is checked, against the CA given.
        let connector = client_connector(&with_cert).unwrap();
        let (_s, c) = handshake_with(server.acceptor_client_optional(), connector, "gamma").await;
        let Err(err) = c else {
            panic!("a server name not in its certificate must be refused")
        };
        assert!(err.to_string().contains("not valid for name"), "{err}");
        let other = new_ca("other CA");
        let stranger = tls_for(&other, &leaf(&other, &["alpha"], None));
        let connector = client_connector(&with_cert).unwrap();
        let (_s, c) = handshake_with(stranger.acceptor_client_optional(), connector, "alpha").await;
        let Err(err) = c else {
            panic!("a server from another CA must be refused")
        };
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    }

    #[test]
    fn client_connector_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = new_ca("arbor test CA");
        let beta = leaf(&ca, &["beta"], None);
        let files = write_set(dir.path(), &ca, &beta);
        let missing = client_connector(&ClientFiles {
            ca: dir.path().join("nope.pem"),
            identity: None,
        })
        .err()
        .expect("a missing CA file is an error");
        assert!(
            matches!(
                missing,
                TlsError::Missing {
                    what: "CA bundle",
                    ..
                }
            ),
            "{missing}"
        );
        assert!(missing.to_string().contains("nope.pem"), "{missing}");

        let gamma = leaf(&ca, &["gamma"], None);
        std::fs::write(&files.key, &gamma.key_pem).unwrap();
        let mismatch = client_connector(&ClientFiles {
            ca: files.ca.clone(),
            identity: Some((files.cert.clone(), files.key.clone())),
        })
        .err()
        .expect("a key of another certificate is an error");
        assert!(
            matches!(mismatch, TlsError::KeyMismatch { .. }),
            "{mismatch}"
        );

        let not_a_key = client_connector(&ClientFiles {
            ca: files.ca.clone(),
            identity: Some((files.cert.clone(), files.cert.clone())),
        })
        .err()
        .expect("a certificate as the key is an error");
        assert!(
            matches!(not_a_key, TlsError::NoPrivateKey { .. }),
            "{not_a_key}"
        );
    }
}
