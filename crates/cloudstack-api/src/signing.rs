//! Request signing exactly as the CloudStack management server verifies it.
//!
//! The server (ApiServer.verifyRequest) takes every parameter but `signature`, sorts the names
//! case-sensitively as received, encodes each value like `java.net.URLEncoder` (space as
//! `%20`), joins `name=value` pairs with `&`, lowercases the whole string and compares
//! Base64(HMAC-SHA1(secret, canonical)). The same functions serve the client (signing) and
//! `cloudstack-sim` (verifying), so they are checked against the shared test vectors.

use std::fmt;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;

/// Appends `value` encoded like Java's `URLEncoder.encode(value, "UTF-8")` with `+` → `%20`:
/// only `A-Z a-z 0-9 . - * _` stay as they are, everything else is percent-encoded UTF-8.
pub fn java_url_encode_into(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'*' | b'_') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0x0f) as usize] as char);
        }
    }
}

pub fn java_url_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    java_url_encode_into(&mut out, value);
    out
}

/// The query string as sent on the wire (not lowercased), parameters sorted like the
/// canonical string. Names are sent raw (CloudStack names are `[A-Za-z0-9_.\[\]]`).
pub fn encoded_query<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(&str, &str)> = params
        .into_iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("signature"))
        .collect();
    // Java's String order on the names as sent = byte order for ASCII names.
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::with_capacity(pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        java_url_encode_into(&mut out, v);
    }
    out
}

/// The string the server signs: the sorted, encoded query, lowercased.
pub fn canonical_string<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    encoded_query(params).to_lowercase()
}

/// A request signature. Its `Debug`/`Display` never show the value: a signature is a
/// replayable credential until `expires`.
#[derive(Clone, PartialEq, Eq)]
pub struct Signature(String);

impl Signature {
    /// The Base64 value, for the request URL only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Signature(<redacted>)")
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Base64(HMAC-SHA1(secret, canonical)).
pub fn sign_canonical(secret_key: &str, canonical: &str) -> Signature {
    let mut mac = <Hmac<Sha1> as KeyInit>::new_from_slice(secret_key.as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(canonical.as_bytes());
    Signature(base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

pub fn sign<'a>(
    secret_key: &str,
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Signature {
    sign_canonical(secret_key, &canonical_string(params))
}

/// Constant-time comparison of a received signature with the expected one.
pub fn signature_matches(expected: &Signature, received: &str) -> bool {
    use subtle::ConstantTimeEq;
    let a = expected.0.as_bytes();
    let b = received.as_bytes();
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// The complete signed query string for the wire: `<encoded params>&signature=<encoded sig>`.
pub fn signed_query<'a>(
    secret_key: &str,
    params: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> String {
    let query = encoded_query(params);
    let signature = sign_canonical(secret_key, &query.to_lowercase());
    let mut out = query;
    out.push_str("&signature=");
    java_url_encode_into(&mut out, signature.expose());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const API_KEY: &str =
        "plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM-kAYMmAiLqzzq1ElZLYq_u38zCm0bewzGUdP66mg";
    const SECRET: &str =
        "VDaACYb0LV9eNjTetIOElcVQkvJck_J_QljX_FcHRj87ZKiy0z0ty0ZsYBkoXkY9b7eq1EhwJaw7FF3akA3KBQ";

    #[test]
    fn docs_example_signs_like_the_cloudstack_guide() {
        let params = [
            ("apikey", API_KEY),
            ("command", "listUsers"),
            ("response", "json"),
        ];
        assert_eq!(
            sign(SECRET, params).expose(),
            "TTpdDq/7j/J58XCRHomKoQXEQds="
        );
    }

    #[test]
    fn java_encoder_keeps_only_its_safe_set() {
        assert_eq!(
            java_url_encode("a~b c+d/e*f_g.h-i"),
            "a%7Eb%20c%2Bd%2Fe*f_g.h-i"
        );
        assert_eq!(java_url_encode("é"), "%C3%A9");
        assert_eq!(java_url_encode(""), "");
    }

    #[test]
    fn names_sort_case_sensitively_before_lowercasing() {
        let params = [("userdata", "true"), ("userId", "x"), ("apiKey", API_KEY)];
        let c = canonical_string(params);
        assert!(c.find("userid=x").unwrap() < c.find("userdata=true").unwrap());
    }

    #[test]
    fn signature_is_never_printed() {
        let s = sign(SECRET, [("command", "listUsers")]);
        assert!(!format!("{s:?}").contains(s.expose()));
        assert!(!format!("{s}").contains(s.expose()));
        assert!(signature_matches(&s, s.expose()));
        assert!(!signature_matches(&s, "AAAA"));
    }
}
