//! `arbor tls init DIR`: a private CA, a server certificate and client
//! certificates, as PEM files, for a quick and correct mutual-TLS set-up
//! (docs/CLI.md § TLS files).
//!
//! One directory serves arbor (the `tls_ca`, `tls_cert`, `tls_key` config
//! keys name its files) and the GnuTLS tools (nbdkit, qemu, libnbd's
//! `tls-certificates=DIR`), which look for fixed names: those are written
//! as copies, not symlinks, so the directory can be copied anywhere.
//!
//! Everything is generated in memory first; then each file is written to a
//! temporary file in DIR and moved into place. Without `--force` nothing
//! existing is replaced, not even by a race: the move is a hard link, which
//! fails if the name is taken.

use std::fmt::Write as _;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{ErrorKind, Write as _};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
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
const CERT_MODE: u32 = 0o644;
const KEY_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Make a CA, a server certificate and client certificates (PEM, ECDSA
    /// P-256) in DIR, for arbor's tls_* keys and for nbdkit, qemu and
    /// libnbd (`tls-certificates=DIR`)
    Init(TlsInitArgs),
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
    #[arg(long = "client", value_name = "NAME", value_parser = client_name)]
    pub clients: Vec<String>,
    /// Days the server and client certificates are valid (the CA: 3650, or
    /// as long as they are if longer)
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_DAYS,
        value_parser = clap::value_parser!(u32).range(1..=36500)
    )]
    pub days: u32,
    /// Replace files DIR already has (with a new CA: what the old one
    /// signed is no longer trusted by the new files)
    #[arg(long)]
    pub force: bool,
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
struct Planned {
    name: String,
    contents: String,
    mode: u32,
    what: String,
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
    let leaf_days = args.days;
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

    // The server certificate also allows client authentication: a host's
    // one `tls_cert` serves its replication listener and its connections
    // out as a source (chains, failback).
    let server = leaf(
        &issuer,
        &hosts,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        ("server.pem", "server-key.pem"),
        now,
        leaf_days,
    )
    .context("cannot make the server certificate")?;
    let mut made_clients = Vec::new();
    for name in &clients {
        let made = leaf(
            &issuer,
            std::slice::from_ref(name),
            &[ExtendedKeyUsagePurpose::ClientAuth],
            (
                &format!("client-{name}.pem"),
                &format!("client-{name}-key.pem"),
            ),
            now,
            leaf_days,
        )
        .with_context(|| format!("cannot make the certificate of client {name:?}"))?;
        made_clients.push(made);
    }

    let plan = plan(&ca, &server, &made_clients)?;
    let dir = prepare_dir(&args.dir)?;
    refuse_existing(&dir, &plan, args.force)?;
    for file in &plan {
        write_file(&dir, file, args.force)?;
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))?;

    Ok(TlsInitReport {
        config: ConfigView {
            tls_ca: dir.join(&ca.view.cert),
            tls_cert: dir.join(&server.view.cert),
            tls_key: dir.join(&server.view.key),
        },
        files: plan
            .into_iter()
            .map(|f| FileView {
                name: f.name,
                mode: format!("{:04o}", f.mode),
                what: f.what,
            })
            .collect(),
        dir,
        ca: ca.view,
        server: server.view,
        clients: made_clients.into_iter().map(|c| c.view).collect(),
    })
}

/// The text `tls init` prints for people: what it wrote and how to use it.
pub fn human(r: &TlsInitReport) -> String {
    let dir = r.dir.display();
    let file = |name: &str| r.dir.join(name).display().to_string();
    let day = |rfc3339: &str| rfc3339.split('T').next().unwrap_or_default().to_owned();
    let mut rows = vec![
        (
            "ca.pem, ca-key.pem".to_owned(),
            format!(
                "the CA \"{}\", until {}",
                r.ca.identity,
                day(&r.ca.not_after)
            ),
        ),
        (
            format!("{}, {}", r.server.cert, r.server.key),
            format!(
                "server \"{}\" ({}), until {}",
                r.server.identity,
                r.server.names.join(", "),
                day(&r.server.not_after)
            ),
        ),
    ];
    for c in &r.clients {
        rows.push((
            format!("{}, {}", c.cert, c.key),
            format!("client \"{}\", until {}", c.identity, day(&c.not_after)),
        ));
    }
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
    let width = rows.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
    let mut t = format!("created a CA and certificates in {dir}:\n");
    for (files, what) in &rows {
        // Writing to a String cannot fail.
        let _ = writeln!(t, "  {files:width$}  {what}");
    }
    t.push_str(
        "Keys are mode 0600. ca-key.pem signs certificates that every holder of ca.pem\n\
         trusts: keep it private, or offline once you have made what you need.\n",
    );
    let _ = writeln!(
        t,
        "\nThe server (arbor serve's config file; docs/REPLICATION.md):\n  \
         tls_ca = \"{}\"\n  tls_cert = \"{}\"\n  tls_key = \"{}\"",
        r.config.tls_ca.display(),
        r.config.tls_cert.display(),
        r.config.tls_key.display()
    );
    if let Some(c) = r.clients.first() {
        let _ = writeln!(
            t,
            "A client (copy ca.pem and its two files to its host): the same tls_ca, and\n  \
             tls_cert = \"{}\"\n  tls_key = \"{}\"\n\
             The server accepts a replication source by identity:\n  \
             replication_allow = [{{ source = \"{}\", volumes = [\"*\"] }}]",
            file(&c.cert),
            file(&c.key),
            c.identity
        );
    }
    let _ = writeln!(
        t,
        "Clients must reach the server by one of its names (or `arbor replica add\n\
         --identity {}`); give --host for each name and address they use.",
        r.server.identity
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

/// A `--client`: a DNS-style name, which also names its files.
fn client_name(s: &str) -> Result<String, String> {
    if s.parse::<IpAddr>().is_ok() {
        return Err("a client is named, not addressed: give a name like alpha or backup-1".into());
    }
    if s == "cert" || s == "key" {
        return Err(format!(
            "{s:?} is reserved: client-{s}.pem is a GnuTLS file name here"
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
    let secs = |t: SystemTime| -> Result<i64> {
        let since = t
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?;
        i64::try_from(since.as_secs()).context("the system clock is out of range")
    };
    let start = secs(now - BACKDATE)?;
    let end = secs(now)? + i64::from(days) * 86_400;
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
    Ok(serial.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

fn rfc3339(t: time::OffsetDateTime) -> String {
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

/// Every file, in the order written: arbor's names, then the GnuTLS copies.
fn plan(ca: &Made, server: &Made, clients: &[Made]) -> Result<Vec<Planned>> {
    let cert = |name: &str, contents: &str, what: String| Planned {
        name: name.to_owned(),
        contents: contents.to_owned(),
        mode: CERT_MODE,
        what,
    };
    let key = |name: &str, contents: &str, what: String| Planned {
        name: name.to_owned(),
        contents: contents.to_owned(),
        mode: KEY_MODE,
        what,
    };
    let mut plan = vec![
        cert("ca.pem", &ca.cert_pem, "CA certificate".into()),
        key("ca-key.pem", &ca.key_pem, "CA private key".into()),
        cert(
            "server.pem",
            &server.cert_pem,
            "server certificate (also GnuTLS)".into(),
        ),
        key(
            "server-key.pem",
            &server.key_pem,
            "server private key (also GnuTLS)".into(),
        ),
    ];
    for c in clients {
        let who = &c.view.identity;
        plan.push(cert(
            &c.view.cert,
            &c.cert_pem,
            format!("certificate of client {who}"),
        ));
        plan.push(key(
            &c.view.key,
            &c.key_pem,
            format!("private key of client {who}"),
        ));
    }
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

fn conflict(dir: &Path, names: &[&str]) -> anyhow::Error {
    Fail::new(
        Exit::Conflict,
        format!(
            "{} already has {}: not replacing them without --force (which makes a new CA: \
             certificates the old one signed stop being trusted)",
            dir.display(),
            names.join(", ")
        ),
    )
    .into()
}

/// Without `force`, refuses if any file to be written exists.
fn refuse_existing(dir: &Path, plan: &[Planned], force: bool) -> Result<()> {
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
        Err(conflict(dir, &taken))
    }
}

/// Writes `file` into `dir` atomically: a temporary file with the final
/// mode, synced, then renamed over the name (`force`) or hard-linked to it,
/// which fails rather than replace anything.
fn write_file(dir: &Path, file: &Planned, force: bool) -> Result<()> {
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
                    Err(conflict(dir, &[file.name.as_str()]))
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
        assert!(client_name("backup-1").is_ok());
        assert!(client_name("../x").is_err());
        assert!(client_name("a/b").is_err());
        assert!(client_name("10.0.0.2").is_err());
        assert!(client_name("cert").is_err());
        assert!(client_name("key").is_err());
        assert!(client_name("*.x").is_err());
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
            days: DEFAULT_DAYS,
            force: false,
        }
    }

    fn load(dir: &Path, cert: &str, key: &str) -> arbor_tls::Tls {
        arbor_tls::Tls::load(&arbor_tls::TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(cert),
            key: dir.join(key),
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
