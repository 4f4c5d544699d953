//! A CloudStack key as the controller holds it: who CloudStack sees (digests, never the
//! values), the one way from a Secret (and its `--endpoint-credentials` override) to a client
//! configuration, and the one rate-limit budget per CloudStack account. Used by the scopes'
//! clients and by the guest probe's alike.

use std::collections::BTreeMap;
use std::time::Duration;

use super::config::{EndpointOverride, RunArgs};
use super::kube_io;
use crate::cli::to_std;
use crate::cloudstack::client::{ClientConfig, CloudStackClient};
use crate::cloudstack::ratelimit::RateLimit;
use crate::cloudstack::CloudStackError;

/// The keys of a Secret an `--endpoint-credentials` override replaces.
const OVERRIDDEN: [&str; 3] = ["api-key", "secret-key", "verify-ssl"];

/// A short digest of `keys`' trimmed values (never the values themselves).
fn digest(data: &BTreeMap<String, String>, keys: &[&str]) -> String {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for k in keys {
        h.update(k.as_bytes());
        h.update(&[0]);
        if let Some(v) = data.get(*k) {
            h.update(v.trim().as_bytes());
        }
        h.update(&[0]);
    }
    h.finish().as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Who CloudStack sees: a digest of the key pair, so Secrets with the same key pair share a
/// scope and a changed or different key gets its own. Settings such as `verify-ssl` are not
/// part of it: they do not make another caller (the scope rebuilds its client when they change).
pub fn credentials_id(data: &BTreeMap<String, String>) -> String {
    digest(data, &["api-key", "secret-key"])
}

/// One CloudStack account: the API URL the client sends to and a digest of the API key.
/// CloudStack's API limit is per account, so every client of one account — every zone and
/// project of it, and the guest probe when it uses the same key — draws on one budget.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account {
    pub api_url: String,
    pub key: String,
}

/// A Secret made usable (with the override laid over): the client configuration, and who
/// CloudStack sees.
#[derive(Debug)]
pub struct Resolved {
    pub cfg: ClientConfig,
    pub account: Account,
    /// [`credentials_id`] of the keys in use.
    pub id: String,
}

/// The `--endpoint-credentials` override for the Secret's `api-url`, if any (the same
/// endpoint however the URL is spelled: case of the host, default port, trailing slash).
pub fn override_for<'a>(
    args: &'a RunArgs,
    data: &BTreeMap<String, String>,
) -> Option<&'a EndpointOverride> {
    let url = data.get("api-url")?;
    args.endpoint_credentials
        .iter()
        .find(|o| crate::probe::same_endpoint(&o.api_url, url))
}

/// The client configuration of a Secret's data under `run`'s flags, with the override's keys
/// (when `over` is given) in place of the Secret's: its request timeout and rate limit (off at
/// `--rate-limit 0`; the burst is twice the rate, at least 2). Errors never carry a value.
pub fn resolve(
    args: &RunArgs,
    mut data: BTreeMap<String, String>,
    over: Option<&BTreeMap<String, String>>,
) -> Result<Resolved, CloudStackError> {
    if let Some(over) = over {
        for k in OVERRIDDEN {
            if let Some(v) = over.get(k) {
                data.insert(k.to_string(), v.clone());
            }
        }
    }
    let mut cfg = ClientConfig::from_secret_data(&data)?;
    cfg.request_timeout = to_std(args.request_timeout);
    cfg.rate_limit = (args.rate_limit > 0.0).then(|| RateLimit {
        per_second: args.rate_limit,
        burst: (args.rate_limit.ceil() as u32).max(1) * 2,
    });
    let account = Account {
        api_url: cfg.api_url.to_string(),
        key: digest(&data, &["api-key"]),
    };
    let id = credentials_id(&data);
    Ok(Resolved { cfg, account, id })
}

/// Reads the Secret `namespace/name` and, with `overridable` and when `--endpoint-credentials`
/// names its API URL, the override's Secret, into a client configuration. Errors name Secrets
/// and keys, never values.
pub async fn read(
    client: &kube::Client,
    args: &RunArgs,
    namespace: &str,
    name: &str,
    overridable: bool,
) -> Result<Resolved, String> {
    let timeout: Duration = to_std(args.kube_timeout);
    let data = kube_io::secret_data(client, namespace, name, timeout)
        .await
        .map_err(|err| err.to_string())?;
    let over = match override_for(args, &data).filter(|_| overridable) {
        Some(o) => Some(
            kube_io::secret_data(client, &o.namespace, &o.name, timeout)
                .await
                .map_err(|err| err.to_string())?,
        ),
        None => None,
    };
    resolve(args, data, over.as_ref()).map_err(|err| format!("Secret {namespace}/{name}: {err}"))
}

/// A client for `cfg` that draws on the rate-limit budget of the first of `others` of the same
/// account, or on a budget of its own when there is none.
pub fn client_of_account<'a>(
    cfg: ClientConfig,
    account: &Account,
    others: impl IntoIterator<Item = (&'a Account, &'a CloudStackClient)>,
) -> Result<CloudStackClient, CloudStackError> {
    let client = CloudStackClient::new(cfg)?;
    Ok(match others.into_iter().find(|(a, _)| *a == account) {
        Some((_, other)) => client.sharing_rate_limit(other),
        None => client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn args(extra: &[&str]) -> RunArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            run: RunArgs,
        }
        use clap::Parser;
        let argv = std::iter::once("x").chain(extra.iter().copied());
        P::try_parse_from(argv).unwrap().run
    }

    const URL: &str = "https://cs.example/client/api";

    #[test]
    fn the_credentials_id_names_the_key_pair_but_shows_none_of_it() {
        let d = |k: &str, s: &str| data(&[("api-key", k), ("secret-key", s)]);
        let a = credentials_id(&d("KEY-A", "SECRET-A"));
        assert_eq!(a, credentials_id(&d(" KEY-A ", "SECRET-A")));
        assert_ne!(a, credentials_id(&d("KEY-B", "SECRET-A")));
        assert_ne!(a, credentials_id(&d("KEY-A", "SECRET-B")));
        assert_eq!(a.len(), 12);
        assert!(!a.contains("KEY") && !a.contains("SECRET"));
    }

    #[test]
    fn verify_ssl_is_a_setting_not_another_caller() {
        let d = |v: &str| data(&[("api-key", "K"), ("secret-key", "S"), ("verify-ssl", v)]);
        assert_eq!(credentials_id(&d("true")), credentials_id(&d("false")));
        let (a, b) = (
            resolve(
                &args(&[]),
                d("true")
                    .into_iter()
                    .chain(data(&[("api-url", URL)]))
                    .collect(),
                None,
            )
            .unwrap(),
            resolve(
                &args(&[]),
                d("false")
                    .into_iter()
                    .chain(data(&[("api-url", URL)]))
                    .collect(),
                None,
            )
            .unwrap(),
        );
        assert_eq!(a.account, b.account);
        assert_eq!((a.cfg.verify_tls, b.cfg.verify_tls), (true, false));
    }

    #[test]
    fn an_account_is_the_trimmed_url_and_the_api_key() {
        let r = |url: &str, key: &str, secret: &str| {
            resolve(
                &args(&[]),
                data(&[("api-url", url), ("api-key", key), ("secret-key", secret)]),
                None,
            )
            .unwrap()
        };
        let a = r(URL, "KEY-A", "SECRET-A");
        assert_eq!(a.account.api_url, URL);
        assert_eq!(
            a.account,
            r(&format!(" {URL}\n"), "KEY-A", "SECRET-A").account
        );
        // A rotated secret key is the same account (its budget), another scope (its client).
        let rotated = r(URL, "KEY-A", "SECRET-B");
        assert_eq!(a.account, rotated.account);
        assert_ne!(a.id, rotated.id);
        assert_ne!(a.account, r(URL, "KEY-B", "SECRET-A").account);
        assert_ne!(
            a.account,
            r("https://other.example/client/api", "KEY-A", "SECRET-A").account
        );
        assert!(!a.account.key.contains("KEY"));
    }

    #[test]
    fn the_override_for_the_secrets_endpoint_replaces_its_keys() {
        let a = args(&[
            "--endpoint-credentials",
            "https://CS.example:443/client/api/=ops/cloudstack-ro",
        ]);
        let capc = data(&[
            ("api-url", &format!("{URL}\n")),
            ("api-key", "CAPC-KEY"),
            ("secret-key", "CAPC-SECRET"),
        ]);
        let o = override_for(&a, &capc).expect("the same endpoint, spelled otherwise");
        assert_eq!(
            (o.namespace.as_str(), o.name.as_str()),
            ("ops", "cloudstack-ro")
        );
        let other = data(&[("api-url", "https://elsewhere.example/client/api")]);
        assert!(override_for(&a, &other).is_none());
        let ro = data(&[
            ("api-key", "RO-KEY"),
            ("secret-key", "RO-SECRET"),
            ("verify-ssl", "false"),
        ]);
        let r = resolve(&a, capc.clone(), Some(&ro)).unwrap();
        assert_eq!(r.cfg.api_url.as_str(), URL);
        assert!(!r.cfg.verify_tls);
        assert_eq!(r.id, credentials_id(&ro));
        assert_ne!(r.account, resolve(&a, capc, None).unwrap().account);
        // The key the flags put around it: --rate-limit and --request-timeout.
        assert_eq!(r.cfg.rate_limit.map(|l| l.burst), Some(10));
    }

    #[test]
    fn clients_of_one_account_share_one_budget() {
        let a = args(&[]);
        let r = |key: &str, verify: &str| {
            resolve(
                &a,
                data(&[
                    ("api-url", URL),
                    ("api-key", key),
                    ("secret-key", "S"),
                    ("verify-ssl", verify),
                ]),
                None,
            )
            .unwrap()
        };
        let scope = r("KEY-A", "true");
        let scope_client = client_of_account(scope.cfg, &scope.account, []).unwrap();
        // The probe with the scope's key (verify-ssl spelled otherwise) draws on its budget.
        let probe = r("KEY-A", "false");
        let probe_client =
            client_of_account(probe.cfg, &probe.account, [(&scope.account, &scope_client)])
                .unwrap();
        assert!(probe_client.shares_rate_limit_with(&scope_client));
        let other = r("KEY-B", "true");
        let other_client =
            client_of_account(other.cfg, &other.account, [(&scope.account, &scope_client)])
                .unwrap();
        assert!(!other_client.shares_rate_limit_with(&scope_client));
    }
}
