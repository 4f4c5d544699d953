//! Every file in `cloudstack-fixtures/wire/` parses to its expected typed result or error.
//! A file without an expectation here fails the suite.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use capc_health_shim::cloudstack::error::{CloudStackError, ErrorDetail};
use capc_health_shim::cloudstack::model::{
    ApiInfo, CsTime, HostControlState, UsageHistoryVm, VirtualMachine, VmState,
};
use capc_health_shim::cloudstack::parse::{
    parse_capabilities, parse_error_envelope, parse_list_page, ListPage, Reply,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cloudstack-fixtures/wire")
}

fn read(file: &str) -> Vec<u8> {
    std::fs::read(dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn vms(file: &str) -> ListPage<VirtualMachine> {
    vms_cmd(file, "listVirtualMachines")
}

fn vms_cmd(file: &str, command: &str) -> ListPage<VirtualMachine> {
    let b = read(file);
    parse_list_page(command, "virtualmachine", Reply::json(&b))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn t(s: &str) -> CsTime {
    CsTime::parse(s).unwrap()
}

fn vm_id(i: u64) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// The error a body gives with its real status and with a proxy-rewritten 200.
fn error_of(file: &str, command: &str, status: u16) -> CloudStackError {
    let b = read(file);
    let real = parse_list_page::<VirtualMachine>(
        command,
        "virtualmachine",
        Reply::new(status, Some("application/json"), &b),
    )
    .expect_err(file);
    let rewritten = parse_list_page::<VirtualMachine>(command, "virtualmachine", Reply::json(&b))
        .expect_err(file);
    assert_eq!(real, rewritten, "{file}: the body decides, not the status");
    let env = parse_error_envelope(command, Reply::json(&b)).expect("envelope");
    assert_eq!(env.errorcode, status, "{file}");
    real
}

fn check_every_state() {
    let p = vms("list-vms-every-state.json");
    assert!(p.is_clean());
    assert_eq!((p.count, p.received), (12, 12));
    let states: Vec<VmState> = p.items.iter().map(|v| v.state.clone()).collect();
    assert_eq!(
        states,
        vec![
            VmState::Starting,
            VmState::Running,
            VmState::Stopping,
            VmState::Stopped,
            VmState::Destroyed,
            VmState::Expunging,
            VmState::Migrating,
            VmState::Error,
            VmState::Unknown,
            VmState::Shutdown,
            VmState::Restoring,
            VmState::Other("Hibernating".into()),
        ]
    );
    let running = &p.items[1];
    assert_eq!(running.hostcontrolstate, Some(HostControlState::Enabled));
    assert_eq!(running.nics[0].ipaddress.as_deref(), Some("10.1.1.2"));
    assert_eq!(running.lastupdated, Some(t("2026-11-30T10:00:00Z")));
    let stopping = &p.items[2];
    assert_eq!(
        stopping.hostcontrolstate,
        Some(HostControlState::Maintenance)
    );
    assert_eq!(stopping.jobstatus, Some(0));
    assert!(stopping.jobid.is_some());
    let unknown = &p.items[8];
    assert!(unknown
        .hostcontrolstate
        .as_ref()
        .is_some_and(|h| h.is_unreachable()));
    assert!(p.items[3].nics.is_empty() && p.items[3].hostid.is_none());
}

fn check_nics() {
    let p = vms("list-vms-nic-variants.json");
    assert!(p.is_clean());
    let by = |i: u64| p.items.iter().find(|v| v.id == vm_id(i)).unwrap();
    let n = &by(101).nics;
    assert_eq!(n.len(), 1);
    assert!(n[0].isdefault && n[0].has_address());
    assert_eq!(n[0].ipaddress.as_deref(), Some("10.1.1.101"));
    assert!(by(102).nics.is_empty());
    let n = &by(103).nics;
    assert!(n[0].isdefault && n[0].expects_address() && !n[0].has_address());
    let n = &by(104).nics;
    assert!(!n[0].expects_address() && !n[0].has_address());
    assert_eq!(n[0].network_type.as_deref(), Some("L2"));
    let n = &by(105).nics;
    assert_eq!(n.len(), 2);
    assert!(!n[0].isdefault && n[1].isdefault);
    assert_eq!(n[1].ipaddress.as_deref(), Some("10.1.1.105"));
    let n = &by(106).nics;
    assert!(n[0].ipaddress.is_none() && n[0].has_address());
    assert_eq!(n[0].ip6address.as_deref(), Some("fd00:1::106"));
}

fn check_stats() {
    let p = vms("list-vms-stats-variants.json");
    assert!(p.is_clean());
    let [a, b, c, d] = [&p.items[0], &p.items[1], &p.items[2], &p.items[3]];
    assert_eq!(
        (a.networkkbsread, a.networkkbswrite),
        (Some(1_015_808), Some(507_904))
    );
    assert_eq!(a.cpuused.as_deref(), Some("12.5%"));
    assert_eq!(
        (b.networkkbsread, b.networkkbswrite, b.cpuused.as_deref()),
        (None, None, None)
    );
    assert_eq!(
        (c.networkkbsread, c.networkkbswrite),
        (Some(2048), Some(1024))
    );
    assert_eq!(d.created, Some(t("2021-09-29T12:20:11Z")));
    assert_eq!(d.lastupdated, Some(t("2021-10-04T05:56:38Z")));
    assert_eq!(d.networkkbswrite, Some(7));
}

fn check_empty() {
    let p = vms("list-vms-empty.json");
    assert_eq!((p.count, p.count_present, p.received), (0, false, 0));
    assert!(p.items.is_empty() && p.is_clean());
}

fn check_pages() {
    let mut ids = Vec::new();
    for (file, n) in [
        ("list-vms-page-1.json", 2),
        ("list-vms-page-2.json", 2),
        ("list-vms-page-3.json", 1),
    ] {
        let p = vms(file);
        assert_eq!((p.count, p.received, p.items.len()), (5, n, n), "{file}");
        ids.extend(p.items.into_iter().map(|v| v.id));
    }
    assert_eq!(ids, (301..=305).map(vm_id).collect::<Vec<_>>());
}

fn check_malformed() {
    let p = vms("list-vms-malformed-items.json");
    assert_eq!((p.count, p.received, p.items.len()), (3, 3, 1));
    assert_eq!(p.items[0].id, vm_id(401));
    assert!(!p.is_clean());
    assert_eq!(p.failures.len(), 2);
    assert_eq!(p.failures[0].index, 1);
    assert_eq!(p.failures[0].id.as_deref(), Some(vm_id(402).as_str()));
    assert_eq!(p.failures[1].index, 2);
    assert_eq!(p.failures[1].id, None);
    assert!(
        p.failures[1].reason.contains("id"),
        "{}",
        p.failures[1].reason
    );
}

fn check_metrics() {
    let p = vms_cmd("list-vms-metrics.json", "listVirtualMachinesMetrics");
    assert!(p.is_clean());
    assert_eq!(p.items[0].networkkbswrite, Some(900));
    assert_eq!(p.items[0].nics[0].ipaddress.as_deref(), Some("10.1.5.1"));
}

fn check_usage_history() {
    let b = read("usage-history.json");
    let p: ListPage<UsageHistoryVm> = parse_list_page(
        "listVirtualMachinesUsageHistory",
        "virtualmachine",
        Reply::json(&b),
    )
    .unwrap();
    assert!(p.is_clean());
    assert_eq!(p.items.len(), 2);
    let s = &p.items[0].stats;
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].networkkbswrite, Some(50));
    assert_eq!(s[2].networkkbswrite, Some(130));
    assert_eq!(s[2].timestamp, Some(t("2026-11-30T10:02:00Z")));
    assert!(s[0].timestamp < s[1].timestamp && s[1].timestamp < s[2].timestamp);
    assert!(p.items[1].stats.is_empty());
}

fn check_capabilities() {
    let b = read("capabilities.json");
    let c = parse_capabilities(Reply::json(&b)).unwrap();
    assert_eq!(c.cloudstackversion.as_deref(), Some("4.19.1.2"));
    assert_eq!((c.apilimitinterval, c.apilimitmax), (Some(1), Some(25)));
    assert_eq!(c.instancesstatsretentiontime, Some(720));
    assert_eq!(c.allowuserviewdestroyedvm, Some(false));
}

fn check_list_apis() {
    let b = read("list-apis.json");
    let p: ListPage<ApiInfo> = parse_list_page("listApis", "api", Reply::json(&b)).unwrap();
    assert_eq!(p.items.len(), 1);
    assert_eq!(p.items[0].name, "listVirtualMachines");
    assert_eq!(p.items[0].isasync, Some(false));
    assert_eq!(p.items[0].since, None);
}

fn check_errors() {
    let e = error_of("error-401-signature.json", "listVirtualMachines", 401);
    assert_eq!(
        e,
        CloudStackError::Unauthorized {
            detail: ErrorDetail::new(
                None,
                Some("unable to verify user credentials and/or request signature")
            ),
            command_unknown: false,
        }
    );
    assert!(!e.is_retryable());

    let e = error_of(
        "error-401-unknown-command.json",
        "listVirtualMachinesUsageHistory",
        401,
    );
    assert!(matches!(
        e,
        CloudStackError::Unauthorized {
            command_unknown: true,
            ..
        }
    ));
    assert!(e.is_command_unavailable());

    let e = error_of(
        "error-401-denied-by-role.json",
        "listVirtualMachinesUsageHistory",
        401,
    );
    assert!(
        matches!(
            e,
            CloudStackError::Unauthorized {
                command_unknown: true,
                ..
            }
        ),
        "{e:?}"
    );

    let e = error_of("error-429-throttled.json", "listVirtualMachines", 429);
    assert_eq!(e.kind(), "throttled");
    assert_eq!(e.retry_after(), Some(Duration::from_millis(218)));
    assert_eq!(e.detail().and_then(|d| d.cserrorcode), Some(9999));
    assert!(e.is_retryable());

    let e = error_of("error-431-page-size.json", "listVirtualMachines", 431);
    assert!(matches!(
        e,
        CloudStackError::InvalidParameter {
            page_size_max: Some(200),
            unknown_id: None,
            ..
        }
    ));
    assert!(e.is_page_size_error() && !e.is_retryable());
    assert_eq!(e.detail().and_then(|d| d.cserrorcode), Some(4350));

    let e = error_of("error-431-unknown-uuid.json", "listVirtualMachines", 431);
    match &e {
        CloudStackError::InvalidParameter {
            page_size_max: None,
            unknown_id: Some(id),
            ..
        } => {
            assert_eq!(id, "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11")
        }
        other => panic!("{other:?}"),
    }
    assert!(!e.is_page_size_error());
    assert!(e
        .to_string()
        .contains("0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11"));

    let e = error_of(
        "error-432-not-allowed.json",
        "listVirtualMachinesUsageHistory",
        432,
    );
    assert_eq!(e.kind(), "not_allowed");
    assert_eq!(e.detail().and_then(|d| d.cserrorcode), Some(4555));
    assert!(e.is_command_unavailable() && !e.is_retryable());

    let e = error_of("error-530-internal.json", "listVirtualMachines", 530);
    assert_eq!(e.code(), Some(530));
    assert_eq!(e.kind(), "server_error");
    assert!(e.is_retryable());
    assert!(e.to_string().contains("INTERNAL_ERROR") && e.to_string().contains("4250"));

    let b = read("error-530-listapis-unknown-name.json");
    let e = parse_list_page::<ApiInfo>(
        "listApis",
        "api",
        Reply::new(530, Some("application/json"), &b),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CloudStackError::Server { code: 530, detail } if detail.errortext.as_deref().is_some_and(|t| t.contains("unable to find an api")))
    );
}

fn check_proxy_html() {
    let b = read("proxy-502.html");
    let e = parse_list_page::<VirtualMachine>(
        "listVirtualMachines",
        "virtualmachine",
        Reply::new(502, Some("text/html"), &b),
    )
    .unwrap_err();
    match &e {
        CloudStackError::NotJson {
            status: 502,
            content_type: Some(ct),
            snippet,
        } => {
            assert_eq!(ct, "text/html");
            assert!(snippet.starts_with("502 Bad Gateway"), "{snippet}");
            assert!(!snippet.contains('<'));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.is_retryable());
    // the same page served with 200 is still not JSON, and not worth retrying
    let e = parse_list_page::<VirtualMachine>(
        "listVirtualMachines",
        "virtualmachine",
        Reply::new(200, Some("text/html"), &b),
    )
    .unwrap_err();
    assert_eq!(e.kind(), "not_json");
    assert!(!e.is_retryable());
}

/// Fixture files and the check that covers them.
type Check = (&'static [&'static str], fn());

#[test]
fn every_wire_fixture_has_its_expected_result() {
    let checks: &[Check] = &[
        (&["list-vms-every-state.json"], check_every_state),
        (&["list-vms-nic-variants.json"], check_nics),
        (&["list-vms-stats-variants.json"], check_stats),
        (&["list-vms-empty.json"], check_empty),
        (
            &[
                "list-vms-page-1.json",
                "list-vms-page-2.json",
                "list-vms-page-3.json",
            ],
            check_pages,
        ),
        (&["list-vms-malformed-items.json"], check_malformed),
        (&["list-vms-metrics.json"], check_metrics),
        (&["usage-history.json"], check_usage_history),
        (&["capabilities.json"], check_capabilities),
        (&["list-apis.json"], check_list_apis),
        (
            &[
                "error-401-signature.json",
                "error-401-unknown-command.json",
                "error-401-denied-by-role.json",
                "error-429-throttled.json",
                "error-431-page-size.json",
                "error-431-unknown-uuid.json",
                "error-432-not-allowed.json",
                "error-530-internal.json",
                "error-530-listapis-unknown-name.json",
            ],
            check_errors,
        ),
        (&["proxy-502.html"], check_proxy_html),
    ];
    let mut covered = BTreeSet::new();
    for (files, check) in checks {
        check();
        covered.extend(files.iter().map(|f| f.to_string()));
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|f| f != "README.md")
        .collect();
    assert_eq!(
        on_disk, covered,
        "every fixture file needs an expectation (and vice versa)"
    );
    // the README lists every file
    let readme = std::fs::read_to_string(dir().join("README.md")).unwrap();
    for f in &on_disk {
        let listed = readme.contains(&format!("`{f}`"))
            || (f.starts_with("list-vms-page-") && readme.contains("`list-vms-page-1.json`"));
        assert!(listed, "README.md does not trace {f}");
    }
}
