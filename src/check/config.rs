//! Where `check` gets its CloudStack clients from: flags, environment and CAPC-Secret-style
//! credentials files (the scope's key, and the guest probe's own key).

use std::collections::BTreeMap;
use std::path::Path;

use super::CheckArgs;
use crate::cli::to_std;
use crate::cloudstack::client::{ClientConfig, Credentials, VmListQuery};

/// Reads CAPC-Secret-style credentials: a `key: value` (or `key=value`) file, or a
/// directory with one file per key. Errors name the file, never a value.
pub fn read_credentials_file(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    if path.is_dir() {
        for key in ["api-url", "api-key", "secret-key", "verify-ssl"] {
            let file = path.join(key);
            if file.exists() {
                let value = std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {}: {}", file.display(), e.kind()))?;
                out.insert(key.to_string(), value.trim().to_string());
            }
        }
        return Ok(out);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), e.kind()))?;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once(':').or_else(|| line.split_once('=')) else {
            return Err(format!(
                "{}:{}: expected `key: value` (keys api-url, api-key, secret-key, verify-ssl)",
                path.display(),
                n + 1
            ));
        };
        let v = v.trim().trim_matches('"').trim_matches('\'');
        out.insert(k.trim().to_string(), v.to_string());
    }
    Ok(out)
}

/// Builds the client configuration from flags, environment and credentials file.
pub fn client_config(args: &CheckArgs) -> Result<ClientConfig, String> {
    let mut data = match &args.credentials_file {
        Some(path) => read_credentials_file(path)?,
        None => BTreeMap::new(),
    };
    if let Some(v) = &args.api_url {
        data.insert("api-url".into(), v.clone());
    }
    if let Some(v) = &args.api_key {
        data.insert("api-key".into(), v.clone());
    }
    if let Some(v) = &args.secret_key {
        data.insert("secret-key".into(), v.clone());
    }
    let missing: Vec<&str> = ["api-url", "api-key", "secret-key"]
        .into_iter()
        .filter(|k| !data.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing CloudStack {}: give --api-url/--api-key/--secret-key, the CLOUDSTACK_API_URL/\
             CLOUDSTACK_API_KEY/CLOUDSTACK_SECRET_KEY environment, or --credentials-file",
            missing.join(", ")
        ));
    }
    let mut cfg = ClientConfig::from_secret_data(&data).map_err(|e| e.to_string())?;
    if args.insecure_skip_tls_verify {
        cfg.verify_tls = false;
    }
    if let Some(path) = &args.ca_bundle {
        cfg.extra_ca_pem = Some(
            std::fs::read(path)
                .map_err(|e| format!("cannot read CA bundle {}: {}", path.display(), e.kind()))?,
        );
    }
    cfg.request_timeout = to_std(args.request_timeout);
    Ok(cfg)
}

/// The probe key's client configuration: its own credentials file, the TLS and timeout flags
/// of the check.
pub(super) fn probe_client_config(args: &CheckArgs, path: &Path) -> Result<ClientConfig, String> {
    let data = read_credentials_file(path)?;
    let mut cfg = ClientConfig::from_secret_data(&data)
        .map_err(|e| format!("probe credentials {}: {e}", path.display()))?;
    if args.insecure_skip_tls_verify {
        cfg.verify_tls = false;
    }
    if let Some(ca) = &args.ca_bundle {
        cfg.extra_ca_pem = Some(
            std::fs::read(ca)
                .map_err(|e| format!("cannot read CA bundle {}: {}", ca.display(), e.kind()))?,
        );
    }
    cfg.request_timeout = to_std(args.request_timeout);
    Ok(cfg)
}

/// Credentials from explicit values (used by the demo).
pub fn credentials(api_key: &str, secret_key: &str) -> Result<Credentials, String> {
    Credentials::new(api_key, secret_key).map_err(|e| e.to_string())
}

pub fn query(args: &CheckArgs) -> VmListQuery {
    VmListQuery {
        project_id: args.project.clone(),
        zone_id: args.zone.clone(),
        account: args.account.clone(),
        domain_id: args.domain_id.clone(),
        ids: Vec::new(),
        use_metrics_api: args.metrics_api,
        with_stats: true,
    }
}
