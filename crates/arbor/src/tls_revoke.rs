//! `arbor tls revoke DIR CERT...`: a certificate revocation list, signed
//! by the CA `arbor tls init` made in DIR, that lists CERT and every
//! certificate DIR/crl.pem listed before (docs/SECURITY.md, "Revoking a
//! certificate"). The daemons that trust the CA refuse those certificates
//! once their `tls_crl` names the list and they reload it; sessions that
//! use them are closed then.
//!
//! The list is made in memory and written over DIR/crl.pem atomically (a
//! temporary file, synced, renamed). Its number is one more than the old
//! list's, so peers that compare them take the newer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use rcgen::{
    CertificateRevocationListParams, KeyIdMethod, RevocationReason, RevokedCertParams, SerialNumber,
};
use serde::Serialize;
use time::{Duration, OffsetDateTime};

use crate::exit::{Exit, Fail};
use crate::tls_init::{bad_ca, ca_dir, hex, load_ca, rfc3339, write_file, Planned};

/// The list's file name in DIR.
pub const CRL_FILE: &str = "crl.pem";
/// Most certificates one list holds: a list is read whole by every
/// handshake's verifier, and `arbor_tls::MAX_FILE_BYTES` bounds its file.
const MAX_LISTED: usize = 10_000;

#[derive(Debug, Args)]
pub struct TlsRevokeArgs {
    /// A directory where `arbor tls init` made a CA (ca.pem, ca-key.pem)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// What to revoke: a client NAME (DIR/client-NAME.pem), a server NAME
    /// (DIR/server-NAME.pem), or the path of a PEM certificate the CA
    /// issued (repeat)
    #[arg(value_name = "CERT", required = true)]
    pub certs: Vec<String>,
    /// Days until the list's next update is due (its nextUpdate field;
    /// arbor still honours a list past it, some other TLS stacks refuse
    /// one)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 365,
        value_parser = clap::value_parser!(u32).range(1..=3650)
    )]
    pub days: u32,
}

/// What `tls revoke` did, for `--json`.
#[derive(Debug, Serialize)]
pub struct TlsRevokeReport {
    /// The list, absolute.
    pub crl: PathBuf,
    /// The list's number.
    pub number: u64,
    /// Certificates this run added to it.
    pub revoked: Vec<RevokedView>,
    /// Certificates given that it listed already.
    pub already: Vec<RevokedView>,
    /// Every certificate it lists now.
    pub listed: usize,
    /// RFC 3339, UTC.
    pub next_update: String,
}

#[derive(Debug, Serialize)]
pub struct RevokedView {
    /// What was given on the command line.
    pub given: String,
    /// The certificate's identity (first DNS name, address or CN).
    pub identity: String,
    /// Hexadecimal.
    pub serial: String,
}

/// The certificate file `given` names in `dir`.
fn cert_path(dir: &Path, given: &str) -> Result<PathBuf> {
    let as_path = PathBuf::from(given);
    if given.contains('/') || given.ends_with(".pem") {
        return Ok(as_path);
    }
    let candidates = [
        dir.join(format!("client-{given}.pem")),
        dir.join(format!("server-{given}.pem")),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            Fail::new(
                Exit::Usage,
                format!(
                    "{given}: no certificate {} or {} (give a client or server name, or a \
                     certificate's path)",
                    candidates[0].display(),
                    candidates[1].display()
                ),
            )
            .into()
        })
}

/// One PEM block of `label` from `path` (bounded), as DER.
fn read_pem(path: &Path, label: &str) -> Result<Vec<u8>> {
    let bytes = arbor_io::small_file::read_bounded(path, arbor_tls::MAX_FILE_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?
        .ok_or_else(|| Fail::new(Exit::Usage, format!("{}: no such file", path.display())))?;
    let blocks = x509_parser::pem::Pem::iter_from_buffer(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Fail::new(Exit::Usage, format!("{}: not PEM: {e}", path.display())))?;
    blocks
        .into_iter()
        .find(|b| b.label == label)
        .map(|b| b.contents)
        .ok_or_else(|| {
            Fail::new(
                Exit::Usage,
                format!("{}: no \"{label}\" PEM block in it", path.display()),
            )
            .into()
        })
}

/// `arbor tls revoke`: writes the list and says what it lists.
pub fn revoke(args: &TlsRevokeArgs) -> Result<TlsRevokeReport> {
    let dir = ca_dir(&args.dir)?;
    let ca = load_ca(&dir)?;
    let ca_der = read_pem(&dir.join("ca.pem"), "CERTIFICATE")?;
    let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der)
        .map_err(|e| bad_ca(&dir.join("ca.pem"), &format!("not a certificate: {e}")))?;
    let ca_subject = ca_cert.subject().as_raw().to_vec();
    let now = OffsetDateTime::now_utc();

    // What the old list lists stays listed.
    let crl_path = dir.join(CRL_FILE);
    let mut listed: Vec<RevokedCertParams> = Vec::new();
    let mut number = 1u64;
    if crl_path.exists() {
        let der = read_pem(&crl_path, "X509 CRL")?;
        let bad = |why: String| Fail::new(Exit::Usage, format!("{}: {why}", crl_path.display()));
        let (_, old) = x509_parser::parse_x509_crl(&der)
            .map_err(|e| bad(format!("not a revocation list: {e}")))?;
        if old.issuer().as_raw() != ca_subject.as_slice() {
            return Err(bad(format!(
                "issued by {}, not by this directory's CA: move it away first",
                old.issuer()
            ))
            .into());
        }
        number = old
            .crl_number()
            .and_then(|n| u64::try_from(n).ok())
            .map_or(1, |n| n.saturating_add(1));
        for entry in old.iter_revoked_certificates() {
            listed.push(RevokedCertParams {
                serial_number: SerialNumber::from_slice(entry.raw_serial()),
                revocation_time: entry.revocation_date.to_datetime(),
                reason_code: None,
                invalidity_date: None,
            });
        }
    }

    let mut revoked = Vec::new();
    let mut already = Vec::new();
    for given in &args.certs {
        let path = cert_path(&dir, given)?;
        let der = read_pem(&path, "CERTIFICATE")?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| {
            Fail::new(
                Exit::Usage,
                format!("{}: not a certificate: {e}", path.display()),
            )
        })?;
        if cert.issuer().as_raw() != ca_subject.as_slice() {
            return Err(Fail::new(
                Exit::Usage,
                format!(
                    "{}: issued by {}, not by the CA in {} ({}): this CA's list cannot revoke it",
                    path.display(),
                    cert.issuer(),
                    dir.display(),
                    ca.view.identity
                ),
            )
            .into());
        }
        let serial = cert.raw_serial().to_vec();
        let view = RevokedView {
            given: given.clone(),
            identity: arbor_tls::identity_of(&der).unwrap_or_default(),
            serial: hex(&serial),
        };
        if listed
            .iter()
            .any(|r| r.serial_number.as_ref() == serial.as_slice())
        {
            already.push(view);
            continue;
        }
        listed.push(RevokedCertParams {
            serial_number: SerialNumber::from_slice(&serial),
            revocation_time: now,
            reason_code: Some(RevocationReason::Unspecified),
            invalidity_date: None,
        });
        revoked.push(view);
    }
    if listed.len() > MAX_LISTED {
        return Err(Fail::new(
            Exit::Usage,
            format!(
                "the list would hold {} certificates, more than {MAX_LISTED}: issue a new CA",
                listed.len()
            ),
        )
        .into());
    }

    let next_update = now + Duration::days(i64::from(args.days));
    let count = listed.len();
    let params = CertificateRevocationListParams {
        this_update: now,
        next_update,
        crl_number: SerialNumber::from(number),
        issuing_distribution_point: None,
        revoked_certs: listed,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params
        .signed_by(&ca.issuer)
        .context("cannot sign the revocation list")?;
    let pem = crl.pem().context("cannot encode the revocation list")?;
    let file = Planned {
        name: CRL_FILE.to_owned(),
        contents: pem,
        mode: 0o644,
        what: "certificate revocation list".to_owned(),
    };
    write_file(&dir, &file, true, "")?;
    Ok(TlsRevokeReport {
        crl: crl_path,
        number,
        revoked,
        already,
        listed: count,
        next_update: rfc3339(next_update),
    })
}

/// The text `tls revoke` prints for people.
pub fn human(r: &TlsRevokeReport) -> String {
    let mut t = String::new();
    for v in &r.revoked {
        t += &format!(
            "revoked {} ({:?}, serial {})\n",
            v.given, v.identity, v.serial
        );
    }
    for v in &r.already {
        t += &format!("{} ({:?}) was listed already\n", v.given, v.identity);
    }
    t += &format!(
        "{}: list number {}, {} certificate{} listed, next update due {}\n\
         On each host that trusts this CA: tls_crl = \"{}\" in its config file, then\n  \
         arbor config reload     (or systemctl reload arbor)\n\
         which refuses these certificates and closes the sessions that use them.\n",
        r.crl.display(),
        r.number,
        r.listed,
        if r.listed == 1 { "" } else { "s" },
        &r.next_update[..10.min(r.next_update.len())],
        r.crl.display()
    );
    t
}
