//! `status` (and `orphans`) without `--url`: the leader's `/status` with the user's kubeconfig
//! alone. The Lease names the leader's pod; a port-forward through the API server reaches its
//! HTTPS port; the bearer token is `--token`/`--token-file`, a short-lived one of
//! `--service-account` (a TokenRequest), or the kubeconfig user's own. A pod that answers as a
//! standby (the Lease moved meanwhile) is left for the Lease's new holder once.
//!
//! The choices — route, token source, port, the next pod, every message — are pure functions
//! here; the calls to the Kubernetes API and the shim are in [`kube_io`], the port-forward and
//! its loopback bridge in [`tunnel`]. [`StatusTransport`] is the one seam: a port-forward, or
//! (tests) a direct address per pod.

mod kube_io;
mod tunnel;

use std::path::PathBuf;

use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;

use super::client::{ClientAuthArgs, FetchError};
use super::exit;
use crate::status::StatusReport;

pub use kube_io::{
    connect, kubeconfig_token, leader_status, service_account_token, status_from, token_for,
    via_kube, LeaderQuery,
};
pub use tunnel::StatusTransport;

/// The shim's namespace in the shipped manifests.
pub const DEFAULT_NAMESPACE: &str = "capc-health-shim-system";
/// The leader Lease's name in the shipped manifests (`run --lease-name`).
pub const DEFAULT_LEASE_NAME: &str = "capc-health-shim";
/// The container port the shim's HTTPS listener has by this name in the shipped Deployment.
pub const PORT_NAME: &str = "https";
/// The port when neither `--port` nor a container port named [`PORT_NAME`] says otherwise.
pub const DEFAULT_PORT: u16 = 8443;
/// Lifetime asked for a `--service-account` token: the API server's minimum.
pub const TOKEN_SECONDS: i64 = 600;

/// Where the shim runs, for `status` without `--url`.
#[derive(Debug, Clone, Args)]
pub struct KubeTarget {
    /// Without --url: the kubeconfig to use [default: KUBECONFIG, ~/.kube/config, else the
    /// pod's in-cluster configuration].
    #[arg(long, env = "CAPC_HEALTH_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Without --url: the kubeconfig context to use [default: its current context].
    #[arg(long, env = "CAPC_HEALTH_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Without --url: the shim's namespace, where its Lease and pods are.
    #[arg(short = 'n', long, env = "CAPC_HEALTH_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Without --url: the leader Lease (`run --lease-name`); its holder is the leader's pod.
    #[arg(long, env = "CAPC_HEALTH_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// Without --url: the pod's port to forward to [default: its container port named https,
    /// else 8443].
    #[arg(long, env = "CAPC_HEALTH_PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Without --url: send a 10-minute token of this ServiceAccount of the shim's namespace
    /// (a TokenRequest; the account must be bound to capc-health-shim-metrics-reader) instead
    /// of the kubeconfig user's own bearer token.
    #[arg(long, env = "CAPC_HEALTH_SERVICE_ACCOUNT", value_name = "NAME")]
    pub service_account: Option<String>,
}

impl Default for KubeTarget {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            namespace: DEFAULT_NAMESPACE.to_string(),
            lease_name: DEFAULT_LEASE_NAME.to_string(),
            port: None,
            service_account: None,
        }
    }
}

/// How `status` reaches the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `--url`: the address as given (a port-forward of the user's, a Service, loopback).
    Url(String),
    /// No `--url`: the Lease's holder, through the Kubernetes API.
    Kube,
}

/// `--url` wins; flags that only mean something without it are refused beside it.
pub fn route(url: Option<&str>, target: &KubeTarget) -> Result<Route, String> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(Route::Kube);
    };
    let beside: Vec<&str> = [
        (target.service_account.is_some(), "--service-account"),
        (target.port.is_some(), "--port"),
    ]
    .into_iter()
    .filter_map(|(given, flag)| given.then_some(flag))
    .collect();
    if !beside.is_empty() {
        return Err(format!(
            "{} only work without --url (through the Kubernetes API); drop --url to use them",
            beside.join(" and ")
        ));
    }
    Ok(Route::Url(url.to_string()))
}

/// Where the token sent through the Kubernetes API comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeTokenSource {
    Flag,
    File(PathBuf),
    /// A TokenRequest for this ServiceAccount of the shim's namespace.
    ServiceAccount(String),
    /// The kubeconfig user's own bearer token (`token` or `tokenFile`).
    Kubeconfig,
}

/// `--token`/`--token-file`, else `--service-account`, else the kubeconfig user's bearer token.
/// An explicit flag wins over what the kubeconfig happens to hold; two explicit sources are an
/// error, and so is none at all.
pub fn kube_token_source(
    auth: &ClientAuthArgs,
    service_account: Option<&str>,
    kubeconfig_has_token: bool,
    namespace: &str,
) -> Result<KubeTokenSource, String> {
    let service_account = service_account.map(str::trim).filter(|s| !s.is_empty());
    match (&auth.token, &auth.token_file, service_account) {
        (Some(_), Some(_), _) => Err("give --token or --token-file, not both".to_string()),
        (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => Err(
            "give --token/--token-file or --service-account, not both: both name the token to send"
                .to_string(),
        ),
        (Some(_), None, None) => Ok(KubeTokenSource::Flag),
        (None, Some(p), None) => Ok(KubeTokenSource::File(p.clone())),
        (None, None, Some(sa)) => Ok(KubeTokenSource::ServiceAccount(sa.to_string())),
        (None, None, None) if kubeconfig_has_token => Ok(KubeTokenSource::Kubeconfig),
        (None, None, None) => Err(no_token_message(namespace)),
    }
}

/// No token to send: what to pass.
pub fn no_token_message(namespace: &str) -> String {
    format!(
        "no bearer token for the shim: the kubeconfig's user has none (it signs in with a client \
         certificate or a plugin); pass --service-account NAME (a ServiceAccount in {namespace} \
         bound to the ClusterRole capc-health-shim-metrics-reader, e.g. shim-reader: a 10-minute \
         token is requested for it) or --token-file PATH"
    )
}

/// The pod's port: `--port`, else its container port named `https`, else 8443.
pub fn shim_port(flag: Option<u16>, pod: &Pod) -> u16 {
    if let Some(p) = flag {
        return p;
    }
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_PORT)
}

/// Why the Lease names no pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoHolder {
    NoLease,
    Empty,
}

/// The Lease's holder (the leader's pod name).
pub fn holder(lease: Option<&Lease>) -> Result<String, NoHolder> {
    let lease = lease.ok_or(NoHolder::NoLease)?;
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .ok_or(NoHolder::Empty)
}

/// The error text for a Lease without a holder, or no Lease at all.
pub fn no_holder_message(why: &NoHolder, namespace: &str, lease: &str) -> String {
    match why {
        NoHolder::NoLease => format!(
            "no Lease {lease} in namespace {namespace}: is the shim installed there with leader \
             election (-n/--namespace, --lease-name; `run --lease-name`)? Or give --url"
        ),
        NoHolder::Empty => format!(
            "Lease {namespace}/{lease} has no holder: no replica leads now (are the shim's pods \
             running? kubectl -n {namespace} get pods)"
        ),
    }
}

/// The Lease names a pod that does not exist.
pub fn holder_gone_message(namespace: &str, lease: &str, pod: &str) -> String {
    format!(
        "Lease {namespace}/{lease} names pod {pod} as the leader, but there is no pod {pod} in \
         {namespace}: the leader is gone and no replica has taken over yet (a hold lasts 15 s \
         after its last renewal); try again shortly, or see kubectl -n {namespace} get pods"
    )
}

/// After `asked` answered: the pod to ask instead, at most once. `None` when `asked` leads (or
/// nothing better is known). The Lease as read again wins; else the standby's own
/// `leader_identity`.
pub fn next_pod(asked: &str, answer: &StatusReport, lease_now: Option<&str>) -> Option<String> {
    if answer.leader {
        return None;
    }
    [lease_now, answer.leader_identity.as_deref()]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|p| !p.is_empty() && *p != asked)
        .map(str::to_string)
}

/// A failed call to the Kubernetes API, with what it needs when it was forbidden.
pub fn kube_call_message(what: &str, needs: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 401 => format!(
            "{what}: the API server did not accept the kubeconfig's credentials (401): {}",
            s.message
        ),
        kube::Error::Api(s) if s.code == 403 => {
            format!("{what}: forbidden (403): {}; this needs {needs}", s.message)
        }
        kube::Error::Api(s) => format!("{what}: {} ({})", s.message, s.code),
        e => format!("{what}: {e}"),
    }
}

/// The TokenRequest failed.
pub fn token_request_message(namespace: &str, sa: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => format!(
            "no ServiceAccount {sa} in namespace {namespace} (--service-account names one of the \
             shim's namespace): create it with kubectl -n {namespace} create serviceaccount {sa} \
             and bind it to the ClusterRole capc-health-shim-metrics-reader"
        ),
        e => kube_call_message(
            &format!("cannot request a token for ServiceAccount {namespace}/{sa}"),
            "create on serviceaccounts/token in that namespace",
            e,
        ),
    }
}

/// What a failure of the way to the shim is, for the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubePathError {
    /// Flags that do not fit together, or no token to send.
    Usage(String),
    /// The kubeconfig, the Lease, the pod, the TokenRequest or the port-forward.
    Kube(String),
    /// The shim's own answer (or none), as with `--url`.
    Fetch(FetchError),
}

impl KubePathError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => exit::USAGE,
            Self::Kube(_) => exit::KUBE,
            Self::Fetch(e) => e.exit_code(),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Usage(m) | Self::Kube(m) => m,
            Self::Fetch(e) => e.message(),
        }
    }
}

/// One pod asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub pod: String,
    pub port: u16,
    /// Whether it answered as the leader.
    pub leader: bool,
}

/// The report and the pods asked for it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub report: StatusReport,
    pub hops: Vec<Hop>,
}

/// The message when nothing answered through the port-forward.
pub fn forward_failure(namespace: &str, pod: &str, port: u16, fetch: &str, said: &str) -> String {
    if said.is_empty() {
        format!("through the port-forward to pod {namespace}/{pod} port {port}: {fetch}")
    } else {
        format!(
            "the port-forward to pod {namespace}/{pod} port {port} failed: {said} (is the shim \
             listening there? --port)"
        )
    }
}

/// The API server refused or failed to open the port-forward.
pub fn portforward_message(namespace: &str, pod: &str, port: u16, e: &kube::Error) -> String {
    let said = kube_call_message(
        &format!("the API server did not open a port-forward to pod {namespace}/{pod} port {port}"),
        "create on pods/portforward in the shim's namespace",
        e,
    );
    match e {
        // A pod not scheduled, not running, or gone since it was read.
        kube::Error::Api(s) if matches!(s.code, 400 | 404) => {
            format!("{said}; is the pod running? kubectl -n {namespace} get pod {pod}")
        }
        _ => said,
    }
}

/// What stderr says about the pods asked, when it was more than the Lease's holder.
pub fn hops_note(namespace: &str, hops: &[Hop]) -> Option<String> {
    match hops {
        [first, second, ..] => Some(format!(
            "pod {namespace}/{} answered as a standby; asked pod {namespace}/{}, which {}",
            first.pod,
            second.pod,
            if second.leader {
                "leads"
            } else {
                "does not lead either (the Lease is moving: try again)"
            }
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::status::BearerToken;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        auth: ClientAuthArgs,
        #[command(flatten)]
        target: KubeTarget,
    }

    fn parse(args: &[&str]) -> (ClientAuthArgs, KubeTarget) {
        let p = P::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap();
        (p.auth, p.target)
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn without_url_the_kubernetes_api_is_the_way_and_its_flags_are_refused_beside_a_url() {
        let (_, t) = parse(&[]);
        assert_eq!(route(None, &t), Ok(Route::Kube));
        assert_eq!(route(Some("  "), &t), Ok(Route::Kube));
        assert_eq!(
            route(Some("https://localhost:8443"), &t),
            Ok(Route::Url("https://localhost:8443".into()))
        );
        assert_eq!(t.namespace, "capc-health-shim-system");
        assert_eq!(t.lease_name, "capc-health-shim");
        let (_, t) = parse(&[
            "-n",
            "ns1",
            "--service-account",
            "shim-reader",
            "--port",
            "9443",
        ]);
        let e = route(Some("https://localhost:8443"), &t).unwrap_err();
        assert!(
            e.contains("--service-account and --port only work without --url"),
            "{e}"
        );
        assert_eq!(t.namespace, "ns1");
    }

    #[test]
    fn the_token_is_a_flag_a_file_the_service_account_or_the_kubeconfig_users() {
        let src = |args: &[&str], own: bool| {
            let (a, t) = parse(args);
            kube_token_source(&a, t.service_account.as_deref(), own, &t.namespace)
        };
        assert_eq!(src(&["--token", "abc"], true), Ok(KubeTokenSource::Flag));
        assert_eq!(
            src(&["--token-file", "/t"], true),
            Ok(KubeTokenSource::File("/t".into()))
        );
        // An explicit --service-account wins over a token the kubeconfig happens to carry.
        assert_eq!(
            src(&["--service-account", "shim-reader"], true),
            Ok(KubeTokenSource::ServiceAccount("shim-reader".into()))
        );
        assert_eq!(src(&[], true), Ok(KubeTokenSource::Kubeconfig));
        let none = src(&["-n", "shim-ns"], false).unwrap_err();
        assert!(
            none.contains("--service-account NAME")
                && none.contains("--token-file PATH")
                && none.contains("a ServiceAccount in shim-ns"),
            "{none}"
        );
        assert!(src(&["--token", "a", "--service-account", "s"], true)
            .unwrap_err()
            .contains("not both"));
        assert!(src(&["--token", "a", "--token-file", "/t"], true)
            .unwrap_err()
            .contains("not both"));
    }

    #[test]
    fn the_kubeconfig_users_token_is_its_token_or_its_token_file() {
        let mut auth = kube::config::AuthInfo::default();
        assert_eq!(kubeconfig_token(&auth), Ok(None));
        auth.token = Some("static-token-1".to_string().into());
        assert_eq!(
            kubeconfig_token(&auth),
            Ok(Some(BearerToken::parse("static-token-1").unwrap()))
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tok");
        std::fs::write(&file, "file-token-2\n").unwrap();
        let auth = kube::config::AuthInfo {
            token_file: Some(file.display().to_string()),
            ..Default::default()
        };
        assert_eq!(
            kubeconfig_token(&auth),
            Ok(Some(BearerToken::parse("file-token-2").unwrap()))
        );
        let auth = kube::config::AuthInfo {
            token_file: Some("/nonexistent/tok".into()),
            ..Default::default()
        };
        let e = kubeconfig_token(&auth).unwrap_err();
        assert!(e.message().contains("tokenFile /nonexistent/tok"), "{e:?}");
        assert_eq!(e.exit_code(), exit::USAGE);
    }

    #[test]
    fn the_port_is_the_flag_else_the_container_port_named_https_else_8443() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "sidecar", "ports": [{"name": "metrics", "containerPort": 9090}]},
                {"name": "manager", "ports": [{"name": "https", "containerPort": 9443}]}
            ]}
        }))
        .unwrap();
        assert_eq!(shim_port(None, &pod), 9443);
        assert_eq!(shim_port(Some(7000), &pod), 7000);
        assert_eq!(shim_port(None, &Pod::default()), DEFAULT_PORT);
    }

    #[test]
    fn the_lease_names_the_leader_or_says_what_is_missing() {
        let lease = |holder: Option<&str>| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder}
            }))
            .unwrap()
        };
        assert_eq!(holder(Some(&lease(Some("shim-0")))), Ok("shim-0".into()));
        assert_eq!(holder(Some(&lease(None))), Err(NoHolder::Empty));
        assert_eq!(holder(Some(&lease(Some(" ")))), Err(NoHolder::Empty));
        assert_eq!(holder(None), Err(NoHolder::NoLease));
        let m = no_holder_message(&NoHolder::NoLease, "ns1", "capc-health-shim");
        assert!(
            m.starts_with("no Lease capc-health-shim in namespace ns1")
                && m.contains("--namespace"),
            "{m}"
        );
        let m = no_holder_message(&NoHolder::Empty, "ns1", "capc-health-shim");
        assert!(m.contains("has no holder"), "{m}");
        let m = holder_gone_message("ns1", "capc-health-shim", "shim-0");
        assert!(m.contains("there is no pod shim-0 in ns1"), "{m}");
    }

    #[test]
    fn a_standby_answer_leads_to_the_lease_holder_or_the_leader_it_names() {
        let standby = StatusReport {
            leader: false,
            leader_identity: Some("shim-b".into()),
            ..Default::default()
        };
        assert_eq!(
            next_pod("shim-a", &standby, Some("shim-c")),
            Some("shim-c".into()),
            "the Lease read again wins"
        );
        assert_eq!(
            next_pod("shim-a", &standby, Some("shim-a")),
            Some("shim-b".into())
        );
        assert_eq!(next_pod("shim-a", &standby, None), Some("shim-b".into()));
        assert_eq!(next_pod("shim-b", &standby, Some("shim-b")), None);
        let leader = StatusReport {
            leader: true,
            ..standby.clone()
        };
        assert_eq!(next_pod("shim-a", &leader, Some("shim-c")), None);
        let hop = |pod: &str, leader: bool| Hop {
            pod: pod.into(),
            port: 8443,
            leader,
        };
        assert_eq!(hops_note("ns", &[hop("a", true)]), None);
        let n = hops_note("ns", &[hop("a", false), hop("b", true)]).unwrap();
        assert!(
            n.contains("pod ns/a answered as a standby; asked pod ns/b, which leads"),
            "{n}"
        );
    }

    #[test]
    fn kubernetes_refusals_say_what_is_missing_and_exit_5() {
        let m = token_request_message("ns1", "shim-reader", &api_error(404, "not found"));
        assert!(
            m.contains("no ServiceAccount shim-reader in namespace ns1")
                && m.contains("kubectl -n ns1 create serviceaccount shim-reader"),
            "{m}"
        );
        let m = token_request_message("ns1", "shim-reader", &api_error(403, "cannot create"));
        assert!(m.contains("create on serviceaccounts/token"), "{m}");
        let m = portforward_message(
            "ns1",
            "shim-0",
            8443,
            &api_error(400, "pod shim-0 does not have a host assigned"),
        );
        assert_eq!(
            m,
            "the API server did not open a port-forward to pod ns1/shim-0 port 8443: pod shim-0 \
             does not have a host assigned (400); is the pod running? kubectl -n ns1 get pod shim-0"
        );
        let m = portforward_message("ns1", "shim-0", 8443, &api_error(403, "no"));
        assert!(m.contains("create on pods/portforward"), "{m}");
        assert_eq!(KubePathError::Kube(m).exit_code(), exit::KUBE);
        let m = forward_failure(
            "ns1",
            "shim-0",
            8443,
            "cannot reach …",
            "connection refused",
        );
        assert!(m.contains("failed: connection refused"), "{m}");
        let m = forward_failure("ns1", "shim-0", 8443, "cannot reach x: timed out", "");
        assert!(m.ends_with("cannot reach x: timed out"), "{m}");
    }
}
