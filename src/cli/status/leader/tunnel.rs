//! How the shim's port is reached once its pod is known: a port-forward through the API server
//! (`pods/portforward`, kube's websocket client), bridged to a loopback port of this process for
//! the HTTPS client; or, in tests, a direct address per pod.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;

use super::kube_io::LeaderQuery;
use super::{portforward_message, KubePathError};

/// How the shim's port is reached once the pod is known: the one seam of this path.
#[derive(Debug, Clone)]
pub enum StatusTransport {
    /// A port-forward through the API server (`pods/portforward`), bridged to a loopback port
    /// of this process for the HTTPS client.
    PortForward,
    /// An address per pod name, instead of a port-forward (tests: the API server they run has
    /// no kubelet to forward to).
    Direct(BTreeMap<String, url::Url>),
}

/// An open way to one pod's port, for the HTTPS client.
pub(super) struct Tunnel {
    pub(super) url: url::Url,
    /// The URL's host name → the loopback bridge.
    pub(super) resolve: Option<(String, SocketAddr)>,
    pub(super) forwarded: bool,
    /// What the kubelet said on the forwards' error channels.
    pub(super) errors: Arc<Mutex<Vec<String>>>,
    bridge: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        if let Some(b) = &self.bridge {
            b.abort();
        }
    }
}

/// A port-forward that ends when dropped.
struct Forward(kube::api::Portforwarder);

impl Drop for Forward {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) async fn open(
    client: &Client,
    q: &LeaderQuery,
    pod: &str,
    port: u16,
) -> Result<Tunnel, KubePathError> {
    let errors = Arc::new(Mutex::new(Vec::new()));
    match &q.transport {
        StatusTransport::Direct(addresses) => {
            let url = addresses
                .get(pod)
                .cloned()
                .ok_or_else(|| KubePathError::Kube(format!("no direct address for pod {pod}")))?;
            let url = crate::cli::status::status_url(url.as_str()).map_err(KubePathError::Usage)?;
            Ok(Tunnel {
                url,
                resolve: None,
                forwarded: false,
                errors,
                bridge: None,
            })
        }
        StatusTransport::PortForward => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &q.namespace);
            // Opened before the HTTPS client connects, so the API server's refusal is reported
            // as such.
            let first = forward(&pods, pod, port, &errors, q.options.timeout)
                .await
                .map_err(|e| {
                    KubePathError::Kube(portforward_message(&q.namespace, pod, port, &e))
                })?;
            let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .map_err(|e| KubePathError::Kube(format!("cannot listen on loopback: {e}")))?;
            let local = listener
                .local_addr()
                .map_err(|e| KubePathError::Kube(format!("cannot listen on loopback: {e}")))?;
            let bridge = tokio::spawn(bridge(
                listener,
                first,
                pods,
                pod.to_string(),
                port,
                errors.clone(),
                q.options.timeout,
            ));
            // The pod's name as the host: what a certificate given with --ca-file is checked
            // for (the shim's self-signed one names its pod too).
            let url = url::Url::parse(&format!("https://{pod}:{}/status", local.port()))
                .map_err(|e| KubePathError::Kube(format!("pod name {pod:?} as a host: {e}")))?;
            Ok(Tunnel {
                url,
                resolve: Some((pod.to_string(), local)),
                forwarded: true,
                errors,
                bridge: Some(bridge),
            })
        }
    }
}

/// One port-forward stream to `pod:port`; what the kubelet says about it goes to `errors`.
async fn forward(
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
    errors: &Arc<Mutex<Vec<String>>>,
    timeout: Duration,
) -> Result<(tokio::io::DuplexStream, Forward), kube::Error> {
    let mut pf = match tokio::time::timeout(timeout, pods.portforward(pod, &[port])).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(kube::Error::Service(
                format!("no answer within {}s", timeout.as_secs_f64()).into(),
            ))
        }
    };
    if let Some(said) = pf.take_error(port) {
        let errors = errors.clone();
        tokio::spawn(async move {
            if let Some(m) = said.await {
                if let Ok(mut e) = errors.lock() {
                    e.push(m);
                }
            }
        });
    }
    let stream = pf
        .take_stream(port)
        .ok_or_else(|| kube::Error::Service("the port-forward has no stream".into()))?;
    Ok((stream, Forward(pf)))
}

/// Loopback → pod: the first connection takes the forward opened up front, later ones open
/// their own.
async fn bridge(
    listener: tokio::net::TcpListener,
    first: (tokio::io::DuplexStream, Forward),
    pods: Api<Pod>,
    pod: String,
    port: u16,
    errors: Arc<Mutex<Vec<String>>>,
    timeout: Duration,
) {
    let mut first = Some(first);
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut local, _)) = listener.accept().await {
        let upstream = match first.take() {
            Some(f) => f,
            None => match forward(&pods, &pod, port, &errors, timeout).await {
                Ok(f) => f,
                Err(e) => {
                    if let Ok(mut list) = errors.lock() {
                        list.push(e.to_string());
                    }
                    continue;
                }
            },
        };
        connections.spawn(async move {
            let (mut stream, forward) = upstream;
            let _ = tokio::io::copy_bidirectional(&mut local, &mut stream).await;
            drop(forward);
        });
    }
}
