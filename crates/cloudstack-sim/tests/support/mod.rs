//! Shared helpers for the `sim_*` integration tests: an in-process simulator on
//! 127.0.0.1:0 with a frozen clock, and a signed HTTP client.
#![allow(dead_code)]

use std::time::Duration;

use cloudstack_api::signing::signed_query;
use cloudstack_sim::{self as sim, SimServer, Simulator, World};
use serde_json::Value;

pub const ADMIN_KEY: &str = "admin-key";
pub const ADMIN_SECRET: &str = "admin-secret";

pub struct Harness {
    pub sim: Simulator,
    pub server: SimServer,
    pub client: reqwest::Client,
}

pub struct Resp {
    pub status: u16,
    pub body: String,
    pub json: Value,
    pub headers: reqwest::header::HeaderMap,
}

pub fn default_world() -> World {
    World::default_world(ADMIN_KEY, ADMIN_SECRET, sim::real_now_ms())
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("reqwest client")
}

/// Starts a simulator with a frozen clock (time moves only through `advance`).
pub async fn start(world: World) -> Harness {
    let sim = Simulator::with_time_scale(world, 0.0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = sim::serve(listener, sim.clone()).await.expect("serve");
    Harness {
        sim,
        server,
        client: client(),
    }
}

async fn into_resp(r: reqwest::Response) -> Resp {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.text().await.expect("body");
    let json = serde_json::from_str(&body).unwrap_or(Value::Null);
    Resp {
        status,
        body,
        json,
        headers,
    }
}

impl Harness {
    /// Signed GET with `apiKey` and `response=json` added.
    pub async fn api_as(&self, key: &str, secret: &str, params: &[(&str, &str)]) -> Resp {
        let mut all: Vec<(&str, &str)> = vec![("apiKey", key), ("response", "json")];
        all.extend_from_slice(params);
        let q = signed_query(secret, all);
        let url = format!("{}?{}", self.server.api_url(), q);
        into_resp(self.client.get(url).send().await.expect("send")).await
    }

    pub async fn api(&self, params: &[(&str, &str)]) -> Resp {
        self.api_as(ADMIN_KEY, ADMIN_SECRET, params).await
    }

    /// Signed POST with the parameters in a form body.
    pub async fn api_post(&self, params: &[(&str, &str)]) -> Resp {
        let mut all: Vec<(&str, &str)> = vec![("apiKey", ADMIN_KEY), ("response", "json")];
        all.extend_from_slice(params);
        let body = signed_query(ADMIN_SECRET, all);
        let r = self
            .client
            .post(self.server.api_url())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .expect("send");
        into_resp(r).await
    }

    pub async fn raw_get(&self, query: &str) -> Resp {
        let url = format!("{}?{}", self.server.api_url(), query);
        into_resp(self.client.get(url).send().await.expect("send")).await
    }

    pub async fn admin_get(&self, path: &str) -> Resp {
        let url = format!("{}{}", self.server.base_url(), path);
        into_resp(self.client.get(url).send().await.expect("send")).await
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> Resp {
        let url = format!("{}{}", self.server.base_url(), path);
        let r = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("send");
        into_resp(r).await
    }

    pub async fn admin_delete(&self, path: &str) -> Resp {
        let url = format!("{}{}", self.server.base_url(), path);
        into_resp(self.client.delete(url).send().await.expect("send")).await
    }

    /// All VMs of `listVirtualMachines` (admin, listall) with the given extra params.
    pub async fn list_vms(&self, extra: &[(&str, &str)]) -> Vec<Value> {
        let mut p = vec![("command", "listVirtualMachines"), ("listall", "true")];
        p.extend_from_slice(extra);
        let r = self.api(&p).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json["listvirtualmachinesresponse"]["virtualmachine"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn vm_by_id(&self, id: &str) -> Option<Value> {
        self.list_vms(&[("id", id)]).await.into_iter().next()
    }

    pub async fn create_vm(&self, body: Value) -> String {
        let r = self.admin_post("/sim/vms", body).await;
        assert_eq!(r.status, 201, "{}", r.body);
        r.json["id"].as_str().expect("id").to_string()
    }

    pub async fn advance(&self, seconds: f64) {
        let r = self
            .admin_post(
                "/sim/clock",
                serde_json::json!({"advance_seconds": seconds}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
}
