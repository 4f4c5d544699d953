//! The serving certificate of the secured listener: the operator's PEM files
//! (`--tls-cert-file`, `--tls-private-key-file`), re-read when they change (cert-manager and
//! Secret volumes rotate them in place), or else a self-signed certificate made at start —
//! as controller-runtime's metrics server and kube-controller-manager do: the point is that the
//! bearer token and the answers travel encrypted; clients that do not pin a CA skip
//! verification (Prometheus `insecureSkipVerify`, `capc-health-shim status
//! --insecure-skip-tls-verify`, `curl -k`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// How often the certificate files are compared with what is served.
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(10);

/// A certificate chain and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for PemPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("PemPair")
            .field("cert_bytes", &self.cert.len())
            .finish_non_exhaustive()
    }
}

/// The names a self-signed certificate is made for: loopback, and the pod's host name when
/// there is one (`HOSTNAME`).
pub fn self_signed_names(hostname: Option<&str>) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Some(h) = hostname.map(str::trim).filter(|h| {
        !h.is_empty()
            && h.len() <= 253
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    }) {
        if !names.iter().any(|n| n == h) {
            names.push(h.to_string());
        }
    }
    names
}

/// A fresh self-signed certificate (ECDSA P-256) for `names`.
pub fn self_signed(names: Vec<String>) -> Result<PemPair, String> {
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("cannot make a self-signed certificate: {e}"))?;
    Ok(PemPair {
        cert: made.cert.pem().into_bytes(),
        key: made.signing_key.serialize_pem().into_bytes(),
    })
}

/// The rustls server configuration for a PEM pair (ring, TLS 1.2 and 1.3, HTTP/2 and 1.1).
/// The errors name what is wrong without quoting the files.
pub fn server_config(pem: &PemPair) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate file is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("the certificate file holds no PEM CERTIFICATE block".to_string());
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|_| {
        "the private key file holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_string()
    })?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| format!("the certificate and private key do not make a pair: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    SelfSigned,
    Files { cert: PathBuf, key: PathBuf },
}

fn read_pair(cert: &Path, key: &Path) -> Result<PemPair, String> {
    let read = |p: &Path, what: &str| {
        std::fs::read(p).map_err(|e| format!("cannot read the {what} {}: {e}", p.display()))
    };
    Ok(PemPair {
        cert: read(cert, "--tls-cert-file")?,
        key: read(key, "--tls-private-key-file")?,
    })
}

/// The serving TLS configuration, and for files the pair it was built from (to notice changes).
pub fn load(source: &CertSource) -> Result<(RustlsConfig, Option<PemPair>), String> {
    match source {
        CertSource::SelfSigned => {
            let hostname = std::env::var("HOSTNAME").ok();
            let pem = self_signed(self_signed_names(hostname.as_deref()))?;
            Ok((RustlsConfig::from_config(server_config(&pem)?), None))
        }
        CertSource::Files { cert, key } => {
            let pem = read_pair(cert, key)?;
            let config = server_config(&pem).map_err(|e| {
                format!(
                    "--tls-cert-file {} / --tls-private-key-file {}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
            Ok((RustlsConfig::from_config(config), Some(pem)))
        }
    }
}

/// Re-reads the certificate files every [`RELOAD_CHECK_EVERY`] and serves a changed pair once
/// it is valid; a broken or half-written pair is logged and the served one kept. Runs until
/// the task is dropped.
pub async fn reload_on_change(config: RustlsConfig, cert: PathBuf, key: PathBuf, served: PemPair) {
    let mut served = served;
    let mut complained: Option<String> = None;
    loop {
        tokio::time::sleep(RELOAD_CHECK_EVERY).await;
        let now = match read_pair(&cert, &key) {
            Ok(p) => p,
            Err(e) => {
                if complained.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "serving certificate: keeping the one in use");
                    complained = Some(e);
                }
                continue;
            }
        };
        if now == served {
            continue;
        }
        match server_config(&now) {
            Ok(c) => {
                config.reload_from_config(c);
                served = now;
                complained = None;
                tracing::info!(cert = %cert.display(), "serving certificate reloaded");
            }
            Err(e) => {
                if complained.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "the changed serving certificate is not usable yet; keeping the one in use");
                    complained = Some(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_names_cover_loopback_and_a_sane_host_name() {
        assert_eq!(
            self_signed_names(None),
            vec!["localhost", "127.0.0.1", "::1"]
        );
        assert_eq!(
            self_signed_names(Some("capc-health-shim-7d9f-abcde")).last(),
            Some(&"capc-health-shim-7d9f-abcde".to_string())
        );
        for odd in ["", "  ", "a b", "x/y", "localhost"] {
            assert_eq!(self_signed_names(Some(odd)).len(), 3, "{odd:?}");
        }
    }

    #[test]
    fn a_self_signed_pair_makes_a_server_config_and_broken_files_say_why() {
        let pem = self_signed(self_signed_names(Some("pod-1"))).unwrap();
        let config = server_config(&pem).unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert!(format!("{pem:?}").contains("cert_bytes"));
        assert!(!format!("{pem:?}").contains("PRIVATE"));

        let no_cert = PemPair {
            cert: b"not a certificate".to_vec(),
            key: pem.key.clone(),
        };
        assert!(server_config(&no_cert).unwrap_err().contains("no PEM"));
        let no_key = PemPair {
            cert: pem.cert.clone(),
            key: b"nothing".to_vec(),
        };
        assert!(server_config(&no_key)
            .unwrap_err()
            .contains("no PEM private key"));
        let other = self_signed(vec!["localhost".into()]).unwrap();
        let mismatched = PemPair {
            cert: pem.cert.clone(),
            key: other.key,
        };
        assert!(server_config(&mismatched)
            .unwrap_err()
            .contains("do not make a pair"));
    }

    #[test]
    fn missing_files_name_the_flag() {
        let e = load(&CertSource::Files {
            cert: "/nonexistent/tls.crt".into(),
            key: "/nonexistent/tls.key".into(),
        })
        .err()
        .unwrap();
        assert!(e.contains("--tls-cert-file /nonexistent/tls.crt"), "{e}");
    }
}
