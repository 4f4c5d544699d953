//! The secret scan: looks through everything the shim said (logs, Events, Machines, `/status`,
//! `/metrics`, messages) for the secret key, any request signature the server received (raw or
//! percent-encoded, anywhere inside a token), and any `signature=` with a value.

use std::collections::HashSet;

/// What a scan saw.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Bytes scanned in all.
    pub bytes: usize,
    /// Bytes of the text named `logs…`.
    pub log_bytes: usize,
    /// Each finding as `<where>: <what>`, sorted, without repeats.
    pub hits: Vec<String>,
    /// Whether the API key (not a secret, but a witness that logs name the account) was in the logs.
    pub api_key_in_logs: bool,
}

/// CloudStack signatures are base64 of an HMAC-SHA1: 28 characters.
const SIGNATURE_LEN: usize = 28;

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Scans `texts` (`(where, text)`) for `secret`, `signatures` and `signature=` values.
pub fn scan(
    texts: &[(String, String)],
    secret: &str,
    api_key: &str,
    signatures: &HashSet<String>,
) -> Scan {
    let mut hits = Vec::new();
    let mut bytes = 0;
    let mut log_bytes = 0;
    let mut api_key_in_logs = false;
    for (where_, text) in texts {
        bytes += text.len();
        if where_.starts_with("logs") {
            log_bytes = text.len();
            api_key_in_logs = text.contains(api_key);
        }
        if text.contains(secret) {
            hits.push(format!("{where_}: the secret key"));
        }
        let lower = text.to_ascii_lowercase();
        for (i, _) in lower.match_indices("signature=") {
            let rest = &text[i + "signature=".len()..];
            let value: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "+/=%".contains(*c))
                .collect();
            if !value.is_empty() {
                hits.push(format!("{where_}: signature={value}"));
            }
        }
        for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || "+/=%".contains(c))) {
            if token.len() < SIGNATURE_LEN {
                continue;
            }
            let decoded = percent_decode(token);
            let d = decoded.as_bytes();
            if d.len() < SIGNATURE_LEN {
                continue;
            }
            let found = (0..=d.len() - SIGNATURE_LEN).any(|w| {
                std::str::from_utf8(&d[w..w + SIGNATURE_LEN])
                    .is_ok_and(|win| signatures.contains(win))
            });
            if found {
                hits.push(format!("{where_}: a request signature"));
            }
        }
    }
    hits.sort();
    hits.dedup();
    Scan {
        bytes,
        log_bytes,
        hits,
        api_key_in_logs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_percent_encoded_signature_inside_a_token_and_a_signature_parameter() {
        let sig = "AbCdEfGhIjKlMnOpQrStUvWxYz0=".to_string();
        assert_eq!(sig.len(), SIGNATURE_LEN);
        let sigs: HashSet<String> = [sig.clone()].into();
        let text = format!("GET /client/api?x=1&sig%3D{} done", sig.replace('=', "%3D"));
        let s = scan(&[("logs".into(), text)], "s3cret", "key", &sigs);
        assert_eq!(s.hits, ["logs: a request signature"]);
        let s = scan(
            &[("events".into(), "Signature=abc".into())],
            "s3cret",
            "key",
            &sigs,
        );
        assert_eq!(s.hits, ["events: signature=abc"]);
        let s = scan(
            &[("status".into(), "signature=<redacted> ok".into())],
            "s3cret",
            "key",
            &sigs,
        );
        assert!(s.hits.is_empty());
    }
}
