//! The parts of CloudStack's responses the shim reads, parsed tolerantly.
//!
//! CloudStack adds fields and states across releases, sends some numbers as strings and
//! some dates with `+0530`-style offsets. Parsing here ignores unknown fields, treats every
//! field we do not strictly need as optional and keeps unknown enum values verbatim
//! (`Other(String)`) so that a newer server never turns into a parse failure.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod job;
mod router;
pub use job::{last_failed_destroy, AsyncJob, DESTROY_VM_CMD};
pub use router::{pick_router, DiagnosticsOutput, Router, RouterNic};

/// A VM state as CloudStack reports it (`com.cloud.vm.VirtualMachine.State`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VmState {
    Starting,
    Running,
    Stopping,
    Stopped,
    Destroyed,
    Expunging,
    Migrating,
    Error,
    Unknown,
    Shutdown,
    Restoring,
    /// A state this version does not know; kept verbatim, never treated as a failure.
    Other(String),
}

impl VmState {
    pub fn parse(s: &str) -> Self {
        match s {
            "Starting" => Self::Starting,
            "Running" => Self::Running,
            "Stopping" => Self::Stopping,
            "Stopped" => Self::Stopped,
            "Destroyed" => Self::Destroyed,
            "Expunging" => Self::Expunging,
            "Migrating" => Self::Migrating,
            "Error" => Self::Error,
            "Unknown" => Self::Unknown,
            "Shutdown" => Self::Shutdown,
            "Restoring" => Self::Restoring,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Stopping => "Stopping",
            Self::Stopped => "Stopped",
            Self::Destroyed => "Destroyed",
            Self::Expunging => "Expunging",
            Self::Migrating => "Migrating",
            Self::Error => "Error",
            Self::Unknown => "Unknown",
            Self::Shutdown => "Shutdown",
            Self::Restoring => "Restoring",
            Self::Other(s) => s,
        }
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for VmState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::parse(&s))
    }
}

impl Serialize for VmState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The control state of the host running a VM (`hostcontrolstate`, CloudStack 4.18+).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostControlState {
    Enabled,
    Disabled,
    Offline,
    Maintenance,
    Unknown,
    Other(String),
}

impl HostControlState {
    pub fn parse(s: &str) -> Self {
        match s {
            "Enabled" => Self::Enabled,
            "Disabled" => Self::Disabled,
            "Offline" => Self::Offline,
            "Maintenance" => Self::Maintenance,
            "Unknown" => Self::Unknown,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Enabled => "Enabled",
            Self::Disabled => "Disabled",
            Self::Offline => "Offline",
            Self::Maintenance => "Maintenance",
            Self::Unknown => "Unknown",
            Self::Other(s) => s,
        }
    }

    /// Whether the management server has lost touch with the host, so the VM's recorded
    /// state may be stale. `Disconnected` is the host `state` vocabulary; accept it here too.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Offline | Self::Unknown => true,
            Self::Other(s) => s.eq_ignore_ascii_case("Disconnected"),
            _ => false,
        }
    }
}

impl<'de> Deserialize<'de> for HostControlState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::parse(&s))
    }
}

impl Serialize for HostControlState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A CloudStack timestamp. The wire form is `yyyy-MM-dd'T'HH:mm:ssZ` (`2021-09-29T17:50:11+0530`);
/// newer servers also accept and may emit ISO forms (`…Z`, `…+00:00`), so all are parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CsTime(pub Timestamp);

/// The times a CloudStack date may carry: from the Unix epoch to the year 2200. Anything
/// outside is refused (the field reads as absent) rather than fed to arithmetic that a
/// far-future date could overflow.
const CS_TIME_RANGE: (i64, i64) = (0, 7_258_118_400);

impl CsTime {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let t = Self::read(s).ok_or_else(|| format!("not a CloudStack date: {s:?}"))?;
        let secs = t.as_second();
        if secs < CS_TIME_RANGE.0 || secs >= CS_TIME_RANGE.1 {
            return Err(format!(
                "CloudStack date {s:?} is outside 1970..2200; not used"
            ));
        }
        Ok(Self(t))
    }

    fn read(s: &str) -> Option<Timestamp> {
        if let Ok(t) =
            jiff::fmt::strtime::parse("%Y-%m-%dT%H:%M:%S%z", s).and_then(|t| t.to_timestamp())
        {
            return Some(t);
        }
        if let Ok(t) = s.parse::<Timestamp>() {
            return Some(t);
        }
        // `yyyy-MM-dd HH:mm:ss` (usage-history parameters) carries no zone: read it as UTC.
        let dt = s.parse::<jiff::civil::DateTime>().ok()?;
        dt.to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The `+0000` form CloudStack has always accepted (used for `expires`).
    pub fn to_cloudstack_string(&self) -> String {
        self.0.strftime("%Y-%m-%dT%H:%M:%S+0000").to_string()
    }
}

impl<'de> Deserialize<'de> for CsTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CsTime::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl Serialize for CsTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_cloudstack_string())
    }
}

/// Lenient field readers: CloudStack sends some numbers as strings, and a field that does
/// not parse should make that field absent rather than fail the whole page.
pub mod lenient;

/// One VM of a `listVirtualMachines` / `listVirtualMachinesMetrics` page.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct VirtualMachine {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub displayname: Option<String>,
    pub state: VmState,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub zoneid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub zonename: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub account: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub domainid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub projectid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hostid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostcontrolstate: Option<HostControlState>,
    #[serde(
        default,
        deserialize_with = "lenient::bool_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub haenable: Option<bool>,
    #[serde(
        default,
        deserialize_with = "lenient::time_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub created: Option<CsTime>,
    /// ≈ time of the last state change (CloudStack 4.16+).
    #[serde(
        default,
        deserialize_with = "lenient::time_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub lastupdated: Option<CsTime>,
    #[serde(default, rename = "nic", deserialize_with = "lenient::vec_or_empty")]
    pub nics: Vec<Nic>,
    /// Guest→host traffic as the hypervisor counts it (KiB).
    #[serde(
        default,
        deserialize_with = "lenient::u64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkkbswrite: Option<u64>,
    /// Host→guest traffic (KiB).
    #[serde(
        default,
        deserialize_with = "lenient::u64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkkbsread: Option<u64>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpuused: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub jobid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::i64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub jobstatus: Option<i64>,
    /// `KVM`, `VMware`, `XenServer`, …: how its traffic counters are sampled (cloudstack-api.md §3.1b).
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hypervisor: Option<String>,
    /// With `details` `tmpl` (UserVmJoinDaoImpl.newUserVmResponse sets the template fields
    /// for `all` or `tmpl`): what the scorecard groups boot times by.
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub templatename: Option<String>,
    /// With `details` `servoff` (same place, for `all` or `servoff`).
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub serviceofferingname: Option<String>,
}

/// One NIC of a VM (`nic[]` with `details=nics`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Nic {
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub id: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkname: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipaddress: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub ip6address: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool_or_false")]
    pub isdefault: bool,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub traffictype: Option<String>,
    /// `Isolated`, `Shared`, `L2`, … — L2 networks assign no address.
    #[serde(
        default,
        rename = "type",
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_type: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub macaddress: Option<String>,
}

impl Nic {
    /// Whether CloudStack assigns this NIC's address itself: Isolated and Shared networks,
    /// whose IPAM reserves it when the NIC is allocated, before the VM runs. L2 networks have
    /// no IPAM (the guest's address, if any, comes from outside), and a network type this
    /// version does not know is not judged either (docs/cloudstack-stats.md §6).
    pub fn expects_address(&self) -> bool {
        self.network_type.as_deref().is_some_and(|t| {
            ["Isolated", "Shared"]
                .iter()
                .any(|k| t.eq_ignore_ascii_case(k))
        })
    }

    pub fn has_address(&self) -> bool {
        self.ipaddress.is_some() || self.ip6address.is_some()
    }
}

/// One VM of a `listVirtualMachinesUsageHistory` page (CloudStack 4.17+).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct UsageHistoryVm {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, deserialize_with = "lenient::vec_or_empty")]
    pub stats: Vec<UsageSample>,
}

/// One stats sample of a VM, as collected every `vm.stats.interval`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct UsageSample {
    #[serde(
        default,
        deserialize_with = "lenient::time_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub timestamp: Option<CsTime>,
    #[serde(
        default,
        deserialize_with = "lenient::u64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkkbswrite: Option<u64>,
    #[serde(
        default,
        deserialize_with = "lenient::u64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkkbsread: Option<u64>,
}

/// The parts of `listCapabilities` the shim uses.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct Capabilities {
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub cloudstackversion: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::i64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub apilimitinterval: Option<i64>,
    #[serde(
        default,
        deserialize_with = "lenient::i64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub apilimitmax: Option<i64>,
    /// Minutes of VM stats retained for the usage-history API.
    #[serde(
        default,
        deserialize_with = "lenient::i64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub instancesstatsretentiontime: Option<i64>,
    #[serde(
        default,
        deserialize_with = "lenient::bool_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub allowuserviewdestroyedvm: Option<bool>,
}

/// A host as `listHosts` reports it (admin only; used for conformance and the simulator).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Host {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub state: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub resourcestate: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::time_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub created: Option<CsTime>,
}

/// One API of a `listApis` answer (API-discovery plugin), used as a permission self-test.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ApiInfo {
    pub name: String,
    #[serde(
        default,
        deserialize_with = "lenient::bool_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub isasync: Option<bool>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub since: Option<String>,
}

/// Items of list APIs that carry an identity, so pages can be de-duplicated (rows shift
/// between pages when VMs come and go).
pub trait ListItem {
    fn item_id(&self) -> Option<&str>;
}

impl ListItem for VirtualMachine {
    fn item_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl ListItem for UsageHistoryVm {
    fn item_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl ListItem for Host {
    fn item_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl ListItem for Nic {
    fn item_id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

impl ListItem for ApiInfo {
    fn item_id(&self) -> Option<&str> {
        Some(&self.name)
    }
}

impl ListItem for serde_json::Value {
    fn item_id(&self) -> Option<&str> {
        self.get("id").and_then(serde_json::Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_field_reads_arrays_one_object_null_and_nonsense() {
        #[derive(Debug, Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "lenient::vec_or_empty")]
            nic: Vec<Nic>,
        }
        let read = |v: serde_json::Value| serde_json::from_value::<Holder>(v).map(|h| h.nic);
        let ips = |nics: Vec<Nic>| -> Vec<Option<String>> {
            nics.into_iter().map(|n| n.ipaddress).collect()
        };
        let two = serde_json::json!({"nic": [{"id": "n1", "ipaddress": "10.0.0.1"}, {"id": "n2"}]});
        assert_eq!(
            ips(read(two).unwrap()),
            [Some("10.0.0.1".to_string()), None]
        );
        let one = serde_json::json!({"nic": {"id": "n1", "ipaddress": "10.0.0.2"}});
        assert_eq!(ips(read(one).unwrap()), [Some("10.0.0.2".to_string())]);
        for empty in [
            serde_json::json!({}),
            serde_json::json!({"nic": null}),
            serde_json::json!({"nic": []}),
            serde_json::json!({"nic": "none"}),
            serde_json::json!({"nic": 3}),
            serde_json::json!({"nic": true}),
        ] {
            assert!(read(empty.clone()).unwrap().is_empty(), "{empty}");
        }
        // The same from text (the listing's path), where null is a unit, not a Value.
        let from_text = |t: &str| serde_json::from_str::<Holder>(t).map(|h| h.nic.len());
        assert_eq!(from_text(r#"{"nic": null}"#).unwrap(), 0);
        assert_eq!(
            from_text(r#"{"nic": [{"id": "a"}, {"id": "b"}]}"#).unwrap(),
            2
        );
        assert_eq!(from_text(r#"{"nic": {"id": "a"}}"#).unwrap(), 1);
        // An unreadable item fails the list (and so the VM: the listing counts it unreadable).
        assert!(from_text(r#"{"nic": [{"id": "a"}, 7]}"#).is_err());
    }

    #[test]
    fn dates_with_offsets_parse_to_the_same_instant() {
        let a = CsTime::parse("2021-09-29T17:50:11+0530").unwrap();
        let b = CsTime::parse("2021-09-29T12:20:11+0000").unwrap();
        let c = CsTime::parse("2021-09-29T12:20:11Z").unwrap();
        assert_eq!(a, b);
        assert_eq!(b, c);
        assert_eq!(b.to_cloudstack_string(), "2021-09-29T12:20:11+0000");
        assert!(CsTime::parse("yesterday").is_err());
        // Far-future and pre-epoch dates are refused with a reason, never used.
        for far in [
            "9000-12-31T23:59:59+0000",
            "2200-01-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            let e = CsTime::parse(far).unwrap_err();
            assert!(e.contains("outside 1970..2200"), "{far}: {e}");
        }
        assert!(CsTime::parse("2199-12-31T23:59:59Z").is_ok());
    }

    #[test]
    fn unknown_states_are_kept_verbatim() {
        let s: VmState = serde_json::from_str("\"Hibernating\"").unwrap();
        assert_eq!(s, VmState::Other("Hibernating".into()));
        assert_eq!(s.to_string(), "Hibernating");
        let s: VmState = serde_json::from_str("\"Running\"").unwrap();
        assert_eq!(s, VmState::Running);
    }

    #[test]
    fn numbers_as_strings_and_missing_fields_are_tolerated() {
        let vm: VirtualMachine = serde_json::from_str(
            r#"{"id":"a","state":"Running","networkkbswrite":"42","nic":{"ipaddress":"10.0.0.5","isdefault":"true"},
                "lastupdated":"not a date","brandnewfield":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(vm.networkkbswrite, Some(42));
        assert_eq!(vm.nics.len(), 1);
        assert!(vm.nics[0].isdefault);
        assert_eq!(vm.lastupdated, None);
    }
}
