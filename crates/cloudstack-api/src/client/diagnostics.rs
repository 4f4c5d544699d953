//! The opt-in guest probe's calls: find the guest network's virtual router (`listRouters`),
//! ask it to arping or ping an address (`runDiagnostics`, an async command) and follow the
//! job (`queryAsyncJobResult`). Facts and citations: docs/guest-probe.md. Also the account's
//! destroy jobs (`listAsyncJobs`), for the remnant report.

use std::net::Ipv4Addr;

use super::{CloudStackClient, Listing};
use crate::diagnostics::{params_allowed, DiagnosticsKind};
use crate::error::{sanitize_text, CloudStackError};
use crate::model::{AsyncJob, Router};
use crate::parse::{parse_async_job, parse_job_id, AsyncJobState};

impl CloudStackClient {
    /// The Running routers with a NIC in `network_id`, all pages.
    ///
    /// `listall=true&projectid=-1`: without `projectid` (or `id`) CloudStack skips project
    /// resources, and the router of a project's network belongs to the project
    /// (`AccountManagerImpl.java@43d42b06`, `buildACLSearchParameters`); a root admin asking
    /// this way sees every router. `listRouters` pins the role to `VIRTUAL_ROUTER`, so
    /// internal-LB VMs are left out (`ListRoutersCmd.java@cf3a101d`). Pick one with
    /// [`crate::model::pick_router`].
    pub async fn list_routers(&self, network_id: &str) -> Result<Listing<Router>, CloudStackError> {
        let network_id = network_id.trim();
        // Without `networkid` the same call lists every router the key can see.
        if network_id.is_empty() {
            return Err(CloudStackError::config(
                "listRouters needs the id of the guest network; it is empty",
            ));
        }
        self.list(
            "listRouters",
            "router",
            &[
                ("networkid", network_id),
                ("state", "Running"),
                ("listall", "true"),
                ("projectid", "-1"),
            ],
        )
        .await
    }

    /// Every router with a NIC in `network_id`, whatever its state (the incident lookup: a
    /// Stopped router is what it looks for). Same visibility as [`Self::list_routers`].
    pub async fn routers_of_network(
        &self,
        network_id: &str,
    ) -> Result<Listing<Router>, CloudStackError> {
        let network_id = network_id.trim();
        if network_id.is_empty() {
            return Err(CloudStackError::config(
                "listRouters needs the id of the guest network; it is empty",
            ));
        }
        self.list(
            "listRouters",
            "router",
            &[
                ("networkid", network_id),
                ("listall", "true"),
                ("projectid", "-1"),
            ],
        )
        .await
    }

    /// Queues `kind` against `ip` on the system VM `router_id` and returns the job id; follow
    /// it with [`CloudStackClient::query_async_job`].
    ///
    /// Sent once, never retried: `runDiagnostics` is not a read command, and every call adds
    /// an async-job row and event rows (`DiagnosticsServiceImpl.java@b9e01c15`). `params`
    /// (e.g. `-c 3 -f`) is checked here against the server's `^[\w\-\s.]+$`, so a bad value
    /// fails before any request; CloudStack silently drops it for a key whose role is not of
    /// type Admin (`RunDiagnosticsCmd.java@c098aaa2`). The address is a typed IPv4 literal
    /// because the server does not check `ipaddress` at all.
    pub async fn run_diagnostics(
        &self,
        router_id: &str,
        ip: Ipv4Addr,
        kind: DiagnosticsKind,
        params: Option<&str>,
    ) -> Result<String, CloudStackError> {
        const COMMAND: &str = "runDiagnostics";
        let router_id = router_id.trim();
        if router_id.is_empty() {
            return Err(CloudStackError::config(
                "runDiagnostics needs the id of the router; it is empty",
            ));
        }
        check_target(ip)?;
        let params = params.filter(|p| !p.trim().is_empty());
        if let Some(p) = params {
            check_params(p)?;
        }
        let ip = ip.to_string();
        let mut query: Vec<(&str, &str)> = vec![
            ("targetid", router_id),
            ("ipaddress", &ip),
            ("type", kind.as_str()),
        ];
        if let Some(p) = params {
            query.push(("params", p));
        }
        let mut calls = 0;
        self.request(COMMAND, &query, &mut calls, |r| parse_job_id(COMMAND, r))
            .await
    }

    /// The recent `destroyVirtualMachine` jobs the key can see, all pages (`listAsyncJobs
    /// keyword=DestroyVMCmd listall=true`: the keyword matches the job's command class,
    /// `QueryManagerImpl.java@57c33169` `searchForAsyncJobsInternal`; `listall` widens a
    /// domain admin's view to its domain's accounts — CAPC's, when the shim has a key of its
    /// own — and changes nothing for a user's; CloudStack keeps finished jobs until
    /// `job.expire.minutes`, a day by default). A read, retried like the others.
    pub async fn list_destroy_jobs(&self) -> Result<Listing<AsyncJob>, CloudStackError> {
        self.list(
            "listAsyncJobs",
            "asyncjobs",
            &[
                ("keyword", crate::model::DESTROY_VM_CMD),
                ("listall", "true"),
            ],
        )
        .await
    }

    /// One look at an async job (`queryAsyncJobResult jobid=…`; a read, retried like the
    /// others). Polling, its interval and its deadline are the caller's.
    pub async fn query_async_job(&self, job_id: &str) -> Result<AsyncJobState, CloudStackError> {
        let job_id = job_id.trim();
        if job_id.is_empty() {
            return Err(CloudStackError::config(
                "queryAsyncJobResult needs a job id; it is empty",
            ));
        }
        let mut calls = 0;
        self.request(
            "queryAsyncJobResult",
            &[("jobid", job_id)],
            &mut calls,
            parse_async_job,
        )
        .await
    }
}

/// A clear error for options CloudStack would refuse with "Optional parameters contain
/// unwanted characters" after queueing a job.
fn check_params(params: &str) -> Result<(), CloudStackError> {
    if params_allowed(params) {
        return Ok(());
    }
    Err(CloudStackError::config(format!(
        "runDiagnostics params {:?} contain characters CloudStack refuses: only letters, \
         digits, '_', '-', '.' and whitespace are allowed (^[\\w\\-\\s.]+$)",
        sanitize_text(params, 80)
    )))
}

/// Addresses whose answer would not come from a guest: the router itself (loopback), nobody
/// (unspecified) or many (broadcast, multicast).
fn check_target(ip: Ipv4Addr) -> Result<(), CloudStackError> {
    if ip.is_unspecified() || ip.is_loopback() || ip.is_broadcast() || ip.is_multicast() {
        return Err(CloudStackError::config(format!(
            "runDiagnostics: {ip} is not a guest's unicast address"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_diagnostics_is_not_retried_and_the_job_query_is() {
        assert!(!super::super::is_read_command("runDiagnostics"));
        assert!(super::super::is_read_command("queryAsyncJobResult"));
        assert!(super::super::is_read_command("listRouters"));
    }

    #[test]
    fn bad_params_fail_clearly_before_a_request() {
        assert!(check_params("-c 3 -f").is_ok());
        assert!(check_params("-c 3 -f -I eth2").is_ok());
        for bad in [
            "-c 3; reboot",
            "$(id)",
            "-c 3 | nc x",
            "a&&b",
            "-I eth0 \u{e9}",
        ] {
            let e = check_params(bad).unwrap_err();
            assert_eq!(e.kind(), "config", "{bad}");
            assert!(!e.is_retryable());
            let text = e.to_string();
            assert!(text.contains("runDiagnostics params"), "{text}");
            assert!(text.contains("only letters"), "{text}");
        }
    }

    #[test]
    fn targets_must_be_a_guests_unicast_address() {
        assert!(check_target(Ipv4Addr::new(10, 1, 1, 5)).is_ok());
        for bad in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
        ] {
            assert_eq!(check_target(bad).unwrap_err().kind(), "config", "{bad}");
        }
    }

    /// A one-shot HTTP server on loopback: answers each request with the next canned
    /// `(status, body)` and hands back the request targets it saw.
    async fn serve(
        answers: Vec<(u16, &'static str)>,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/client/api", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, body) in answers {
                let Ok(Ok((mut sock, _))) =
                    tokio::time::timeout(std::time::Duration::from_secs(2), listener.accept())
                        .await
                else {
                    break;
                };
                let mut buf = vec![0u8; 16 * 1024];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") && n < buf.len() {
                    let Ok(m) = sock.read(&mut buf[n..]).await else {
                        break;
                    };
                    if m == 0 {
                        break;
                    }
                    n += m;
                }
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                seen.push(head.split(' ').nth(1).unwrap_or_default().to_string());
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(reply.as_bytes()).await;
            }
            seen
        });
        (url, task)
    }

    fn client(url: &str) -> CloudStackClient {
        let creds = crate::client::Credentials::new("test-api-key", "test-secret-key").unwrap();
        let mut cfg = crate::client::ClientConfig::new(url, creds).unwrap();
        cfg.rate_limit = None;
        cfg.retry.base_delay = std::time::Duration::from_millis(1);
        cfg.retry.max_delay = std::time::Duration::from_millis(2);
        CloudStackClient::new(cfg).unwrap()
    }

    fn params(target: &str) -> std::collections::BTreeMap<String, String> {
        let q = target.split_once('?').map_or("", |(_, q)| q);
        url::form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
            .collect()
    }

    #[tokio::test]
    async fn run_diagnostics_sends_the_probe_once() {
        let (url, seen) = serve(vec![
            (
                200,
                r#"{"rundiagnosticsresponse":{"jobid":"5f3c1f8e-7a0d-4d6f-9a1e-0c2b3d4e5f60"}}"#,
            ),
            (
                530,
                r#"{"rundiagnosticsresponse":{"errorcode":530,"errortext":"busy"}}"#,
            ),
        ])
        .await;
        let c = client(&url);
        let ip = Ipv4Addr::new(10, 1, 1, 5);
        let id = c
            .run_diagnostics("r-1", ip, DiagnosticsKind::Arping, Some("-c 3 -f"))
            .await
            .unwrap();
        assert_eq!(id, "5f3c1f8e-7a0d-4d6f-9a1e-0c2b3d4e5f60");
        // a server error is not retried: one request, not `max_attempts` (a retry would
        // also find the server gone and fail as `transport`)
        let e = c
            .run_diagnostics("r-1", ip, DiagnosticsKind::Ping, None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "server_error");
        // refused client-side: no request at all
        let e = c
            .run_diagnostics("r-1", ip, DiagnosticsKind::Arping, Some("-c 3; reboot"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "config");
        assert_eq!(c.calls(), 2);
        drop(c);
        let seen = seen.await.unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let first = params(&seen[0]);
        assert_eq!(first["command"], "runDiagnostics");
        assert_eq!(first["targetid"], "r-1");
        assert_eq!(first["ipaddress"], "10.1.1.5");
        assert_eq!(first["type"], "arping");
        assert_eq!(first["params"], "-c 3 -f");
        let second = params(&seen[1]);
        assert_eq!(second["type"], "ping");
        assert!(!second.contains_key("params"));
    }

    #[tokio::test]
    async fn routers_and_jobs_are_asked_as_guest_probe_md_says() {
        let (url, seen) = serve(vec![
            (200, r#"{"listroutersresponse":{"count":1,"router":[{"id":"r-1","state":"Running","guestnetworkid":"net-1","redundantstate":"UNKNOWN"}]}}"#),
            (200, r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":0}}"#),
            (200, r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":1,"jobresult":{"diagnostics":{"stdout":"b''","stderr":"b''","exitcode":"1"}}}}"#),
        ])
        .await;
        let c = client(&url);
        let l = c.list_routers("net-1").await.unwrap();
        assert!(l.complete);
        assert_eq!(
            crate::model::pick_router(&l.items, "net-1").map(|r| r.id.as_str()),
            Some("r-1")
        );
        assert_eq!(
            c.query_async_job("j-1").await.unwrap(),
            AsyncJobState::Pending
        );
        let AsyncJobState::Succeeded(v) = c.query_async_job("j-1").await.unwrap() else {
            panic!("not done")
        };
        assert_eq!(v["exitcode"], "1");
        assert_eq!(c.list_routers(" ").await.unwrap_err().kind(), "config");
        assert_eq!(c.query_async_job("").await.unwrap_err().kind(), "config");
        drop(c);
        let seen = seen.await.unwrap();
        let list = params(&seen[0]);
        assert_eq!(list["command"], "listRouters");
        assert_eq!(list["networkid"], "net-1");
        assert_eq!(list["state"], "Running");
        assert_eq!(list["listall"], "true");
        assert_eq!(list["projectid"], "-1");
        let q = params(&seen[1]);
        assert_eq!(
            (q["command"].as_str(), q["jobid"].as_str()),
            ("queryAsyncJobResult", "j-1")
        );
    }
}
