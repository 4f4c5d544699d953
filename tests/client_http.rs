//! Client behaviour against a scripted CloudStack stand-in on 127.0.0.1:0.

#[path = "client_support.rs"]
mod support;

use std::time::Duration;

use capc_health_shim::cloudstack::client::{CloudStackClient, RetryPolicy, VmListQuery};
use capc_health_shim::cloudstack::model::{CsTime, VirtualMachine, VmState};
use capc_health_shim::cloudstack::ratelimit::RateLimit;
use capc_health_shim::cloudstack::CloudStackError;
use serde_json::{json, Value};
use support::*;

fn page_fixture(page: u32) -> Canned {
    match page {
        1 => Canned::json(200, fixture("list-vms-page-1.json")),
        2 => Canned::json(200, fixture("list-vms-page-2.json")),
        3 => Canned::json(200, fixture("list-vms-page-3.json")),
        _ => Canned::json(200, fixture("list-vms-empty.json")),
    }
}

fn vm_id(i: u64) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

fn vms_json(count: u64, ids: &[u64]) -> String {
    let vms: Vec<Value> = ids
        .iter()
        .map(|i| json!({"id": vm_id(*i), "name": format!("vm-{i}"), "state": "Running"}))
        .collect();
    json!({"listvirtualmachinesresponse": {"count": count, "virtualmachine": vms}}).to_string()
}

fn paged_client(url: &str, page_size: u32) -> CloudStackClient {
    let mut c = config(url);
    c.page_size = page_size;
    CloudStackClient::new(c).unwrap()
}

#[tokio::test]
async fn signed_requests_and_pagination_across_pages_with_count() {
    let server = TestServer::start(|_, seen| page_fixture(seen.page())).await;
    let client = paged_client(&server.url, 2);
    let listing = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    let ids: Vec<String> = listing.vms.iter().map(|v| v.id.clone()).collect();
    assert_eq!(ids, (301..=305).map(vm_id).collect::<Vec<_>>());
    assert!(listing.complete);
    assert!(listing.failures.is_empty());
    assert_eq!((listing.pages, listing.calls), (3, 3));
    assert_eq!(client.calls(), 3);

    let seen = server.all_valid();
    assert_eq!(seen.len(), 3);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.get("command"), Some("listVirtualMachines"));
        assert_eq!(s.get("listall"), Some("true"));
        // Without stats asked: the cheap listing (no vm_stats rows summed).
        assert_eq!(s.get("details"), Some("nics,tmpl,servoff"));
        assert!(s.get("accumulate").is_none());
        assert_eq!((s.page(), s.pagesize()), (i as u32 + 1, 2));
        assert!(s.get("ids").is_none() && s.get("projectid").is_none());
    }
    let stats = client.stats();
    assert_eq!(stats.calls, 3);
    assert_eq!(
        stats
            .by_command
            .get(&("listVirtualMachines".to_string(), "ok".to_string())),
        Some(&3)
    );
    server.assert_redacted(&format!("{client:?}"));
}

#[tokio::test]
async fn scope_parameters_metrics_api_and_id_chunks() {
    let server = TestServer::start(|_, s| {
        let n = s.get("ids").map_or(0, |ids| ids.split(',').count());
        Canned::json(
            200,
            json!({"listvirtualmachinesmetricsresponse": {"count": 1, "virtualmachine": [
                {"id": format!("vm-{n}"), "state": "Running"}]}})
            .to_string(),
        )
    })
    .await;
    let client = client(&server.url);
    let ids: Vec<String> = (0..150)
        .map(|i| format!("0D1E6F3A-8A43-4B4E-9B1C-{i:012}"))
        .collect();
    let q = VmListQuery {
        project_id: Some("p-1".into()),
        zone_id: Some("z-1".into()),
        account: Some("capi".into()),
        domain_id: Some("d-1".into()),
        ids,
        use_metrics_api: true,
        with_stats: true,
    };
    let l = within(10, client.list_virtual_machines(&q)).await.unwrap();
    assert!(l.complete);
    assert_eq!(l.calls, 2);
    let mut got: Vec<&str> = l.vms.iter().map(|v| v.id.as_str()).collect();
    got.sort();
    assert_eq!(got, vec!["vm-100", "vm-50"]);
    let seen = server.all_valid();
    for s in &seen {
        assert_eq!(s.get("command"), Some("listVirtualMachinesMetrics"));
        assert_eq!(s.get("projectid"), Some("p-1"));
        assert_eq!(s.get("zoneid"), Some("z-1"));
        assert_eq!(s.get("account"), Some("capi"));
        assert_eq!(s.get("domainid"), Some("d-1"));
        let ids = s.get("ids").unwrap();
        assert_eq!(ids, ids.to_ascii_lowercase(), "ids are sent lowercase");
        // Stats asked: the sum of every retained row, whatever the server's global default.
        assert_eq!(s.get("details"), Some("nics,stats,tmpl,servoff"));
        assert_eq!(s.get("accumulate"), Some("true"));
    }
}

#[tokio::test]
async fn empty_list_is_a_complete_empty_listing() {
    let server = TestServer::start(|_, _| Canned::json(200, fixture("list-vms-empty.json"))).await;
    let client = client(&server.url);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert!(l.vms.is_empty());
    assert!(l.complete);
    assert_eq!((l.pages, l.calls), (1, 1));
    assert_eq!(server.all_valid().len(), 1);
}

#[tokio::test]
async fn duplicate_rows_across_pages_are_merged() {
    // rows shifted between pages: vm 2 shows up on page 1 and page 2
    let server = TestServer::start(|_, s| match s.page() {
        1 => Canned::json(200, vms_json(4, &[1, 2])),
        2 => Canned::json(200, vms_json(4, &[2, 3])),
        _ => Canned::json(200, vms_json(4, &[4])),
    })
    .await;
    let client = paged_client(&server.url, 2);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    let ids: Vec<String> = l.vms.iter().map(|v| v.id.clone()).collect();
    assert_eq!(ids, [1, 2, 3, 4].map(vm_id).to_vec());
    assert!(l.complete);
    assert_eq!(l.pages, 3);
    server.all_valid();
}

#[tokio::test]
async fn a_count_that_changes_between_pages_makes_the_listing_incomplete() {
    // vm 3 was deleted after page 1: rows shifted and page 2 skips one
    let server = TestServer::start(|_, s| match s.page() {
        1 => Canned::json(200, vms_json(5, &[1, 2])),
        2 => Canned::json(200, vms_json(4, &[4, 5])),
        _ => Canned::json(200, fixture("list-vms-empty.json")),
    })
    .await;
    let client = paged_client(&server.url, 2);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(l.vms.len(), 4);
    assert!(!l.complete);
}

#[tokio::test]
async fn malformed_item_makes_the_listing_incomplete_not_shorter() {
    let server =
        TestServer::start(|_, _| Canned::json(200, fixture("list-vms-malformed-items.json"))).await;
    let client = client(&server.url);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(l.vms.len(), 1);
    assert_eq!(l.vms[0].id, vm_id(401));
    assert_eq!(l.failures.len(), 2);
    assert_eq!(l.failures[0].id.as_deref(), Some(vm_id(402).as_str()));
    assert!(
        !l.complete,
        "a listing with an unreadable item must not be complete"
    );
}

#[tokio::test]
async fn retry_on_429_honours_retry_after() {
    let server = TestServer::start(|n, s| {
        if n == 0 {
            Canned::json(
                429,
                json!({"listvirtualmachinesresponse": {"uuidList": [], "errorcode": 429, "cserrorcode": 9999,
                    "errortext": "The given user has reached his/her account api limit, please retry after [300] ms."}})
                .to_string(),
            )
        } else {
            page_fixture(s.page())
        }
    })
    .await;
    let client = client(&server.url); // back-off base 10 ms: only the server's hint explains a long wait
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(
        l.vms.len(),
        2,
        "page 1 fixture: 2 of 5 rows, short of pagesize 500"
    );
    assert_eq!(l.calls, 2);
    let seen = server.all_valid();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(gap >= Duration::from_millis(300), "retried after {gap:?}");
    assert!(gap < Duration::from_millis(1500), "retried after {gap:?}");
    assert_eq!(client.stats().retries, 1);
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_ends_the_call() {
    let server = TestServer::start(|_, _| {
        Canned::json(
            429,
            json!({"listvirtualmachinesresponse": {"uuidList": [], "errorcode": 429, "cserrorcode": 9999,
                "errortext": "please retry after [60000] ms."}})
            .to_string(),
        )
    })
    .await;
    let client = client(&server.url);
    let started = std::time::Instant::now();
    let e = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(e.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(e.kind(), "throttled");
    assert_eq!(server.all_valid().len(), 1);
    server.assert_redacted(&e);
}

#[tokio::test]
async fn retry_on_530_then_success() {
    let server = TestServer::start(|n, s| {
        if n == 0 {
            Canned::json(530, fixture("error-530-internal.json"))
        } else {
            page_fixture(s.page())
        }
    })
    .await;
    let client = client(&server.url);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(l.vms.len(), 2);
    assert_eq!(l.calls, 2);
    let seen = server.all_valid();
    assert_eq!(seen.len(), 2);
    let stats = client.stats();
    let key = |o: &str| ("listVirtualMachines".to_string(), o.to_string());
    assert_eq!(stats.by_command.get(&key("server_error")), Some(&1));
    assert_eq!(stats.by_command.get(&key("ok")), Some(&1));
}

#[tokio::test]
async fn persistent_5xx_gives_up_after_max_attempts() {
    let server = TestServer::start(|_, _| {
        Canned::json(
            534,
            json!({"listvirtualmachinesresponse":
        {"uuidList": [], "errorcode": 534, "cserrorcode": 4380, "errortext": "host unreachable"}})
            .to_string(),
        )
    })
    .await;
    let client = client(&server.url);
    let e = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(534));
    assert_eq!(server.all_valid().len(), 3, "max_attempts = 3");
    server.assert_redacted(&e);
}

#[tokio::test]
async fn no_retry_on_401_431_432() {
    for (file, status, kind) in [
        ("error-401-signature.json", 401, "unauthorized"),
        ("error-431-unknown-uuid.json", 431, "invalid_parameter"),
        ("error-432-not-allowed.json", 432, "not_allowed"),
    ] {
        let server = TestServer::start(move |_, _| Canned::json(status, fixture(file))).await;
        let client = client(&server.url);
        let e = within(10, client.list_virtual_machines(&VmListQuery::default()))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{file}");
        assert_eq!(server.all_valid().len(), 1, "{file}: not retried");
        server.assert_redacted(&e);
        if status == 431 {
            assert!(
                matches!(&e, CloudStackError::InvalidParameter { unknown_id: Some(id), .. }
                if id == "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11")
            );
        }
    }
}

#[tokio::test]
async fn page_size_431_shrinks_to_the_server_maximum() {
    let server = TestServer::start(|_, s| {
        if s.pagesize() > 2 {
            Canned::json(431, fixture("error-431-page-size.json").replace("200", "2"))
        } else {
            page_fixture(s.page())
        }
    })
    .await;
    let client = client(&server.url);
    assert_eq!(client.page_size(), 500);
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(l.vms.len(), 5);
    assert!(l.complete);
    assert_eq!(client.page_size(), 2);
    let seen = server.all_valid();
    let sizes: Vec<(u32, u32)> = seen.iter().map(|s| (s.page(), s.pagesize())).collect();
    assert_eq!(sizes, vec![(1, 500), (1, 2), (2, 2), (3, 2)]);
    assert_eq!(l.calls, 4);
    // the next listing starts with the learned size
    within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(server.seen()[4].pagesize(), 2);
}

#[tokio::test]
async fn page_size_431_without_a_number_halves() {
    let server = TestServer::start(|_, s| {
        if s.pagesize() > 100 {
            Canned::json(431, json!({"listvirtualmachinesresponse": {"uuidList": [], "errorcode": 431,
                "cserrorcode": 4350, "errortext": "Page size can't exceed max allowed page size value"}}).to_string())
        } else {
            Canned::json(200, vms_json(1, &[1]))
        }
    })
    .await;
    let mut c = config(&server.url);
    c.page_size = 400;
    let client = CloudStackClient::new(c).unwrap();
    let l = within(10, client.list_virtual_machines(&VmListQuery::default()))
        .await
        .unwrap();
    assert_eq!(l.vms.len(), 1);
    assert_eq!(client.page_size(), 100);
    let sizes: Vec<u32> = server.all_valid().iter().map(|s| s.pagesize()).collect();
    assert_eq!(sizes, vec![400, 200, 100]);
}

#[tokio::test]
async fn html_body_is_not_json_and_retried_only_for_gateway_statuses() {
    let server = TestServer::start(|_, _| Canned::html(502, fixture("proxy-502.html"))).await;
    let client = client(&server.url);
    let e = within(10, client.list_capabilities()).await.unwrap_err();
    match &e {
        CloudStackError::NotJson {
            status,
            content_type,
            snippet,
        } => {
            assert_eq!(*status, 502);
            assert_eq!(content_type.as_deref(), Some("text/html"));
            assert!(snippet.contains("502 Bad Gateway"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.all_valid().len(), 3, "502 from a proxy is retried");
    server.assert_redacted(&e);

    let login =
        TestServer::start(|_, _| Canned::html(200, "<html><body>Please log in</body></html>"))
            .await;
    let client = support::client(&login.url);
    let e = within(10, client.list_capabilities()).await.unwrap_err();
    assert_eq!(e.kind(), "not_json");
    assert_eq!(
        login.all_valid().len(),
        1,
        "a 200 login page is not retried"
    );
}

#[tokio::test]
async fn a_proxy_page_echoing_the_request_does_not_leak_the_signature() {
    let server = TestServer::start(|_, s| {
        let sig = s.get("signature").unwrap_or("").to_string();
        Canned::html(
            403,
            format!(
                "<html><body>Denied {sig} signature={sig} for {}</body></html>",
                s.raw_query
            ),
        )
    })
    .await;
    let client = client(&server.url);
    let e = within(10, client.list_capabilities()).await.unwrap_err();
    assert_eq!(e.kind(), "not_json");
    assert!(format!("{e}").contains("<redacted>"), "{e}");
    server.assert_redacted(&e);
}

#[tokio::test]
async fn timeout_is_reported_as_timeout() {
    let server = TestServer::start(|_, _| {
        Canned::json(200, fixture("capabilities.json")).delayed(Duration::from_secs(5))
    })
    .await;
    let mut c = config(&server.url);
    c.request_timeout = Duration::from_millis(300);
    c.retry = RetryPolicy::none();
    let client = CloudStackClient::new(c).unwrap();
    let started = std::time::Instant::now();
    let e = within(10, client.list_capabilities()).await.unwrap_err();
    assert!(
        matches!(e, CloudStackError::Timeout { after } if after == Duration::from_millis(300)),
        "{e:?}"
    );
    assert!(e.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(3));
    server.assert_redacted(&e);
}

#[tokio::test]
async fn connection_refused_is_a_transport_error_without_the_url() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}/client/api");
    let client = client(&url);
    let e = within(10, client.list_capabilities()).await.unwrap_err();
    assert_eq!(e.kind(), "transport", "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(!text.contains("signature"), "{text}");
    assert!(
        !text.contains("command=") && !text.contains("apiKey"),
        "{text}"
    );
    assert!(!text.contains(SECRET));
    assert_eq!(client.calls(), 3, "transport errors are retried");
}

#[tokio::test]
async fn rate_limiter_spaces_requests() {
    let server = TestServer::start(|_, _| Canned::json(200, fixture("capabilities.json"))).await;
    let mut c = config(&server.url);
    c.rate_limit = Some(RateLimit::new(10.0, 1).unwrap());
    let client = CloudStackClient::new(c).unwrap();
    within(10, async {
        for _ in 0..4 {
            client.list_capabilities().await.unwrap();
        }
    })
    .await;
    let seen = server.all_valid();
    assert_eq!(seen.len(), 4);
    for w in seen.windows(2) {
        let gap = w[1].at.duration_since(w[0].at);
        assert!(gap >= Duration::from_millis(70), "requests {gap:?} apart");
    }
    let span = seen[3].at.duration_since(seen[0].at);
    assert!(
        span >= Duration::from_millis(280),
        "4 requests at 10/s took {span:?}"
    );
    // How long each call waited depends on how long the previous request took (the bucket
    // refills meanwhile), so on a loaded machine only "some calls waited" is certain; the
    // spacing above is what the limiter guarantees.
    let stats = client.stats();
    assert!((1..=3).contains(&stats.rate_limited_calls), "{stats:?}");
    assert!(stats.rate_limit_wait > Duration::ZERO, "{stats:?}");
}

#[tokio::test]
async fn usage_history_and_its_unsupported_mapping() {
    let server = TestServer::start(|_, _| Canned::json(200, fixture("usage-history.json"))).await;
    let client = client(&server.url);
    let ids = vec![vm_id(601), vm_id(602)];
    let start = CsTime::parse("2026-11-30T10:00:00+0000").unwrap();
    let h = within(10, client.list_usage_history(&ids, Some(start)))
        .await
        .unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].stats.len(), 3);
    let seen = server.all_valid();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].get("command"),
        Some("listVirtualMachinesUsageHistory")
    );
    assert_eq!(
        seen[0].get("ids"),
        Some(format!("{},{}", vm_id(601), vm_id(602)).as_str())
    );
    // The instant at −12:00: exact on zone-aware servers, never a later date on date-only ones.
    assert_eq!(seen[0].get("startdate"), Some("2026-11-29T22:00:00-12:00"));
    assert!(seen[0].get("enddate").is_none());
    assert!(within(10, client.list_usage_history(&[], None))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(server.seen().len(), 1, "no ids, no call");

    for (file, status) in [
        ("error-401-unknown-command.json", 401),
        ("error-432-not-allowed.json", 432),
        ("error-401-denied-by-role.json", 401),
    ] {
        let server = TestServer::start(move |_, _| Canned::json(status, fixture(file))).await;
        let client = support::client(&server.url);
        let e = within(10, client.list_usage_history(&ids, None))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, CloudStackError::Unsupported { command, .. } if command == "listVirtualMachinesUsageHistory"),
            "{file}: {e:?}"
        );
        assert_eq!(e.kind(), "unsupported");
        assert_eq!(server.all_valid().len(), 1);
        server.assert_redacted(&e);
    }
    // a plain signature failure stays Unauthorized
    let server = TestServer::start(|_, _| {
        Canned::json(
            401,
            fixture("error-401-signature.json").replace(
                "listvirtualmachinesresponse",
                "listvirtualmachinesusagehistoryresponse",
            ),
        )
    })
    .await;
    let e = within(
        10,
        support::client(&server.url).list_usage_history(&ids, None),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), "unauthorized");
}

#[tokio::test]
async fn capabilities_and_permission_self_test() {
    let server = TestServer::start(|_, s| match (s.get("command"), s.get("name")) {
        (Some("listCapabilities"), _) => Canned::json(200, fixture("capabilities.json")),
        (Some("listApis"), Some("listVirtualMachines")) => {
            Canned::json(200, fixture("list-apis.json"))
        }
        (Some("listApis"), _) => Canned::json(530, fixture("error-530-listapis-unknown-name.json")),
        _ => Canned::json(401, fixture("error-401-unknown-command.json")),
    })
    .await;
    let client = client(&server.url);
    let caps = within(10, client.list_capabilities()).await.unwrap();
    assert_eq!(caps.cloudstackversion.as_deref(), Some("4.19.1.2"));
    assert_eq!(caps.apilimitmax, Some(25));
    assert!(within(10, client.api_allowed("listVirtualMachines"))
        .await
        .unwrap());
    assert!(!within(10, client.api_allowed("listNics")).await.unwrap());
    let seen = server.all_valid();
    assert_eq!(
        seen.len(),
        3,
        "the 'unable to find an api' 530 is an answer, not retried"
    );
    assert_eq!(seen[2].get("name"), Some("listNics"));
}

#[tokio::test]
async fn generic_call_and_list() {
    let server = TestServer::start(|_, s| match s.get("command") {
        Some("listZones") => Canned::json(
            200,
            json!({"listzonesresponse": {"count": 1, "zone": [{"id": "z-1", "name": "zone-a"}]}})
                .to_string(),
        ),
        Some("destroyVirtualMachine") => Canned::json(530, fixture("error-530-internal.json")),
        _ => Canned::json(
            200,
            json!({"getapilimitresponse": {"apilimit": {"apiIssued": 3, "apiAllowed": 22}}})
                .to_string(),
        ),
    })
    .await;
    let client = client(&server.url);
    let v = within(10, client.call("getApiLimit", &[])).await.unwrap();
    assert_eq!(v["apilimit"]["apiAllowed"], 22);
    let l = within(
        10,
        client.list::<Value>("listZones", "zone", &[("available", "true"), ("Page", "9")]),
    )
    .await
    .unwrap();
    assert!(l.complete);
    assert_eq!(l.items[0]["name"], "zone-a");
    // not a read: never retried
    let e = within(10, client.call("destroyVirtualMachine", &[("id", "x")]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "server_error");
    let seen = server.all_valid();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].get("available"), Some("true"));
    assert_eq!(seen[1].page(), 1, "callers cannot override the page");
    server.assert_redacted(&e);
}

#[tokio::test]
async fn every_request_is_signed_afresh() {
    let server = TestServer::start(|_, _| Canned::json(200, fixture("capabilities.json"))).await;
    let client = client(&server.url);
    within(10, async {
        client.list_capabilities().await.unwrap();
        // expires has one-second resolution; wait for the next second so the signature must change
        tokio::time::sleep(Duration::from_millis(1100)).await;
        client.list_capabilities().await.unwrap();
    })
    .await;
    let seen = server.all_valid();
    assert_ne!(seen[0].get("expires"), seen[1].get("expires"));
    assert_ne!(seen[0].get("signature"), seen[1].get("signature"));
}

#[test]
fn vm_type_is_reexported_for_callers() {
    // compile-time check that listing types line up
    let _: fn(&capc_health_shim::cloudstack::VmListing) -> &Vec<VirtualMachine> = |l| &l.vms;
    assert_eq!(VmState::parse("Running"), VmState::Running);
}

/// With the sentinel secret, produce one error of every kind the client can return from the
/// wire and check that Debug and Display of each (and of the client and its config) carry
/// neither the secret nor any signature the server received.
#[tokio::test]
async fn redaction_across_every_error_kind() {
    let server = TestServer::start(|_, s| {
        let sig = s.get("signature").unwrap_or("").to_string();
        match s.get("scenario").unwrap_or("") {
            "401" => Canned::json(401, fixture("error-401-signature.json")),
            "429" => Canned::json(
                429,
                fixture("error-429-throttled.json").replace("[218]", "[90000]"),
            ),
            "431" => Canned::json(431, fixture("error-431-unknown-uuid.json")),
            "432" => Canned::json(432, fixture("error-432-not-allowed.json")),
            "530" => Canned::json(530, fixture("error-530-internal.json")),
            "502" => Canned::html(502, fixture("proxy-502.html")),
            "echo" => Canned::html(400, format!("bad request {sig} {}", s.raw_query)),
            "errortext-echo" => Canned::json(
                431,
                json!({"errorresponse": {"uuidList": [], "errorcode": 431,
                    "errortext": format!("bad signature {sig} in {}", s.raw_query)}})
                .to_string(),
            ),
            "truncated" => Canned::json(200, "{\"listcapabilitiesresponse\":{\"capability\":"),
            "shape" => Canned::json(
                200,
                "{\"listvirtualmachinesresponse\":{\"count\":\"many\"}}",
            ),
            "slow" => {
                Canned::json(200, fixture("capabilities.json")).delayed(Duration::from_secs(5))
            }
            _ => Canned::json(200, fixture("capabilities.json")),
        }
    })
    .await;
    let mut c = config(&server.url);
    c.request_timeout = Duration::from_millis(300);
    c.retry.max_retry_after = Duration::from_secs(1);
    server.assert_clean(&format!("{c:?}"));
    let client = CloudStackClient::new(c).unwrap();
    let mut kinds = Vec::new();
    for scenario in [
        "401",
        "429",
        "431",
        "432",
        "530",
        "502",
        "echo",
        "errortext-echo",
        "truncated",
        "shape",
        "slow",
    ] {
        let e = if scenario == "shape" {
            within(
                20,
                client.list::<VirtualMachine>(
                    "listVirtualMachines",
                    "virtualmachine",
                    &[("scenario", scenario)],
                ),
            )
            .await
            .unwrap_err()
        } else {
            within(
                20,
                client.call("listCapabilities", &[("scenario", scenario)]),
            )
            .await
            .unwrap_err()
        };
        server.assert_redacted(&e);
        kinds.push(e.kind());
    }
    // transport error against a closed port, same credentials
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/client/api", closed.local_addr().unwrap());
    drop(closed);
    let e = within(20, support::client(&url).list_capabilities())
        .await
        .unwrap_err();
    assert!(!format!("{e} {e:?}").contains(SECRET));
    kinds.push(e.kind());
    server.assert_redacted(&format!("{client:?}"));
    assert_eq!(
        kinds,
        vec![
            "unauthorized",
            "throttled",
            "invalid_parameter",
            "not_allowed",
            "server_error",
            "not_json",
            "not_json",
            "invalid_parameter",
            "malformed",
            "malformed",
            "timeout",
            "transport",
        ]
    );
    assert!(server.signatures().len() >= 20);
}
