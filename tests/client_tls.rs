//! TLS against a real HTTPS endpoint (cloudstack-sim served over rustls with a certificate
//! made for this test): verification is on by default, an extra CA bundle is honoured, and
//! `verify-ssl: "false"` turns verification off.

use capc_health_shim::cloudstack::client::{ClientConfig, CloudStackClient};
use cloudstack_sim::{self as sim, SimServer, Simulator, World};

const KEY: &str = "tls-api-key";
const SECRET: &str = "tls-secret-key";

struct Tls {
    server: SimServer,
    cert_pem: String,
}

async fn https_sim() -> Tls {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("self-signed certificate");
    let cert_pem = cert.cert.pem();
    let key_pem = cert.signing_key.serialize_pem();
    let tls = sim::tls_config(cert_pem.as_bytes(), key_pem.as_bytes()).expect("tls config");
    let world = World::default_world(KEY, SECRET, sim::real_now_ms());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = sim::serve_tls(listener, Simulator::with_time_scale(world, 0.0), tls)
        .await
        .expect("serve tls");
    Tls { server, cert_pem }
}

fn config(server: &SimServer, verify_ssl: Option<&str>) -> ClientConfig {
    let mut data = vec![
        ("api-url", server.api_url()),
        ("api-key", KEY.into()),
        ("secret-key", SECRET.into()),
    ];
    if let Some(v) = verify_ssl {
        data.push(("verify-ssl", v.to_string()));
    }
    let mut cfg = ClientConfig::from_secret_data(data).expect("config");
    cfg.retry.max_attempts = 1;
    cfg
}

#[tokio::test]
async fn an_untrusted_certificate_is_rejected_by_default() {
    let tls = https_sim().await;
    assert!(tls.server.api_url().starts_with("https://"));
    let client = CloudStackClient::new(config(&tls.server, None)).expect("client");
    let err = client
        .list_capabilities()
        .await
        .expect_err("self-signed certificate must not be trusted");
    assert_eq!(err.kind(), "transport", "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    tls.server.shutdown().await;
}

#[tokio::test]
async fn an_extra_ca_bundle_makes_the_certificate_trusted() {
    let tls = https_sim().await;
    let mut cfg = config(&tls.server, Some("true"));
    cfg.extra_ca_pem = Some(tls.cert_pem.clone().into_bytes());
    let client = CloudStackClient::new(cfg).expect("client");
    let caps = client
        .list_capabilities()
        .await
        .expect("trusted through the bundle");
    assert!(caps.cloudstackversion.is_some());
    tls.server.shutdown().await;
}

#[tokio::test]
async fn verify_ssl_false_skips_verification() {
    let tls = https_sim().await;
    let client = CloudStackClient::new(config(&tls.server, Some("false"))).expect("client");
    let caps = client.list_capabilities().await.expect("verification off");
    assert!(caps.cloudstackversion.is_some());
    tls.server.shutdown().await;
}
