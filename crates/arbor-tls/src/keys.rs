//! Which private keys arbor's TLS signs with, and exactly why one is refused.
//!
//! Keys are loaded by the crypto provider (aws-lc-rs); this module only
//! reads a refused key's type and size from its DER structure (PKCS#1,
//! PKCS#8 or SEC1) to say what it is and what would be taken instead.

use rustls_pki_types::PrivateKeyDer;
use x509_parser::asn1_rs::{Any, FromDer, Tag};

/// Smallest RSA modulus the provider signs with, in bits.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus the provider signs with, in bits.
pub const MAX_RSA_BITS: usize = 8192;

/// What keys are taken, for refusals.
const TAKEN: &str = "arbor takes RSA keys of 2048 to 8192 bits, ECDSA keys on P-256, P-384 \
                     or P-521, and Ed25519 keys";

const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_RSA_PSS: &str = "1.2.840.113549.1.1.10";
const OID_EC: &str = "1.2.840.10045.2.1";
const OID_ED25519: &str = "1.3.101.112";

/// Named key algorithms and curves, by object identifier.
const NAMES: [(&str, &str); 10] = [
    (OID_RSA, "RSA"),
    (OID_RSA_PSS, "RSA-PSS"),
    (OID_EC, "ECDSA"),
    (OID_ED25519, "Ed25519"),
    ("1.3.101.113", "Ed448"),
    ("1.2.840.10040.4.1", "DSA"),
    ("1.2.840.10045.3.1.7", "P-256"),
    ("1.3.132.0.34", "P-384"),
    ("1.3.132.0.35", "P-521"),
    ("1.3.132.0.10", "secp256k1"),
];

fn name_of(oid: &str) -> String {
    NAMES
        .iter()
        .find(|(o, _)| *o == oid)
        .map_or_else(|| format!("OID {oid}"), |(_, name)| (*name).to_owned())
}

/// The DER elements inside `content`, in order.
fn elements(content: &[u8]) -> Option<Vec<Any<'_>>> {
    let mut items = Vec::new();
    let mut rest = content;
    while !rest.is_empty() {
        let (next, item) = Any::from_der(rest).ok()?;
        items.push(item);
        rest = next;
    }
    Some(items)
}

/// The elements of the DER SEQUENCE `der`.
fn sequence(der: &[u8]) -> Option<Vec<Any<'_>>> {
    let (_, seq) = Any::from_der(der).ok()?;
    if seq.tag() != Tag::Sequence {
        return None;
    }
    elements(seq.data)
}

fn oid_of(any: &Any<'_>) -> Option<String> {
    any.clone().oid().ok().map(|o| o.to_id_string())
}

/// Bits of a positive DER INTEGER's value.
fn integer_bits(any: &Any<'_>) -> Option<usize> {
    if any.tag() != Tag::Integer {
        return None;
    }
    let bytes = any.data;
    let start = bytes.iter().position(|&b| b != 0)?;
    let first = bytes[start];
    Some((bytes.len() - start - 1) * 8 + (8 - first.leading_zeros() as usize))
}

/// The modulus size of a PKCS#1 RSAPrivateKey.
fn rsa_bits(pkcs1: &[u8]) -> Option<usize> {
    integer_bits(sequence(pkcs1)?.get(1)?)
}

/// What a key is, as far as its structure says.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Rsa(Option<usize>),
    Ec(Option<String>),
    Other(String),
}

fn kind_of(key: &PrivateKeyDer<'_>) -> Option<Kind> {
    match key {
        PrivateKeyDer::Pkcs1(k) => Some(Kind::Rsa(rsa_bits(k.secret_pkcs1_der()))),
        PrivateKeyDer::Sec1(k) => {
            // ECPrivateKey: version, key, [0] curve, [1] public key.
            let items = sequence(k.secret_sec1_der())?;
            let curve = items
                .iter()
                .find(|i| i.header.raw_tag() == Some(&[0xa0]))
                .and_then(|params| elements(params.data))
                .and_then(|inner| oid_of(inner.first()?));
            Some(Kind::Ec(curve))
        }
        PrivateKeyDer::Pkcs8(k) => {
            // PrivateKeyInfo: version, AlgorithmIdentifier, key, ...
            let items = sequence(k.secret_pkcs8_der())?;
            let algorithm = elements(items.get(1)?.data)?;
            let oid = oid_of(algorithm.first()?)?;
            Some(match oid.as_str() {
                OID_RSA => Kind::Rsa(rsa_bits(items.get(2)?.data)),
                OID_EC => Kind::Ec(algorithm.get(1).and_then(oid_of)),
                _ => Kind::Other(oid),
            })
        }
        _ => None,
    }
}

fn format_of(key: &PrivateKeyDer<'_>) -> &'static str {
    match key {
        PrivateKeyDer::Pkcs1(_) => "PKCS#1",
        PrivateKeyDer::Sec1(_) => "SEC1",
        _ => "PKCS#8",
    }
}

/// Why the provider refused `key` (`error`: what it said): the key's type
/// and size, and what is taken instead.
pub(crate) fn refusal(key: &PrivateKeyDer<'_>, error: &rustls::Error) -> String {
    let format = format_of(key);
    match kind_of(key) {
        Some(Kind::Rsa(Some(bits))) if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) => {
            format!("an RSA key of {bits} bits ({format}): {TAKEN}")
        }
        Some(Kind::Rsa(Some(bits))) => format!(
            "an RSA key of {bits} bits ({format}) that the crypto library refuses ({}): \
             {TAKEN}",
            rsa_rejection(key)
        ),
        Some(Kind::Ec(Some(curve))) => {
            format!("an ECDSA key on {} ({format}): {TAKEN}", name_of(&curve))
        }
        Some(Kind::Other(oid)) => {
            format!("a key of type {} ({format}): {TAKEN}", name_of(&oid))
        }
        Some(Kind::Rsa(None) | Kind::Ec(None)) | None => {
            format!("not a well-formed {format} private key ({error}): {TAKEN}")
        }
    }
}

/// What aws-lc says of an RSA key it refuses.
fn rsa_rejection(key: &PrivateKeyDer<'_>) -> String {
    let loaded = match key {
        PrivateKeyDer::Pkcs1(k) => aws_lc_rs::rsa::KeyPair::from_der(k.secret_pkcs1_der()),
        PrivateKeyDer::Pkcs8(k) => aws_lc_rs::rsa::KeyPair::from_pkcs8(k.secret_pkcs8_der()),
        _ => return "not an RSA key".into(),
    };
    match loaded {
        Ok(_) => "unknown reason".into(),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn names_what_a_key_is() {
        let pem = |s: &str| PrivateKeyDer::from_pem_slice(s.as_bytes()).unwrap();
        let rsa = include_str!("../tests/keys/rsa-1024-pkcs8.pem");
        assert_eq!(kind_of(&pem(rsa)), Some(Kind::Rsa(Some(1024))));
        let rsa = include_str!("../tests/keys/rsa-2432-pkcs1.pem");
        assert_eq!(kind_of(&pem(rsa)), Some(Kind::Rsa(Some(2432))));
        let ec = include_str!("../tests/keys/ec-p256-sec1.pem");
        assert_eq!(
            kind_of(&pem(ec)),
            Some(Kind::Ec(Some("1.2.840.10045.3.1.7".into())))
        );
        let ec = include_str!("../tests/keys/ec-p384-pkcs8.pem");
        assert_eq!(
            kind_of(&pem(ec)),
            Some(Kind::Ec(Some("1.3.132.0.34".into())))
        );
        let ed = include_str!("../tests/keys/ed448-pkcs8.pem");
        assert_eq!(kind_of(&pem(ed)), Some(Kind::Other("1.3.101.113".into())));
        assert_eq!(name_of("1.3.132.0.10"), "secp256k1");
        assert_eq!(name_of("1.2.3"), "OID 1.2.3");
    }
}
