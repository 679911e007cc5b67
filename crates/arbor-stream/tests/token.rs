//! Resume tokens and identities: round trips, and damaged or foreign input
//! refused.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_stream::format::{Guid, ResumeToken, StreamError};
use proptest::prelude::*;

fn token(target: [u8; 16], base: Option<[u8; 16]>, offset: u64, size: u64) -> ResumeToken {
    ResumeToken {
        target: Guid(target),
        base: base.map(Guid),
        offset,
        volume_size: size,
    }
}

fn sample() -> ResumeToken {
    token([0x11; 16], Some([0x22; 16]), 1 << 30, 5 << 30)
}

proptest! {
    #[test]
    fn tokens_round_trip(
        mut target in any::<[u8; 16]>(),
        base in proptest::option::of(any::<[u8; 16]>()),
        size_sectors in 0u64..=1 << 51,
        frac in 0.0f64..=1.0,
    ) {
        target[0] |= 1;
        let base = base.map(|mut b| { b[0] |= 1; b[1] = !target[1]; b });
        let offset_sectors = (size_sectors as f64 * frac) as u64;
        let t = token(target, base, offset_sectors.min(size_sectors) * 512, size_sectors * 512);
        let s = t.encode();
        prop_assert!(s.starts_with("1-"));
        prop_assert_eq!(s.len(), 106);
        prop_assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        prop_assert_eq!(ResumeToken::decode(&s), Ok(t));
        prop_assert_eq!(s.parse::<ResumeToken>(), Ok(t));
        prop_assert_eq!(t.to_string(), s.clone());
        prop_assert_eq!(format!("  {s}\n").parse::<ResumeToken>(), Ok(t));
        prop_assert_eq!(s.to_uppercase().parse::<ResumeToken>(), Ok(t));
    }

    #[test]
    fn arbitrary_strings_never_panic(s in "\\PC{0,120}") {
        let _ = s.parse::<ResumeToken>();
        let _ = s.parse::<Guid>();
    }
}

fn is_bad(r: Result<ResumeToken, StreamError>) -> bool {
    matches!(r, Err(StreamError::BadResumeToken { .. }))
}

#[test]
fn every_damaged_token_is_refused() {
    let s = sample().encode();
    // Every character changed to every other hex digit (or a non-hex one).
    for i in 0..s.len() {
        for c in "0123456789abcdefg-x ".chars() {
            if s[i..].starts_with(c) {
                continue;
            }
            let mut damaged = s.clone();
            damaged.replace_range(i..i + 1, &c.to_string());
            let r = damaged.parse::<ResumeToken>();
            // A space at either end is trimmed, then the token is short.
            assert!(is_bad(r.clone()), "{damaged}: {r:?}");
        }
    }
    // Every truncation, and extra characters.
    for n in 0..s.len() {
        assert!(is_bad(s[..n].parse()), "{}", &s[..n]);
    }
    assert!(is_bad(format!("{s}0").parse()));
    // Two adjacent characters swapped.
    for i in 2..s.len() - 1 {
        let b = s.as_bytes();
        if b[i] == b[i + 1] {
            continue;
        }
        let mut v = b.to_vec();
        v.swap(i, i + 1);
        assert!(is_bad(String::from_utf8(v).unwrap().parse()));
    }
}

#[test]
fn foreign_and_future_tokens_are_refused_clearly() {
    let s = sample().encode();
    let e = format!("2{}", &s[1..]).parse::<ResumeToken>().unwrap_err();
    assert!(e.to_string().contains("version 2"), "{e}");
    for foreign in [
        "",
        "1-",
        "-",
        "hello",
        "1-zz",
        // A ZFS receive_resume_token's shape.
        "1-e604ea4bf-e0-789c63a2b60c8d3a",
        "v1-0000",
    ] {
        let e = foreign.parse::<ResumeToken>().unwrap_err();
        assert!(matches!(e, StreamError::BadResumeToken { .. }), "{foreign}");
        assert!(e.to_string().starts_with("bad resume token: "));
    }
}

#[test]
fn tokens_with_impossible_fields_are_refused() {
    for t in [
        token([0; 16], None, 0, 512),
        token([1; 16], Some([1; 16]), 0, 512),
        token([1; 16], None, 1024, 512),
        token([1; 16], None, 100, 512),
        token([1; 16], None, 0, 1000),
        token([1; 16], None, 0, (1 << 60) + 512),
    ] {
        assert!(is_bad(t.encode().parse()), "{t:?}");
    }
    // Base zero means "full stream".
    let t = token([1; 16], Some([0; 16]), 0, 512);
    assert_eq!(t.encode().parse::<ResumeToken>().unwrap().base, None);
}

#[test]
fn guids_print_and_parse_as_32_hex_digits() {
    let g = Guid([
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32,
        0x10,
    ]);
    let s = g.to_string();
    assert_eq!(s, "0123456789abcdeffedcba9876543210");
    assert_eq!(s.parse::<Guid>(), Ok(g));
    assert_eq!(s.to_uppercase().parse::<Guid>(), Ok(g));
    assert_eq!(format!("{g:?}"), format!("Guid({s})"));
    assert!(Guid::ZERO.is_zero() && !g.is_zero());
    assert_eq!(<[u8; 16]>::from(g), g.0);
    for bad in [
        "",
        "0123",
        &format!("{s}0"),
        &s.replace('a', "g"),
        &s.replace('0', "+"),
    ] {
        assert!(matches!(
            bad.parse::<Guid>(),
            Err(StreamError::BadGuid { .. })
        ));
    }
    // Multi-byte characters: refused, never a panic.
    assert!("é123456789abcdeffedcba987654321".parse::<Guid>().is_err());
}
