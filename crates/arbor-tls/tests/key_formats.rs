//! Private keys as other TLS servers (OpenSSL, GnuTLS) take them: RSA of
//! 2048 to 8192 bits, any multiple of 8 the key has (the NBD reference
//! suite's server key is 2432 bits), PKCS#1 and PKCS#8, made by `openssl
//! genrsa` and GnuTLS `certtool`; ECDSA and Ed25519. Each loads and serves
//! a real TLS handshake (TLS 1.3 and 1.2, both sides signing with it). A key
//! that is refused gets an error that says its type and size. The keys were
//! made once (tests/keys/README.md says how).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_tls::{server_name, Tls, TlsError, MAX_RSA_BITS, MIN_RSA_BITS};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose, SubjectPublicKeyInfo,
};
use rustls::crypto::aws_lc_rs;
use rustls::{ClientConfig, ProtocolVersion, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

type Ca = CertifiedIssuer<'static, KeyPair>;

fn key(file: &str) -> String {
    let path = format!("{}/tests/keys/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn new_ca() -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "arbor key test CA");
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate for `localhost` issued by `ca` to the public key of
/// `key_pem` (read through the provider arbor uses).
fn cert_for(ca: &Ca, key_pem: &str) -> rcgen::Certificate {
    let der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let signing = aws_lc_rs::default_provider()
        .key_provider
        .load_private_key(der)
        .unwrap();
    let spki = signing.public_key().unwrap();
    let public = SubjectPublicKeyInfo::from_der(spki.as_ref()).unwrap();
    let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.signed_by(&public, &**ca).unwrap()
}

/// A mutual handshake over `connector` to `tls`'s listener, then a byte
/// each way; the protocol version the server saw.
async fn handshake(tls: &Tls, connector: TlsConnector) -> ProtocolVersion {
    let (s_io, c_io) = tokio::io::duplex(64 * 1024);
    let (s, c) = tokio::join!(
        tls.acceptor().accept(s_io),
        connector.connect(server_name("localhost").unwrap(), c_io)
    );
    let (mut s, mut c) = (s.unwrap(), c.unwrap());
    c.write_all(b"?").await.unwrap();
    c.flush().await.unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).await.unwrap();
    s.write_all(b"!").await.unwrap();
    s.flush().await.unwrap();
    c.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"!");
    s.get_ref().1.protocol_version().unwrap()
}

/// A TLS 1.2-only client presenting `cert` and `key_pem`, trusting `ca`.
fn tls12_client(ca: &Ca, cert: &rcgen::Certificate, key_pem: &str) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert.der().clone()], key)
        .unwrap();
    TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_other_tls_servers_take_serve_handshakes() {
    let ca = new_ca();
    for file in [
        "rsa-2048-pkcs8.pem",
        "rsa-2432-pkcs1.pem",
        "rsa-2432-pkcs8.pem",
        "rsa-3000-pkcs1.pem",
        "rsa-4096-pkcs8.pem",
        "rsa-8192-pkcs1.pem",
        "certtool-rsa-3072.pem",
        "certtool-rsa-2432-pkcs8.pem",
        "ec-p256-sec1.pem",
        "ec-p384-pkcs8.pem",
        "ed25519-pkcs8.pem",
    ] {
        let key_pem = key(file);
        let cert = cert_for(&ca, &key_pem);
        let tls = Tls::from_pem(
            ca.pem().as_bytes(),
            cert.pem().as_bytes(),
            key_pem.as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"));
        // Both sides sign with the key: the server, and the client
        // presenting the same certificate.
        assert_eq!(
            handshake(&tls, tls.connector()).await,
            ProtocolVersion::TLSv1_3,
            "{file}"
        );
        let tls12 = tls12_client(&ca, &cert, &key_pem);
        assert_eq!(
            handshake(&tls, tls12).await,
            ProtocolVersion::TLSv1_2,
            "{file}"
        );
    }
}

/// A DER element: `tag`, its length, `content`.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let len = content.len();
    let mut out = vec![tag];
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// A PKCS#1 RSA private key of `bits` bits in form only: its numbers are
/// not a key (it is refused for its size before anything else).
fn rsa_shaped(bits: usize) -> String {
    let mut n = vec![0u8; bits / 8 + 1];
    n[1] = 0x80;
    let small = der(0x02, &[1]);
    let mut content = der(0x02, &[0]);
    content.extend(der(0x02, &n));
    for _ in 0..7 {
        content.extend_from_slice(&small);
    }
    pem::encode(&pem::Pem::new("RSA PRIVATE KEY", der(0x30, &content)))
}

/// What `Tls::from_pem` says of `key_pem`, with a good CA and certificate.
fn refusal(key_pem: &str) -> String {
    let ca = new_ca();
    let other = cert_for(&ca, &key("ec-p256-sec1.pem")).pem();
    match Tls::from_pem(ca.pem().as_bytes(), other.as_bytes(), key_pem.as_bytes()) {
        Err(e @ TlsError::BadKey { .. }) => e.to_string(),
        other => panic!("expected the key refused, got {other:?}"),
    }
}

#[test]
fn a_refused_key_is_told_why() {
    let taken = format!("arbor takes RSA keys of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits");
    for (pem, what) in [
        (
            key("rsa-1024-pkcs8.pem"),
            "an RSA key of 1024 bits (PKCS#8)",
        ),
        (rsa_shaped(8200), "an RSA key of 8200 bits (PKCS#1)"),
        (rsa_shaped(16384), "an RSA key of 16384 bits (PKCS#1)"),
        (
            key("ec-secp256k1-sec1.pem"),
            "an ECDSA key on secp256k1 (SEC1)",
        ),
        (key("ed448-pkcs8.pem"), "a key of type Ed448 (PKCS#8)"),
    ] {
        let msg = refusal(&pem);
        assert!(msg.contains(what) && msg.contains(&taken), "{msg}");
    }
}
