//! A CloudStack key as the controller holds it: who CloudStack sees (a digest, never the
//! values) and the client configuration `run`'s flags put around a Secret's data. One place
//! for both, used by the scopes' clients and by the guest probe's.

use std::collections::BTreeMap;

use super::config::RunArgs;
use crate::cli::to_std;
use crate::cloudstack::client::ClientConfig;
use crate::cloudstack::ratelimit::RateLimit;

/// Who CloudStack sees: a short digest of everything the client's identity depends on (never
/// the values themselves), so Secrets with the same credentials share a scope and a changed
/// or different key gets its own.
pub fn credentials_id(data: &BTreeMap<String, String>) -> String {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for k in ["api-key", "secret-key", "verify-ssl"] {
        h.update(k.as_bytes());
        h.update(&[0]);
        if let Some(v) = data.get(k) {
            h.update(v.trim().as_bytes());
        }
        h.update(&[0]);
    }
    h.finish().as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The client configuration of a Secret's data under `run`'s flags: its request timeout and
/// rate limit (off at `--rate-limit 0`; the burst is twice the rate, at least 2).
pub fn client_config(
    args: &RunArgs,
    data: &BTreeMap<String, String>,
) -> Result<ClientConfig, crate::cloudstack::CloudStackError> {
    let mut cfg = ClientConfig::from_secret_data(data)?;
    cfg.request_timeout = to_std(args.request_timeout);
    cfg.rate_limit = (args.rate_limit > 0.0).then(|| RateLimit {
        per_second: args.rate_limit,
        burst: (args.rate_limit.ceil() as u32).max(1) * 2,
    });
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credentials_id_names_the_key_pair_but_shows_none_of_it() {
        let data = |k: &str, s: &str| -> BTreeMap<String, String> {
            [("api-key", k), ("secret-key", s)]
                .into_iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let a = credentials_id(&data("KEY-A", "SECRET-A"));
        assert_eq!(a, credentials_id(&data(" KEY-A ", "SECRET-A")));
        assert_ne!(a, credentials_id(&data("KEY-B", "SECRET-A")));
        assert_ne!(a, credentials_id(&data("KEY-A", "SECRET-B")));
        assert_eq!(a.len(), 12);
        assert!(!a.contains("KEY") && !a.contains("SECRET"));
    }
}
