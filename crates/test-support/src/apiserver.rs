//! The test API server: `make test` runs the tests that need one through
//! `hack/with-apiserver.sh`, which starts a real etcd + kube-apiserver with the CAPI/CAPC CRDs
//! and names its kubeconfig in [`KUBECONFIG_ENV`].
//!
//! Those tests are `#[ignore = "needs a kube-apiserver: …"]`, so a plain `cargo test` lists
//! them as ignored (visibly) and `make test` runs them with `--include-ignored`. A test run
//! without the server fails here instead of passing without having looked.

use std::path::PathBuf;

/// The environment variable holding the test API server's kubeconfig path.
pub const KUBECONFIG_ENV: &str = "CAPC_HEALTH_TEST_KUBECONFIG";
/// The CRD profile of the test API server (`capi-1.9`, `capi-1.13`, `capi-1.13-v1beta2-only`).
pub const PROFILE_ENV: &str = "CAPC_HEALTH_TEST_PROFILE";

/// The kubeconfig of the test API server; panics with what to run when there is none.
pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os(KUBECONFIG_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "this test needs the test kube-apiserver and {KUBECONFIG_ENV} is not set: run it \
             with `make test`, or `hack/with-apiserver.sh capi-1.9 cargo test -- --include-ignored`"
        ),
    }
}

/// The CRD profile the test API server was started with.
pub fn profile() -> String {
    std::env::var(PROFILE_ENV).unwrap_or_else(|_| "capi-1.9".into())
}

/// The test API server's audit log, when its profile writes one (hack/apiserver/run/audit.go:
/// `capi-1.13-v1beta2-only`): `APISERVER_AUDIT_LOG` of the runner's `env` file, which sits next
/// to the kubeconfig.
pub fn audit_log_path() -> Option<PathBuf> {
    let env = std::fs::read_to_string(kubeconfig_path().with_file_name("env")).ok()?;
    env.lines()
        .find_map(|l| l.strip_prefix("APISERVER_AUDIT_LOG="))
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// An admin client of the test API server.
pub async fn client() -> kube::Client {
    client_from_kubeconfig(&kubeconfig_path()).await
}

/// A client from a kubeconfig file (the test server's, or a copy pointed through a proxy).
pub async fn client_from_kubeconfig(path: &std::path::Path) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let yaml = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig usable");
    kube::Client::try_from(cfg).expect("client")
}

/// The API server's URL, from its kubeconfig.
pub fn url() -> String {
    let yaml = std::fs::read_to_string(kubeconfig_path()).expect("kubeconfig");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    kc.clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .expect("a server in the kubeconfig")
}
