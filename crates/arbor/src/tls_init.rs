//! `arbor tls init DIR`: a private CA, a server certificate and client
//! certificates, as PEM files, for a quick and correct mutual-TLS set-up
//! (docs/CLI.md § TLS files). `arbor tls add DIR`: a further server
//! certificate (another host's) or client certificates, signed by the CA
//! `tls init` made in DIR, which stays as it is.
//!
//! One directory serves arbor (the `tls_ca`, `tls_cert`, `tls_key` config
//! keys name its files) and the GnuTLS tools (nbdkit, qemu, libnbd's
//! `tls-certificates=DIR`), which look for fixed names: those are written
//! as copies, not symlinks, so the directory can be copied anywhere.
//!
//! Everything is generated in memory first; then each file is written to a
//! temporary file in DIR and moved into place. Without `--force` nothing
//! existing is replaced, not even by a race: the move is a hard link, which
//! fails if the name is taken. `tls add` writes new names only (without
//! `--force`), and checks before anything is written that ca.pem is a CA
//! and ca-key.pem its key.

use std::fmt::Write as _;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use serde::Serialize;

use crate::exit::{Exit, Fail};

/// The CA's validity, in days, unless the leaves' is longer.
pub const CA_DAYS: u32 = 3650;
/// The server and client certificates' validity by default, in days (825:
/// the longest browsers and Apple platforms accept for a server).
pub const DEFAULT_DAYS: u32 = 825;
/// The client made when no `--client` is given.
pub const DEFAULT_CLIENT: &str = "admin";

/// Certificates start being valid this long before they were made, so a
/// peer whose clock is a little behind accepts them.
const BACKDATE: Duration = Duration::from_secs(3600);
const DAY_SECS: i64 = 86_400;
/// A server certificate's extended key usages: a host's one `tls_cert`
/// serves its replication listener and its connections out as a source
/// (chains, failback).
const SERVER_USAGES: &[ExtendedKeyUsagePurpose] = &[
    ExtendedKeyUsagePurpose::ServerAuth,
    ExtendedKeyUsagePurpose::ClientAuth,
];
const CLIENT_USAGES: &[ExtendedKeyUsagePurpose] = &[ExtendedKeyUsagePurpose::ClientAuth];
/// What `--force` means, said when a file is in the way.
const INIT_FORCE: &str =
    "--force (which makes a new CA: certificates the old one signed stop being trusted)";
const ADD_FORCE: &str =
    "--force (which replaces those files only; the CA stays), or choose another NAME";
const CERT_MODE: u32 = 0o644;
const KEY_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Make a CA, a server certificate and client certificates (PEM, ECDSA
    /// P-256) in DIR, for arbor's tls_* keys and for nbdkit, qemu and
    /// libnbd (`tls-certificates=DIR`)
    Init(TlsInitArgs),
    /// Add a server certificate (for another host) or client certificates
    /// to DIR, signed by the CA `tls init` made there (ca.pem, ca-key.pem);
    /// the CA and every existing file stay as they are
    Add(TlsAddArgs),
    /// Revoke certificates the CA in DIR issued: DIR/crl.pem, signed by
    /// the CA, lists them (with every certificate it listed before); set
    /// tls_crl to it and run `arbor config reload` on each host
    Revoke(crate::tls_revoke::TlsRevokeArgs),
}

#[derive(Debug, Args)]
pub struct TlsInitArgs {
    /// Where to write the files; created with mode 0700 if missing
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// A DNS name or IP address the server certificate is valid for
    /// (repeat; give every name clients reach it by). Its identity is the
    /// first DNS name [default: this host's name, localhost, 127.0.0.1, ::1]
    #[arg(long = "host", value_name = "NAME", value_parser = host_name)]
    pub hosts: Vec<String>,
    /// A client certificate for this identity: client-NAME.pem and
    /// client-NAME-key.pem (repeat). The first is also client-cert.pem and
    /// client-key.pem [default: admin]
    #[arg(long = "client", value_name = "NAME", value_parser = cert_name)]
    pub clients: Vec<String>,
    #[command(flatten)]
    pub validity: Validity,
    /// Replace files DIR already has (with a new CA: what the old one
    /// signed is no longer trusted by the new files)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true).args(["server", "clients"])))]
pub struct TlsAddArgs {
    /// A directory where `arbor tls init` made a CA: its ca.pem and
    /// ca-key.pem sign the new certificates
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// A server certificate for the host NAME, its identity and first
    /// name: server-NAME.pem and server-NAME-key.pem (serverAuth and
    /// clientAuth, as server.pem)
    #[arg(long, value_name = "NAME", value_parser = cert_name)]
    pub server: Option<String>,
    /// A further DNS name or IP address the --server certificate is valid
    /// for (repeat; give every name other hosts reach it by)
    #[arg(
        long = "host",
        value_name = "NAME",
        value_parser = host_name,
        requires = "server"
    )]
    pub hosts: Vec<String>,
    /// A client certificate for this identity: client-NAME.pem and
    /// client-NAME-key.pem (repeat)
    #[arg(long = "client", value_name = "NAME", value_parser = cert_name)]
    pub clients: Vec<String>,
    #[command(flatten)]
    pub validity: Validity,
    /// Replace the new certificates' files if DIR has them (never the CA
    /// or any other file)
    #[arg(long)]
    pub force: bool,
}

/// The validity of the certificates `tls init` and `tls add` make.
#[derive(Debug, Args)]
pub struct Validity {
    /// Days the server and client certificates are valid (`tls init`'s
    /// CA: 3650, or as long as they are if longer; `tls add`: at most
    /// until DIR's CA expires)
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_DAYS,
        value_parser = clap::value_parser!(u32).range(1..=36500)
    )]
    pub days: u32,
}

/// What `tls init` made, for `--json`.
#[derive(Debug, Serialize)]
pub struct TlsInitReport {
    /// The directory, absolute.
    pub dir: PathBuf,
    pub ca: CertView,
    pub server: CertView,
    pub clients: Vec<CertView>,
    /// Every file written, in order.
    pub files: Vec<FileView>,
    /// The `arbor serve` config keys for a server (replication listener)
    /// using these files.
    pub config: ConfigView,
}

/// What `tls add` made, for `--json`.
#[derive(Debug, Serialize)]
pub struct TlsAddReport {
    /// The directory, absolute.
    pub dir: PathBuf,
    /// The CA that signed the new certificates (as it was: unchanged).
    pub ca: CertView,
    pub server: Option<CertView>,
    pub clients: Vec<CertView>,
    /// Every file written, in order.
    pub files: Vec<FileView>,
    /// The config keys for the host of the new server certificate, else
    /// for the first new client.
    pub config: ConfigView,
}

#[derive(Debug, Serialize)]
pub struct CertView {
    /// Its identity: the first DNS name, else the first address (the
    /// subject common name of the CA).
    pub identity: String,
    pub cert: String,
    pub key: String,
    /// Subject alternative names (none for the CA).
    pub names: Vec<String>,
    /// Extended key usages: `server_auth`, `client_auth` (none for the CA).
    pub usages: Vec<&'static str>,
    /// Hexadecimal.
    pub serial: String,
    /// RFC 3339, UTC.
    pub not_before: String,
    pub not_after: String,
}

#[derive(Debug, Serialize)]
pub struct FileView {
    pub name: String,
    /// Octal.
    pub mode: String,
    pub what: String,
}

#[derive(Debug, Serialize)]
pub struct ConfigView {
    pub tls_ca: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

/// A file to write.
pub(crate) struct Planned {
    pub(crate) name: String,
    pub(crate) contents: String,
    pub(crate) mode: u32,
    pub(crate) what: String,
}

/// A certificate and its key, made.
struct Made {
    cert_pem: String,
    key_pem: String,
    view: CertView,
}

/// `arbor tls init`: makes the files and says what it made.
pub fn init(args: &TlsInitArgs) -> Result<TlsInitReport> {
    let hosts = server_names(&args.hosts);
    let clients = client_list(&args.clients)?;

    let now = SystemTime::now();
    let leaf_days = args.validity.days;
    let ca_days = leaf_days.max(CA_DAYS);

    let host_label = hosts.first().map(String::as_str).unwrap_or("localhost");
    let ca_name = format!("arbor CA ({host_label})");
    let ca_key = KeyPair::generate().context("cannot generate the CA's key")?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = subject(&ca_name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_serial = validity(&mut ca_params, now, ca_days)?;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("cannot make the CA certificate")?;
    let ca = Made {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
        view: CertView {
            identity: ca_name,
            cert: "ca.pem".into(),
            key: "ca-key.pem".into(),
            names: Vec::new(),
            usages: Vec::new(),
            serial: ca_serial,
            not_before: rfc3339(ca_params.not_before),
            not_after: rfc3339(ca_params.not_after),
        },
    };
    let issuer = Issuer::new(ca_params, ca_key);

    let server = leaf(
        &issuer,
        &hosts,
        SERVER_USAGES,
        ("server.pem", "server-key.pem"),
        now,
        leaf_days,
    )
    .context("cannot make the server certificate")?;
    let made_clients = client_leaves(&issuer, &clients, now, leaf_days)?;

    let plan = plan(&ca, &server, &made_clients)?;
    let dir = prepare_dir(&args.dir)?;
    write_plan(&dir, &plan, args.force, INIT_FORCE)?;

    Ok(TlsInitReport {
        config: config_for(&dir, &server.view),
        files: file_views(plan),
        dir,
        ca: ca.view,
        server: server.view,
        clients: made_clients.into_iter().map(|c| c.view).collect(),
    })
}

/// `arbor tls add`: signs the new certificates with DIR's CA, writes them
/// under names DIR does not have (or, with `--force`, over those names
/// only) and says what it made. Nothing is written unless DIR's CA is one
/// that can sign and its key is ca-key.pem's.
pub fn add(args: &TlsAddArgs) -> Result<TlsAddReport> {
    let clients = distinct_clients(&args.clients)?;
    let dir = ca_dir(&args.dir)?;
    let ca = load_ca(&dir)?;
    let now = SystemTime::now();
    ca.check_days(now, args.validity.days)?;

    let server = match &args.server {
        Some(name) => {
            let names = server_names(&[std::slice::from_ref(name), &args.hosts[..]].concat());
            let files = (
                format!("server-{name}.pem"),
                format!("server-{name}-key.pem"),
            );
            let made = leaf(
                &ca.issuer,
                &names,
                SERVER_USAGES,
                (&files.0, &files.1),
                now,
                args.validity.days,
            )
            .with_context(|| format!("cannot make the certificate of server {name:?}"))?;
            Some(made)
        }
        None => None,
    };
    let made_clients = client_leaves(&ca.issuer, &clients, now, args.validity.days)?;

    let mut plan = Vec::new();
    if let Some(server) = &server {
        let who = &server.view.identity;
        plan.extend(pair_files(
            server,
            format!("certificate of server {who}"),
            format!("private key of server {who}"),
        ));
    }
    plan.extend(client_files(&made_clients));
    write_plan(&dir, &plan, args.force, ADD_FORCE)?;

    let host = server
        .as_ref()
        .or(made_clients.first())
        .context("internal error: no certificate was made")?;
    Ok(TlsAddReport {
        config: config_for(&dir, &host.view),
        files: file_views(plan),
        dir,
        ca: ca.view,
        server: server.map(|s| s.view),
        clients: made_clients.into_iter().map(|c| c.view).collect(),
    })
}

/// The config keys for the host whose certificate is `cert`.
fn config_for(dir: &Path, cert: &CertView) -> ConfigView {
    ConfigView {
        tls_ca: dir.join("ca.pem"),
        tls_cert: dir.join(&cert.cert),
        tls_key: dir.join(&cert.key),
    }
}

fn file_views(plan: Vec<Planned>) -> Vec<FileView> {
    plan.into_iter()
        .map(|f| FileView {
            name: f.name,
            mode: format!("{:04o}", f.mode),
            what: f.what,
        })
        .collect()
}

/// A client certificate for each of `names`, signed by `issuer`.
fn client_leaves(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    now: SystemTime,
    days: u32,
) -> Result<Vec<Made>> {
    names
        .iter()
        .map(|name| {
            leaf(
                issuer,
                std::slice::from_ref(name),
                CLIENT_USAGES,
                (
                    &format!("client-{name}.pem"),
                    &format!("client-{name}-key.pem"),
                ),
                now,
                days,
            )
            .with_context(|| format!("cannot make the certificate of client {name:?}"))
        })
        .collect()
}

/// DIR of `tls add`, absolute: it must exist (`tls add` never creates it).
pub(crate) fn ca_dir(dir: &Path) -> Result<PathBuf> {
    match std::fs::canonicalize(dir) {
        Ok(path) if path.is_dir() => Ok(path),
        Ok(_) => {
            Err(Fail::new(Exit::Usage, format!("{} is not a directory", dir.display())).into())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Err(no_ca(dir, "ca.pem")),
        Err(e) => Err(e).with_context(|| format!("cannot use {}", dir.display())),
    }
}

fn no_ca(dir: &Path, missing: &str) -> anyhow::Error {
    Fail::new(
        Exit::Usage,
        format!(
            "{} has no CA to sign with: {missing} is missing (`arbor tls init DIR` makes one)",
            dir.display()
        ),
    )
    .into()
}

/// DIR's CA, checked and ready to sign.
pub(crate) struct Ca {
    pub(crate) issuer: Issuer<'static, KeyPair>,
    pub(crate) view: CertView,
    /// Unix time.
    not_after: i64,
}

/// Reads ca.pem and ca-key.pem of `dir` (at most
/// [`arbor_tls::MAX_FILE_BYTES`] each) and checks that ca.pem is one
/// certificate, a CA's that may sign certificates, and that ca-key.pem
/// is its key.
pub(crate) fn load_ca(dir: &Path) -> Result<Ca> {
    let read = |name: &str| -> Result<String> {
        let path = dir.join(name);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(no_ca(dir, name)),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let mut bytes = Vec::new();
        file.take(arbor_tls::MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if bytes.len() as u64 > arbor_tls::MAX_FILE_BYTES {
            return Err(bad_ca(
                &path,
                &format!("larger than {} bytes", arbor_tls::MAX_FILE_BYTES),
            ));
        }
        String::from_utf8(bytes).map_err(|_| bad_ca(&path, "not PEM text"))
    };
    let cert_pem = read("ca.pem")?;
    let key_pem = read("ca-key.pem")?;
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca-key.pem");

    let blocks = x509_parser::pem::Pem::iter_from_buffer(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_ca(&cert_path, &format!("not PEM: {e}")))?;
    let pem = match &blocks[..] {
        [one] if one.label == "CERTIFICATE" => one,
        [] | [_] => return Err(bad_ca(&cert_path, "no certificate in it")),
        _ => {
            return Err(bad_ca(
                &cert_path,
                &format!(
                    "{} PEM blocks; tls add signs with the one CA certificate tls init wrote",
                    blocks.len()
                ),
            ))
        }
    };
    let x509 = pem
        .parse_x509()
        .map_err(|e| bad_ca(&cert_path, &format!("not an X.509 certificate: {e}")))?;
    let is_ca = x509
        .basic_constraints()
        .map_err(|e| bad_ca(&cert_path, &format!("bad basicConstraints: {e}")))?
        .is_some_and(|bc| bc.value.ca);
    if !is_ca {
        return Err(bad_ca(
            &cert_path,
            "not a CA certificate (no basicConstraints CA:TRUE): it cannot sign certificates",
        ));
    }
    let key_usage = x509
        .key_usage()
        .map_err(|e| bad_ca(&cert_path, &format!("bad keyUsage: {e}")))?;
    if key_usage.is_some_and(|ku| !ku.value.key_cert_sign()) {
        return Err(bad_ca(
            &cert_path,
            "its key usage lacks keyCertSign: it cannot sign certificates",
        ));
    }
    let key = KeyPair::from_pem(&key_pem).map_err(|e| {
        bad_ca(
            &key_path,
            &format!("not a private key arbor can sign with: {e}"),
        )
    })?;
    if key.public_key_raw() != &*x509.public_key().subject_public_key.data {
        return Err(Fail::new(
            Exit::Usage,
            format!(
                "{} is not the key of {}: it cannot sign for that CA",
                key_path.display(),
                cert_path.display()
            ),
        )
        .into());
    }

    let validity = x509.validity();
    let view = CertView {
        identity: x509
            .subject()
            .iter_common_name()
            .find_map(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned(),
        cert: "ca.pem".into(),
        key: "ca-key.pem".into(),
        names: Vec::new(),
        usages: Vec::new(),
        serial: hex(x509.raw_serial()),
        not_before: rfc3339(validity.not_before.to_datetime()),
        not_after: rfc3339(validity.not_after.to_datetime()),
    };
    let not_after = validity.not_after.timestamp();
    let issuer = Issuer::from_ca_cert_der(&pem.contents.clone().into(), key)
        .map_err(|e| bad_ca(&cert_path, &format!("cannot sign with it: {e}")))?;
    Ok(Ca {
        issuer,
        view,
        not_after,
    })
}

pub(crate) fn bad_ca(path: &Path, why: &str) -> anyhow::Error {
    Fail::new(Exit::Usage, format!("{}: {why}", path.display())).into()
}

impl Ca {
    /// Refuses `days` of validity from `now` past the CA's own.
    fn check_days(&self, now: SystemTime, days: u32) -> Result<()> {
        let left = self.not_after.saturating_sub(unix_secs(now)?);
        let until = self
            .view
            .not_after
            .split('T')
            .next()
            .unwrap_or_default()
            .to_owned();
        if left < DAY_SECS {
            return Err(Fail::new(
                Exit::Usage,
                format!(
                    "the CA (ca.pem) is valid until {until}: it cannot sign for a day more;                      make a new one with `arbor tls init` in another directory"
                ),
            )
            .into());
        }
        let most = left / DAY_SECS;
        if i64::from(days) > most {
            return Err(Fail::new(
                Exit::Usage,
                format!(
                    "--days {days} goes past the CA's expiry ({until}): give --days {most} at most"
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// The day of an RFC 3339 time.
fn day(rfc3339: &str) -> &str {
    rfc3339.split('T').next().unwrap_or_default()
}

/// A row of the table of files: a server's with its names.
fn server_row(s: &CertView) -> (String, String) {
    (
        format!("{}, {}", s.cert, s.key),
        format!(
            "server \"{}\" ({}), until {}",
            s.identity,
            s.names.join(", "),
            day(&s.not_after)
        ),
    )
}

fn client_rows(clients: &[CertView]) -> impl Iterator<Item = (String, String)> + '_ {
    clients.iter().map(|c| {
        (
            format!("{}, {}", c.cert, c.key),
            format!("client \"{}\", until {}", c.identity, day(&c.not_after)),
        )
    })
}

/// The rows, aligned, two spaces in.
fn table(t: &mut String, rows: &[(String, String)]) {
    let width = rows.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
    for (files, what) in rows {
        // Writing to a String cannot fail.
        let _ = writeln!(t, "  {files:width$}  {what}");
    }
}

/// How a client host uses its files.
fn client_use(t: &mut String, dir: &Path, c: &CertView) {
    let _ = writeln!(
        t,
        "A client (copy ca.pem and its two files to its host): the same tls_ca, and\n  \
         tls_cert = \"{}\"\n  tls_key = \"{}\"\n\
         The server accepts a replication source by identity:\n  \
         replication_allow = [{{ source = \"{}\", volumes = [\"*\"] }}]",
        dir.join(&c.cert).display(),
        dir.join(&c.key).display(),
        c.identity
    );
}

/// A server's config keys.
fn server_use(t: &mut String, heading: &str, config: &ConfigView, identity: &str) {
    let _ = writeln!(
        t,
        "\n{heading}:\n  \
         tls_ca = \"{}\"\n  tls_cert = \"{}\"\n  tls_key = \"{}\"",
        config.tls_ca.display(),
        config.tls_cert.display(),
        config.tls_key.display()
    );
    let _ = writeln!(
        t,
        "Clients must reach the server by one of its names (or `arbor replica add\n\
         --identity {identity}`); give --host for each name and address they use."
    );
}

/// The text `tls add` prints for people: what it wrote and how to use it.
pub fn add_human(r: &TlsAddReport) -> String {
    let mut rows: Vec<(String, String)> = r.server.iter().map(server_row).collect();
    rows.extend(client_rows(&r.clients));
    let mut t = format!(
        "signed by the CA \"{}\" (ca.pem, until {}) in {}:\n",
        r.ca.identity,
        day(&r.ca.not_after),
        r.dir.display()
    );
    table(&mut t, &rows);
    t.push_str("Keys are mode 0600. The CA and the other files in the directory are unchanged.\n");
    if let Some(s) = &r.server {
        server_use(
            &mut t,
            &format!(
                "The host \"{}\" (copy ca.pem and its two files there), in arbor serve's\n\
                 config file, for its replication listener and as a source (other hosts\n\
                 allow it as source = \"{}\")",
                s.identity, s.identity
            ),
            &r.config,
            &s.identity,
        );
    } else if let Some(c) = r.clients.first() {
        t.push('\n');
        client_use(&mut t, &r.dir, c);
    }
    t
}

/// The text `tls init` prints for people: what it wrote and how to use it.
pub fn human(r: &TlsInitReport) -> String {
    let dir = r.dir.display();
    let mut rows = vec![
        (
            "ca.pem, ca-key.pem".to_owned(),
            format!(
                "the CA \"{}\", until {}",
                r.ca.identity,
                day(&r.ca.not_after)
            ),
        ),
        server_row(&r.server),
    ];
    rows.extend(client_rows(&r.clients));
    if let Some(first) = r.clients.first() {
        rows.push((
            "ca-cert.pem, server-cert.pem,".to_owned(),
            "copies named for GnuTLS (nbdkit, qemu, libnbd);".to_owned(),
        ));
        rows.push((
            "client-cert.pem, client-key.pem".to_owned(),
            format!("the client is \"{}\"", first.identity),
        ));
    }
    let mut t = format!("created a CA and certificates in {dir}:\n");
    table(&mut t, &rows);
    t.push_str(
        "Keys are mode 0600. ca-key.pem signs certificates that every holder of ca.pem\n\
         trusts: keep it private, or offline once you have made what you need.\n",
    );
    server_use(
        &mut t,
        "The server (arbor serve's config file; docs/REPLICATION.md)",
        &r.config,
        &r.server.identity,
    );
    if let Some(c) = r.clients.first() {
        client_use(&mut t, &r.dir, c);
    }
    let _ = writeln!(
        t,
        "Other hosts, with their own server certificate from this CA:\n  \
         arbor tls add {dir} --server NAME --host ADDRESS"
    );
    let _ = writeln!(
        t,
        "\nNBD tools take the whole directory:\n  \
         nbdkit --tls=require --tls-verify-peer --tls-certificates={dir} ...\n  \
         nbdinfo 'nbds://{}/?tls-certificates={dir}'\n  \
         qemu: --object tls-creds-x509,id=tls0,endpoint=server|client,dir={dir}",
        r.server.identity
    );
    t
}

/// The server's names: those given, or this host's name and loopback. A
/// DNS name comes first, as it is the identity arbor sees.
fn server_names(given: &[String]) -> Vec<String> {
    let mut names: Vec<String> = if given.is_empty() {
        let mut defaults = Vec::new();
        if let Some(host) = this_host() {
            defaults.push(host);
        }
        defaults.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
        defaults
    } else {
        given.to_vec()
    };
    // Duplicates out (names compare without case, addresses by value),
    // keeping the first.
    let mut seen: Vec<String> = Vec::new();
    names.retain(|n| {
        let key = match n.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => n.to_ascii_lowercase(),
        };
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    names
}

/// This host's name, if it is one a certificate can carry (not `localhost`).
fn this_host() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (name != "localhost" && host_name(name).is_ok() && name.parse::<IpAddr>().is_err())
        .then(|| name.to_owned())
}

fn client_list(given: &[String]) -> Result<Vec<String>> {
    if given.is_empty() {
        return Ok(vec![DEFAULT_CLIENT.to_owned()]);
    }
    distinct_clients(given)
}

/// `given`, refused if a name is there twice.
fn distinct_clients(given: &[String]) -> Result<Vec<String>> {
    let mut list: Vec<String> = Vec::new();
    for name in given {
        if list.contains(name) {
            return Err(Fail::new(Exit::Usage, format!("--client {name} is given twice")).into());
        }
        list.push(name.clone());
    }
    Ok(list)
}

/// A `--host`: an IP address, or a DNS name (`*.` allowed first).
fn host_name(s: &str) -> Result<String, String> {
    if s.parse::<IpAddr>().is_ok() {
        return Ok(s.to_owned());
    }
    let name = s.strip_prefix("*.").unwrap_or(s);
    dns_name(name).map(|()| s.to_owned())
}

/// A `--client` or `tls add --server`: a DNS-style name, which also names
/// its files (`client-NAME.pem`, `client-NAME-key.pem`; `server-...`), so
/// none may be another's: not `cert` or `key` (GnuTLS's `client-cert.pem`,
/// `server-key.pem`, ...), nor ending in `-key`.
fn cert_name(s: &str) -> Result<String, String> {
    if s.parse::<IpAddr>().is_ok() {
        return Err(
            "a certificate is named, not addressed: give a name like alpha or backup-1 \
             (--host adds a server's addresses)"
                .into(),
        );
    }
    if s == "cert" || s == "key" {
        return Err(format!(
            "{s:?} is reserved: client-{s}.pem and server-{s}.pem are GnuTLS file names here"
        ));
    }
    if s.ends_with("-key") {
        return Err(format!(
            "{s:?} is reserved: its files would be named as the key of {:?}",
            s.trim_end_matches("-key")
        ));
    }
    dns_name(s).map(|()| s.to_owned())
}

/// Letters, digits, `-` and `_` in labels of 1 to 63 characters joined by
/// dots, at most 253 characters, no label starting or ending with `-`.
fn dns_name(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{s:?} is not a DNS name: {why}"));
    if s.is_empty() || s.len() > 253 {
        return bad("it must be 1 to 253 characters");
    }
    for label in s.split('.') {
        if label.is_empty() || label.len() > 63 {
            return bad("each dot-separated part must be 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return bad("only letters, digits, '-', '_' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("no part may start or end with '-'");
        }
    }
    Ok(())
}

fn subject(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Sets `params`' validity (from an hour ago to `days` from now) and a
/// random serial number; returns the serial in hex.
fn validity(params: &mut CertificateParams, now: SystemTime, days: u32) -> Result<String> {
    let start = unix_secs(now - BACKDATE)?;
    let end = unix_secs(now)? + i64::from(days) * DAY_SECS;
    let at = |t: i64| {
        time::OffsetDateTime::from_unix_timestamp(t)
            .with_context(|| format!("{t} is out of range for a certificate date"))
    };
    params.not_before = at(start)?;
    params.not_after = at(end)?;
    // 16 random bytes, positive and without a leading zero byte (RFC 5280
    // asks for a positive serial of at most 20 bytes).
    let mut serial: [u8; 16] = rand::random();
    serial[0] = (serial[0] & 0x7f).max(1);
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    Ok(hex(&serial))
}

fn unix_secs(t: SystemTime) -> Result<i64> {
    let since = t
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    i64::try_from(since.as_secs()).context("the system clock is out of range")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn rfc3339(t: time::OffsetDateTime) -> String {
    let secs = u64::try_from(t.unix_timestamp()).unwrap_or(0);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// A server or client certificate for `names` (the first is its subject
/// common name and identity), signed by `issuer`.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    usages: &[ExtendedKeyUsagePurpose],
    (cert_file, key_file): (&str, &str),
    now: SystemTime,
    days: u32,
) -> Result<Made> {
    let key = KeyPair::generate().context("cannot generate a key")?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ia5String::try_from(n.as_str())
                .map(SanType::DnsName)
                .with_context(|| format!("{n:?} cannot be a DNS name")),
        })
        .collect::<Result<_>>()?;
    let identity = identity(names);
    params.distinguished_name = subject(&identity);
    params.is_ca = IsCa::ExplicitNoCa;
    // keyEncipherment means nothing for an ECDSA key, but qemu's
    // tls-creds-x509 refuses a certificate whose (critical) key usage lacks
    // it; GnuTLS, OpenSSL and rustls accept it.
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    params.use_authority_key_identifier_extension = true;
    let serial = validity(&mut params, now, days)?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Made {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        view: CertView {
            identity,
            cert: cert_file.to_owned(),
            key: key_file.to_owned(),
            names: names.to_vec(),
            usages: usages
                .iter()
                .map(|u| match u {
                    ExtendedKeyUsagePurpose::ServerAuth => "server_auth",
                    ExtendedKeyUsagePurpose::ClientAuth => "client_auth",
                    _ => "other",
                })
                .collect(),
            serial,
            not_before: rfc3339(params.not_before),
            not_after: rfc3339(params.not_after),
        },
    })
}

/// The identity arbor's TLS sees in a certificate for `names`: the first
/// DNS name, else the first address.
fn identity(names: &[String]) -> String {
    names
        .iter()
        .find(|n| n.parse::<IpAddr>().is_err())
        .or(names.first())
        .cloned()
        .unwrap_or_default()
}

fn cert(name: &str, contents: &str, what: String) -> Planned {
    Planned {
        name: name.to_owned(),
        contents: contents.to_owned(),
        mode: CERT_MODE,
        what,
    }
}

fn key(name: &str, contents: &str, what: String) -> Planned {
    Planned {
        name: name.to_owned(),
        contents: contents.to_owned(),
        mode: KEY_MODE,
        what,
    }
}

/// The certificate's and the key's file of `made`.
fn pair_files(made: &Made, cert_what: String, key_what: String) -> [Planned; 2] {
    [
        cert(&made.view.cert, &made.cert_pem, cert_what),
        key(&made.view.key, &made.key_pem, key_what),
    ]
}

fn client_files(clients: &[Made]) -> Vec<Planned> {
    clients
        .iter()
        .flat_map(|c| {
            let who = &c.view.identity;
            pair_files(
                c,
                format!("certificate of client {who}"),
                format!("private key of client {who}"),
            )
        })
        .collect()
}

/// Every file, in the order written: arbor's names, then the GnuTLS copies.
fn plan(ca: &Made, server: &Made, clients: &[Made]) -> Result<Vec<Planned>> {
    let mut plan = Vec::from(pair_files(
        ca,
        "CA certificate".into(),
        "CA private key".into(),
    ));
    plan.extend(pair_files(
        server,
        "server certificate (also GnuTLS)".into(),
        "server private key (also GnuTLS)".into(),
    ));
    plan.extend(client_files(clients));
    let first = clients
        .first()
        .context("internal error: no client certificate was made")?;
    let who = &first.view.identity;
    plan.extend([
        cert("ca-cert.pem", &ca.cert_pem, "GnuTLS: copy of ca.pem".into()),
        cert(
            "server-cert.pem",
            &server.cert_pem,
            "GnuTLS: copy of server.pem".into(),
        ),
        cert(
            "client-cert.pem",
            &first.cert_pem,
            format!("GnuTLS: copy of {}", first.view.cert),
        ),
        key(
            "client-key.pem",
            &first.key_pem,
            format!("GnuTLS: copy of {} (client {who})", first.view.key),
        ),
    ]);
    Ok(plan)
}

/// Creates `dir` (mode 0700) if missing; returns it absolute.
fn prepare_dir(dir: &Path) -> Result<PathBuf> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(Fail::new(
                Exit::Conflict,
                format!("{} exists and is not a directory", dir.display()),
            )
            .into())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            // The umask may have taken bits the owner needs.
            std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
                .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
        }
        Err(e) => return Err(e).with_context(|| format!("cannot use {}", dir.display())),
    }
    std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))
}

/// `force` says what `--force` would do.
fn conflict(dir: &Path, names: &[&str], force: &str) -> anyhow::Error {
    Fail::new(
        Exit::Conflict,
        format!(
            "{} already has {}: not replacing them without {force}",
            dir.display(),
            names.join(", ")
        ),
    )
    .into()
}

/// Writes every file of `plan` into `dir` (see [`write_file`]), then syncs
/// `dir`. Without `force`, nothing is written if any of them exists, and
/// if one cannot be written those written before it are removed again.
/// `force_hint` says what `--force` would do.
fn write_plan(dir: &Path, plan: &[Planned], force: bool, force_hint: &str) -> Result<()> {
    refuse_existing(dir, plan, force, force_hint)?;
    for (i, file) in plan.iter().enumerate() {
        if let Err(e) = write_file(dir, file, force, force_hint) {
            if !force {
                // Only names this run created (a hard link fails on any
                // other), so nothing of anyone else's goes.
                for done in &plan[..i] {
                    let _ = std::fs::remove_file(dir.join(&done.name));
                }
            }
            return Err(e);
        }
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// Without `force`, refuses if any file to be written exists.
fn refuse_existing(dir: &Path, plan: &[Planned], force: bool, force_hint: &str) -> Result<()> {
    if force {
        return Ok(());
    }
    let mut taken = Vec::new();
    for file in plan {
        let path = dir.join(&file.name);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => taken.push(file.name.as_str()),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot check {}", path.display())),
        }
    }
    if taken.is_empty() {
        Ok(())
    } else {
        Err(conflict(dir, &taken, force_hint))
    }
}

/// Writes `file` into `dir` atomically: a temporary file with the final
/// mode, synced, then renamed over the name (`force`) or hard-linked to it,
/// which fails rather than replace anything.
pub(crate) fn write_file(dir: &Path, file: &Planned, force: bool, force_hint: &str) -> Result<()> {
    let path = dir.join(&file.name);
    let tmp = dir.join(format!(".{}.{:016x}.tmp", file.name, rand::random::<u64>()));
    let result = (|| -> Result<()> {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        // Exactly this mode, whatever the umask.
        out.set_permissions(Permissions::from_mode(file.mode))
            .with_context(|| format!("cannot set the mode of {}", tmp.display()))?;
        out.write_all(file.contents.as_bytes())
            .and_then(|()| out.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        if force {
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("cannot replace {}", path.display()))
        } else {
            match std::fs::hard_link(&tmp, &path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    Err(conflict(dir, &[file.name.as_str()], force_hint))
                }
                Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
            }
        }
    })();
    // After a rename there is nothing left to remove; otherwise the
    // temporary file goes, whether the link worked or not.
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(host_name("beta").is_ok());
        assert!(host_name("beta.example.com").is_ok());
        assert!(host_name("*.example.com").is_ok());
        assert!(host_name("10.0.0.2").is_ok());
        assert!(host_name("fd00::2").is_ok());
        assert!(host_name("").is_err());
        assert!(host_name("a b").is_err());
        assert!(host_name("-a").is_err());
        assert!(host_name("a..b").is_err());
        assert!(host_name(&"a".repeat(64)).is_err());
        assert!(cert_name("backup-1").is_ok());
        assert!(cert_name("../x").is_err());
        assert!(cert_name("a/b").is_err());
        assert!(cert_name("10.0.0.2").is_err());
        assert!(cert_name("cert").is_err());
        assert!(cert_name("key").is_err());
        assert!(cert_name("*.x").is_err());
        assert!(cert_name("alpha-key").is_err());
        assert!(cert_name("alpha-keys").is_ok());
    }

    #[test]
    fn server_names_drop_duplicates_and_identity_is_the_first_dns_name() {
        let given: Vec<String> = ["10.0.0.2", "Beta", "beta", "::1", "0:0::1", "gamma"]
            .map(String::from)
            .to_vec();
        let names = server_names(&given);
        assert_eq!(names, ["10.0.0.2", "Beta", "::1", "gamma"]);
        assert_eq!(identity(&names), "Beta");
        assert_eq!(identity(&["10.0.0.2".to_owned()]), "10.0.0.2");
        let defaults = server_names(&[]);
        assert!(defaults.ends_with(&["localhost".into(), "127.0.0.1".into(), "::1".into()]));
    }

    fn args(dir: &Path, hosts: &[&str], clients: &[&str]) -> TlsInitArgs {
        TlsInitArgs {
            dir: dir.to_owned(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            clients: clients.iter().map(|c| c.to_string()).collect(),
            validity: Validity { days: DEFAULT_DAYS },
            force: false,
        }
    }

    fn load(dir: &Path, cert: &str, key: &str) -> arbor_tls::Tls {
        arbor_tls::Tls::load(&arbor_tls::TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(cert),
            key: dir.join(key),
            crl: None,
        })
        .unwrap_or_else(|e| panic!("{cert}: {e}"))
    }

    /// A mutual handshake of `client` with `server` reached as `name`:
    /// the identities each side sees of the other.
    async fn handshake(
        server: &arbor_tls::Tls,
        client: &arbor_tls::Tls,
        name: &str,
    ) -> std::io::Result<(String, String)> {
        use arbor_tls::{peer_identity, server_name};
        let (s_io, c_io) = tokio::io::duplex(64 * 1024);
        let name = server_name(name).unwrap();
        let (s, c) = tokio::join!(
            server.acceptor().accept(s_io),
            client.connector().connect(name, c_io)
        );
        let (s, c) = (s?, c?);
        Ok((
            peer_identity(s.get_ref().1).unwrap(),
            peer_identity(c.get_ref().1).unwrap(),
        ))
    }

    /// The replication listener's TLS (arbor_tls, rustls) takes
    /// the files as they are: identities, names, usages, chains.
    #[tokio::test]
    async fn arbor_replica_tls_accepts_the_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let report = init(&args(&dir, &["10.0.0.2", "beta"], &["alpha", "admin"])).unwrap();
        assert_eq!(report.server.identity, "beta");
        assert_eq!(report.server.names, ["10.0.0.2", "beta"]);
        let server = load(&dir, "server.pem", "server-key.pem");
        assert_eq!(server.identity(), "beta");
        let alpha = load(&dir, "client-alpha.pem", "client-alpha-key.pem");
        assert_eq!(alpha.identity(), "alpha");
        assert_eq!(
            load(&dir, "client-cert.pem", "client-key.pem").identity(),
            "alpha"
        );
        assert_eq!(
            load(&dir, "client-admin.pem", "client-admin-key.pem").identity(),
            "admin"
        );

        for name in ["beta", "10.0.0.2"] {
            let seen = handshake(&server, &alpha, name).await.unwrap();
            assert_eq!(seen, ("alpha".to_owned(), "beta".to_owned()), "{name}");
        }
        // The server's certificate also works as a client's (a host that
        // both receives and sends replicas has one tls_cert).
        let seen = handshake(&server, &server, "beta").await.unwrap();
        assert_eq!(seen, ("beta".to_owned(), "beta".to_owned()));
        // A name the server's certificate lacks is refused.
        assert!(handshake(&server, &alpha, "gamma").await.is_err());
        // A client certificate is not a server's.
        assert!(handshake(&alpha, &server, "alpha").await.is_err());

        // Another CA's files do not mix with these.
        let other_dir = tmp.path().join("other");
        init(&args(&other_dir, &["beta"], &[])).unwrap();
        let intruder = load(&other_dir, "client-admin.pem", "client-admin-key.pem");
        assert!(handshake(&server, &intruder, "beta").await.is_err());
    }

    #[tokio::test]
    async fn the_default_server_is_reached_on_loopback() {
        let tmp = tempfile::tempdir().unwrap();
        let report = init(&args(tmp.path(), &[], &[])).unwrap();
        assert_eq!(report.clients.len(), 1);
        assert_eq!(report.clients[0].identity, "admin");
        let server = load(tmp.path(), "server.pem", "server-key.pem");
        let admin = load(tmp.path(), "client-admin.pem", "client-admin-key.pem");
        for name in ["localhost", "127.0.0.1", "::1"] {
            let seen = handshake(&server, &admin, name).await.unwrap();
            assert_eq!(seen.0, "admin", "{name}");
            assert_eq!(seen.1, server.identity(), "{name}");
        }
    }

    #[test]
    fn clients_default_and_must_differ() {
        assert_eq!(client_list(&[]).unwrap(), ["admin"]);
        let twice = client_list(&["a".into(), "a".into()]).unwrap_err();
        assert_eq!(Exit::of(&twice), Exit::Usage);
    }
}
