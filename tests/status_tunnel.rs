//! The bytes of `status`'s port-forward path (issue 43 item 4), which the test API server cannot
//! carry (it has no kubelet): a stand-in API server on loopback answers the Lease, the Pod and
//! `pods/portforward` as a websocket with the port-forward channel protocol (the initial port
//! frames, data on channel 0, the kubelet's errors on channel 1), and relays channel 0 to an
//! HTTPS server standing in for the shim. Through kube's client and the CLI's loopback bridge,
//! the request must arrive with its bearer token and view, the certificate must verify for the
//! pod's name with `--ca-file`'s bundle, and a kubelet error must be reported as such.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use capc_health_shim::cli::status::leader::{
    leader_status, Hop, KubePathError, LeaderQuery, StatusTransport,
};
use capc_health_shim::cli::status::{BearerToken, FetchError, FetchOptions, View};
use capc_health_shim::status::StatusReport;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use sha1::Digest as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const NS: &str = "shim-ns";
const LEASE: &str = "capc-health-shim";
const PORT: u16 = 9443;
const TOKEN: &str = "tunnel-test-token";
const KUBELET_ERROR: &str = "error forwarding port 9443 to pod pod-b: connection refused";

/// What the stand-in shim saw: the request line and the Authorization header.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// An HTTP/1.1 request head: request line and lower-cased headers.
async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> Option<(String, BTreeMap<String, String>)> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let request = line.trim_end().to_string();
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            return Some((request, headers));
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
}

fn json_response(code: u16, body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The stand-in shim: HTTPS with a certificate for `pod-a`, one status document per request.
async fn shim(tls: Arc<rustls::ServerConfig>, seen: Seen) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut tls = BufReader::new(tls);
                while let Some((request, headers)) = read_head(&mut tls).await {
                    let auth = headers.get("authorization").cloned().unwrap_or_default();
                    seen.lock().unwrap().push((request, auth));
                    let doc = serde_json::to_value(StatusReport {
                        leader: true,
                        ready: true,
                        leader_identity: Some("pod-a".into()),
                        version: "tunnel-test".into(),
                        ..Default::default()
                    })
                    .unwrap();
                    if tls.write_all(&json_response(200, &doc)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One stand-in API server connection: JSON for the Lease and the Pods, a websocket for
/// `pods/pod-a/portforward` relayed to the shim, and for `pod-b` the kubelet's error.
async fn api_connection(tcp: TcpStream, shim: std::net::SocketAddr) {
    let mut r = BufReader::new(tcp);
    while let Some((request, headers)) = read_head(&mut r).await {
        let path = request.split(' ').nth(1).unwrap_or_default().to_string();
        let pod = |name: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                "spec": {"containers": [{"name": "manager", "image": "x",
                    "ports": [{"name": "https", "containerPort": PORT}]}]}})
        };
        let answer = if path.ends_with(&format!("/namespaces/{NS}/leases/{LEASE}")) {
            json_response(
                200,
                &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": LEASE, "namespace": NS},
                    "spec": {"holderIdentity": "pod-a"}}),
            )
        } else if path.ends_with(&format!("/namespaces/{NS}/pods/pod-a")) {
            json_response(200, &pod("pod-a"))
        } else if path.ends_with(&format!("/namespaces/{NS}/pods/pod-b")) {
            json_response(200, &pod("pod-b"))
        } else if path.contains("/portforward?") {
            assert!(path.contains(&format!("ports={PORT}")), "{path}");
            let key = headers
                .get("sec-websocket-key")
                .cloned()
                .unwrap_or_default();
            let offered = headers
                .get("sec-websocket-protocol")
                .cloned()
                .unwrap_or_default();
            assert!(offered.contains("v4.channel.k8s.io"), "{offered}");
            let accept = base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(
                format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
            ));
            let head = format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
                 sec-websocket-accept: {accept}\r\nsec-websocket-protocol: v4.channel.k8s.io\r\n\r\n"
            );
            r.get_mut().write_all(head.as_bytes()).await.unwrap();
            let ws = WebSocketStream::from_raw_socket(r.into_inner(), Role::Server, None).await;
            relay(ws, shim, path.contains("/pods/pod-b/")).await;
            return;
        } else {
            json_response(
                404,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("{path} not found"), "reason": "NotFound", "code": 404}),
            )
        };
        if r.get_mut().write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// The port-forward's channel protocol: each channel first names its port (little-endian),
/// then channel 0 carries the bytes; a refused forward says why on channel 1 and closes.
async fn relay(ws: WebSocketStream<TcpStream>, shim: std::net::SocketAddr, refuse: bool) {
    let (mut sink, mut stream) = ws.split();
    let port = PORT.to_le_bytes();
    for ch in [0u8, 1] {
        sink.send(Message::binary(vec![ch, port[0], port[1]]))
            .await
            .unwrap();
    }
    if refuse {
        let mut frame = vec![1u8];
        frame.extend_from_slice(KUBELET_ERROR.as_bytes());
        let _ = sink.send(Message::binary(frame)).await;
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    let (mut from_shim, mut to_shim) = TcpStream::connect(shim).await.unwrap().into_split();
    let up = async move {
        while let Some(Ok(msg)) = stream.next().await {
            if msg.is_close() {
                break;
            }
            let Message::Binary(b) = msg else { continue };
            if b.len() > 1 && b[0] == 0 && to_shim.write_all(&b[1..]).await.is_err() {
                break;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from_shim.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut frame = Vec::with_capacity(n + 1);
                    frame.push(0u8);
                    frame.extend_from_slice(&buf[..n]);
                    if sink.send(Message::binary(frame)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    tokio::join!(up, down);
}

async fn api_server(shim: std::net::SocketAddr) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(api_connection(tcp, shim));
        }
    });
    format!("http://{addr}")
}

fn query(token: &str, ca_pem: Option<Vec<u8>>, view: View) -> LeaderQuery {
    LeaderQuery {
        namespace: NS.into(),
        lease_name: LEASE.into(),
        port: None,
        options: FetchOptions {
            timeout: Duration::from_secs(10),
            token: Some(BearerToken::parse(token).unwrap()),
            ca_pem,
            insecure_skip_tls_verify: false,
            resolve: None,
        },
        view,
        transport: StatusTransport::PortForward,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_forward_carries_the_request_and_reports_the_kubelets_refusal() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["pod-a".to_string()]).unwrap();
    let cert_pem = cert.cert.pem();
    let tls = cloudstack_sim::tls_config(
        cert_pem.as_bytes(),
        cert.signing_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let seen: Seen = Arc::default();
    let shim_addr = shim(tls, seen.clone()).await;
    let api = api_server(shim_addr).await;
    let client =
        kube::Client::try_from(kube::Config::new(api.parse().unwrap())).expect("kube client");

    // The Lease's holder through the port-forward, its certificate verified for the pod's
    // name with the given bundle; the view and the token arrive.
    let view = View {
        problems: true,
        ..Default::default()
    };
    let got = leader_status(
        &client,
        &query(TOKEN, Some(cert_pem.clone().into_bytes()), view),
    )
    .await
    .expect("the status through the port-forward");
    assert!(got.report.leader);
    assert_eq!(got.report.version, "tunnel-test");
    assert_eq!(
        got.hops,
        vec![Hop {
            pod: "pod-a".into(),
            port: PORT,
            leader: true
        }]
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].0, "GET /status?problems=true HTTP/1.1");
        assert_eq!(seen[0].1, format!("Bearer {TOKEN}"));
    }

    // Without a bundle the tunnel's certificate is not verified; a bundle that did not sign
    // it is refused (the check is on).
    leader_status(&client, &query(TOKEN, None, View::default()))
        .await
        .expect("unverified through the tunnel");
    let other = rcgen::generate_simple_self_signed(vec!["pod-a".to_string()]).unwrap();
    match leader_status(
        &client,
        &query(TOKEN, Some(other.cert.pem().into_bytes()), View::default()),
    )
    .await
    {
        Err(KubePathError::Fetch(FetchError::Unreachable(m))) => {
            assert!(m.to_lowercase().contains("certificate"), "{m}")
        }
        other => panic!("a foreign CA was accepted: {other:?}"),
    }

    // The kubelet refuses the forward (nothing listens): its own words, not a bare EOF.
    let mut q = query(TOKEN, None, View::default());
    q.lease_name = "no-such-lease".into();
    match leader_status(&client, &q).await {
        Err(KubePathError::Kube(m)) => {
            assert!(
                m.contains("no Lease no-such-lease in namespace shim-ns"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    match capc_health_shim::cli::status::leader::status_from(&client, &q, "pod-b".into()).await {
        Err(KubePathError::Fetch(FetchError::Unreachable(m))) => assert!(
            m.contains(&format!(
                "the port-forward to pod {NS}/pod-b port {PORT} failed: {KUBELET_ERROR}"
            )),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 2, "no request reached pod-b");
}
