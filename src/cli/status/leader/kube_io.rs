//! The calls of `status` without `--url`: the kubeconfig and its client, the token (the
//! kubeconfig user's, or a TokenRequest), the Lease and the pod, and the GET through the
//! transport, once more after a standby's answer.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;
use secrecy::ExposeSecret;

use super::tunnel::{open, StatusTransport};
use super::{
    forward_failure, holder, holder_gone_message, kube_call_message, kube_token_source, next_pod,
    no_holder_message, no_token_message, shim_port, token_request_message, Fetched, Hop,
    KubePathError, KubeTarget, KubeTokenSource, NoHolder, TOKEN_SECONDS,
};
use crate::cli::status::client::{
    fetch, read_ca, BearerToken, ClientAuthArgs, FetchError, FetchOptions,
};
use crate::cli::status::View;
use crate::status::StatusReport;

/// What [`leader_status`] needs besides the client.
#[derive(Debug, Clone)]
pub struct LeaderQuery {
    pub namespace: String,
    pub lease_name: String,
    pub port: Option<u16>,
    /// The token to send, the timeout, and `--ca-file`'s bundle (without it the tunnel's
    /// certificate is not verified).
    pub options: FetchOptions,
    pub view: View,
    pub transport: StatusTransport,
}

/// The kubeconfig (`--kubeconfig`, `--context`, else inferred) and a client of it.
pub async fn connect(target: &KubeTarget) -> Result<(Client, kube::Config), KubePathError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = kube::config::KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let config = match &target.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                KubePathError::Kube(format!("cannot read --kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| KubePathError::Kube(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None if target.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| KubePathError::Kube(format!("kubeconfig: {e}")))?,
        None => kube::Config::infer().await.map_err(|e| {
            KubePathError::Kube(format!(
                "no kubeconfig (KUBECONFIG, ~/.kube/config, --kubeconfig) and not in a pod: {e}; \
                 or give --url"
            ))
        })?,
    };
    let client = Client::try_from(config.clone())
        .map_err(|e| KubePathError::Kube(format!("cannot build a Kubernetes client: {e}")))?;
    Ok((client, config))
}

/// The kubeconfig user's bearer token: its `token`, else its `tokenFile` read.
pub fn kubeconfig_token(
    auth: &kube::config::AuthInfo,
) -> Result<Option<BearerToken>, KubePathError> {
    if let Some(t) = &auth.token {
        return BearerToken::parse(t.expose_secret())
            .map(Some)
            .map_err(|e| KubePathError::Usage(format!("the kubeconfig user's token: {e}")));
    }
    match &auth.token_file {
        None => Ok(None),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                KubePathError::Usage(format!(
                    "cannot read the kubeconfig user's tokenFile {path}: {e}"
                ))
            })?;
            BearerToken::parse(&text).map(Some).map_err(|e| {
                KubePathError::Usage(format!("the kubeconfig user's tokenFile {path}: {e}"))
            })
        }
    }
}

/// A [`TOKEN_SECONDS`] token of ServiceAccount `namespace/name` (a TokenRequest, the API
/// server's own audiences: what the shim's TokenReview accepts).
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<BearerToken, KubePathError> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = tokio::time::timeout(
        timeout,
        sas.create_token_request(name, &PostParams::default(), &request),
    )
    .await
    .map_err(|_| {
        KubePathError::Kube(format!(
            "cannot request a token for ServiceAccount {namespace}/{name}: no answer within {}s",
            timeout.as_secs_f64()
        ))
    })?
    .map_err(|e| KubePathError::Kube(token_request_message(namespace, name, &e)))?;
    let token = answer
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            KubePathError::Kube(format!(
                "the TokenRequest for ServiceAccount {namespace}/{name} returned no token"
            ))
        })?;
    BearerToken::parse(&token).map_err(|e| KubePathError::Kube(format!("the requested token: {e}")))
}

/// The token to send, from the flags and the kubeconfig.
pub async fn token_for(
    client: &Client,
    config: &kube::Config,
    auth: &ClientAuthArgs,
    target: &KubeTarget,
    timeout: Duration,
) -> Result<BearerToken, KubePathError> {
    let own = kubeconfig_token(&config.auth_info);
    let has_own = !matches!(own, Ok(None));
    let source = kube_token_source(
        auth,
        target.service_account.as_deref(),
        has_own,
        &target.namespace,
    )
    .map_err(KubePathError::Usage)?;
    match source {
        KubeTokenSource::Flag => auth
            .token
            .clone()
            .ok_or_else(|| KubePathError::Usage("--token is empty".into())),
        KubeTokenSource::File(p) => {
            let text = std::fs::read_to_string(&p).map_err(|e| {
                KubePathError::Usage(format!("cannot read --token-file {}: {e}", p.display()))
            })?;
            BearerToken::parse(&text)
                .map_err(|e| KubePathError::Usage(format!("--token-file {}: {e}", p.display())))
        }
        KubeTokenSource::ServiceAccount(sa) => {
            service_account_token(client, &target.namespace, &sa, timeout).await
        }
        KubeTokenSource::Kubeconfig => {
            own?.ok_or_else(|| KubePathError::Usage(no_token_message(&target.namespace)))
        }
    }
}

async fn get_opt<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    needs: &str,
    timeout: Duration,
) -> Result<Option<K>, KubePathError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    tokio::time::timeout(timeout, api.get_opt(name))
        .await
        .map_err(|_| {
            KubePathError::Kube(format!(
                "{what}: no answer within {}s",
                timeout.as_secs_f64()
            ))
        })?
        .map_err(|e| KubePathError::Kube(kube_call_message(what, needs, &e)))
}

async fn lease_holder(
    client: &Client,
    q: &LeaderQuery,
) -> Result<Result<String, NoHolder>, KubePathError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &q.namespace);
    let lease = get_opt(
        &leases,
        &q.lease_name,
        &format!("cannot read Lease {}/{}", q.namespace, q.lease_name),
        "get on leases (coordination.k8s.io) in the shim's namespace",
        q.options.timeout,
    )
    .await?;
    Ok(holder(lease.as_ref()))
}

/// The leader's `/status`: the Lease's holder asked, and once more the pod that leads instead
/// when it answers as a standby.
pub async fn leader_status(client: &Client, q: &LeaderQuery) -> Result<Fetched, KubePathError> {
    let first = lease_holder(client, q)
        .await?
        .map_err(|why| KubePathError::Kube(no_holder_message(&why, &q.namespace, &q.lease_name)))?;
    status_from(client, q, first).await
}

/// [`leader_status`] from `first` on: as if the Lease had named `first` when read.
pub async fn status_from(
    client: &Client,
    q: &LeaderQuery,
    first: String,
) -> Result<Fetched, KubePathError> {
    let mut hops = Vec::new();
    let mut pod = first;
    loop {
        let (report, port) = ask(client, q, &pod).await?;
        hops.push(Hop {
            pod: pod.clone(),
            port,
            leader: report.leader,
        });
        if report.leader || hops.len() > 1 {
            return Ok(Fetched { report, hops });
        }
        let lease_now = lease_holder(client, q).await?.ok();
        match next_pod(&pod, &report, lease_now.as_deref()) {
            Some(next) => pod = next,
            None => return Ok(Fetched { report, hops }),
        }
    }
}

/// One pod's `/status` (of the query's view), and the port asked.
async fn ask(
    client: &Client,
    q: &LeaderQuery,
    pod_name: &str,
) -> Result<(StatusReport, u16), KubePathError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &q.namespace);
    let pod = get_opt(
        &pods,
        pod_name,
        &format!("cannot read pod {}/{pod_name}", q.namespace),
        "get on pods in the shim's namespace",
        q.options.timeout,
    )
    .await?
    .ok_or_else(|| {
        KubePathError::Kube(holder_gone_message(&q.namespace, &q.lease_name, pod_name))
    })?;
    let port = shim_port(q.port, &pod);
    let tunnel = open(client, q, pod_name, port).await?;
    let mut options = q.options.clone();
    options.resolve = tunnel.resolve.clone();
    // The far end is the pod the API server forwarded to: without --ca-file, its (usually
    // self-signed) certificate is not checked.
    options.insecure_skip_tls_verify = options.ca_pem.is_none();
    let url = q.view.url(tunnel.url.clone());
    match fetch(&url, &options).await {
        Ok(mut report) => {
            q.view.keep_machine(&mut report);
            Ok((report, port))
        }
        Err(FetchError::Unreachable(m)) if tunnel.forwarded => {
            // The kubelet's word on the forward (e.g. nothing listens on that port) arrives on
            // its own channel, just after the stream closed.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let said = tunnel
                .errors
                .lock()
                .map(|e| e.join("; "))
                .unwrap_or_default();
            Err(KubePathError::Fetch(FetchError::Unreachable(
                forward_failure(&q.namespace, pod_name, port, &m, &said),
            )))
        }
        Err(e) => Err(KubePathError::Fetch(e)),
    }
}

/// `status`/`orphans` without `--url`: kubeconfig, token, Lease, port-forward, GET.
pub async fn via_kube(
    target: &KubeTarget,
    auth: &ClientAuthArgs,
    timeout: Duration,
    view: &View,
) -> Result<Fetched, KubePathError> {
    if auth.insecure_skip_tls_verify && auth.ca_file.is_some() {
        return Err(KubePathError::Usage(
            "give --ca-file or --insecure-skip-tls-verify, not both".to_string(),
        ));
    }
    let ca_pem = match &auth.ca_file {
        None => None,
        Some(p) => Some(read_ca(p).map_err(KubePathError::Usage)?),
    };
    let (client, config) = connect(target).await?;
    let token = token_for(&client, &config, auth, target, timeout).await?;
    let q = LeaderQuery {
        namespace: target.namespace.trim().to_string(),
        lease_name: target.lease_name.trim().to_string(),
        port: target.port,
        options: FetchOptions {
            timeout,
            token: Some(token),
            ca_pem,
            insecure_skip_tls_verify: false,
            resolve: None,
        },
        view: view.clone(),
        transport: StatusTransport::PortForward,
    };
    leader_status(&client, &q).await
}
