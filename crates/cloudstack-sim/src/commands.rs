//! The command table and the handlers of the supported API commands.
//!
//! To add a command, write a handler `fn(&mut Call) -> Result<Reply, ApiError>` and add a
//! [`CommandSpec`] to [`COMMANDS`]: name, response wrapper, item key, the account types its
//! `@APICommand(authorized=…)` annotation lists, whether page rules apply, and the
//! documented parameters (shown by `listApis`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::api::{access, Access, ApiError, Call, Reply};
use super::traffic;
use super::world::{
    format_time, is_canonical_uuid, AccountType, Ms, NetworkType, Sample, Vm, VmState, World,
};
use super::{directory, provisioning};

/// How a handler is called.
pub type Handler = fn(&mut Call<'_>) -> Result<Reply, ApiError>;

/// One documented parameter (for `listApis`).
#[derive(Debug)]
pub struct ParamDoc {
    pub name: &'static str,
    pub kind: &'static str,
    pub required: bool,
    pub description: &'static str,
}

/// One API command.
#[derive(Debug)]
pub struct CommandSpec {
    /// The API name, case-sensitive as on the wire (`listVirtualMachines`).
    pub name: &'static str,
    /// The response wrapper (`listvirtualmachinesresponse`).
    pub response: &'static str,
    /// The key list items go under (`virtualmachine`); unused for non-list commands.
    pub item_key: &'static str,
    /// Account types allowed by the command's annotation.
    pub authorized: &'static [AccountType],
    /// Whether `page`/`pagesize` rules apply (BaseListCmd).
    pub is_list: bool,
    pub is_async: bool,
    pub since: &'static str,
    pub description: &'static str,
    pub params: &'static [ParamDoc],
    pub handler: Handler,
}

impl CommandSpec {
    /// The name CloudStack uses in parameter errors: the wrapper without `response`.
    pub fn short_name(&self) -> &'static str {
        self.response
            .strip_suffix("response")
            .unwrap_or(self.response)
    }
}

const ALL_TYPES: &[AccountType] = &[
    AccountType::Admin,
    AccountType::ResourceAdmin,
    AccountType::DomainAdmin,
    AccountType::User,
];

macro_rules! p {
    ($name:literal, $kind:literal, $req:literal, $desc:literal) => {
        ParamDoc {
            name: $name,
            kind: $kind,
            required: $req,
            description: $desc,
        }
    };
}

const LIST_VM_PARAMS: &[ParamDoc] = &[
    p!("id", "uuid", false, "the ID of the virtual machine"),
    p!("ids", "list", false, "the IDs of the virtual machines, mutually exclusive with id"),
    p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller; if set to true - list resources that the caller is authorized to see. Default value is false"),
    p!("projectid", "uuid", false, "list objects by project; if projectid=-1 lists All VMs"),
    p!("account", "string", false, "list resources by account. Must be used with the domainId parameter."),
    p!("domainid", "uuid", false, "list only resources belonging to the domain specified"),
    p!("zoneid", "uuid", false, "the availability zone ID"),
    p!("state", "string", false, "state of the virtual machine. Possible values are: Running, Stopped, Present, Destroyed, Expunged. Present is used for the state equal not destroyed."),
    p!("keyword", "string", false, "List by keyword"),
    p!("name", "string", false, "name of the virtual machine (a substring match is not supported)"),
    p!("tags", "map", false, "List resources by tags (key/value pairs)"),
    p!("details", "list", false, "comma separated list of vm details requested, value can be a list of [all, group, nics, stats, secgrp, tmpl, servoff, diskoff, backoff, iso, volume, min, affgrp]. If no parameter is passed in, the details will be defaulted to all"),
    p!("haenable", "boolean", false, "list by the High Availability offering; true if filtering VMs with HA enabled; false for VMs with HA disabled"),
    p!("hostid", "uuid", false, "the host ID"),
    p!("templateid", "uuid", false, "list vms by template"),
    p!("networkid", "uuid", false, "list by network id"),
    p!("page", "integer", false, ""),
    p!("pagesize", "integer", false, ""),
];

/// Every command the simulator answers.
pub static COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "listVirtualMachines",
        response: "listvirtualmachinesresponse",
        item_key: "virtualmachine",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "List the virtual machines owned by the account.",
        params: LIST_VM_PARAMS,
        handler: list_virtual_machines,
    },
    CommandSpec {
        name: "listVirtualMachinesMetrics",
        response: "listvirtualmachinesmetricsresponse",
        item_key: "virtualmachine",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "4.9.3",
        description: "Lists VM metrics",
        params: LIST_VM_PARAMS,
        handler: list_virtual_machines_metrics,
    },
    CommandSpec {
        name: "listVirtualMachinesUsageHistory",
        response: "listvirtualmachinesusagehistoryresponse",
        item_key: "virtualmachine",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "4.17",
        description: "Lists VM stats",
        params: &[
            p!("id", "uuid", false, "the ID of the virtual machine."),
            p!("ids", "list", false, "the IDs of the virtual machines, mutually exclusive with id."),
            p!("name", "string", false, "name of the virtual machine (a substring match is made against the parameter value returning the data for all matching VMs)."),
            p!("keyword", "string", false, "List by keyword"),
            p!("startdate", "date", false, "start date to filter VM stats."),
            p!("enddate", "date", false, "end date to filter VM stats."),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: list_usage_history,
    },
    CommandSpec {
        name: "listNics",
        response: "listnicsresponse",
        item_key: "nic",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "list the vm nics  IP to NIC",
        params: &[
            p!("virtualmachineid", "uuid", true, "the ID of the vm"),
            p!("nicid", "uuid", false, "the ID of the nic to to list IPs"),
            p!("networkid", "uuid", false, "list nic of the specific vm's network"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: list_nics,
    },
    CommandSpec {
        name: "listCapabilities",
        response: "listcapabilitiesresponse",
        item_key: "capability",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: false,
        since: "",
        description: "Lists capabilities",
        params: &[],
        handler: list_capabilities,
    },
    CommandSpec {
        name: "listApis",
        response: "listapisresponse",
        item_key: "api",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: false,
        since: "4.1.0",
        description: "lists all available apis on the server, provided by the Api Discovery plugin",
        params: &[p!("name", "string", false, "API name")],
        handler: list_apis,
    },
    CommandSpec {
        name: "listUsers",
        response: "listusersresponse",
        item_key: "user",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists user accounts",
        params: &[
            p!("id", "uuid", false, "List user by ID."),
            p!("account", "string", false, "list resources by account. Must be used with the domainId parameter."),
            p!("domainid", "uuid", false, "list only resources belonging to the domain specified"),
            p!("username", "string", false, "List user by the username"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_users,
    },
    CommandSpec {
        name: "getUserKeys",
        response: "getuserkeysresponse",
        item_key: "userkeys",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: false,
        since: "4.10.0",
        description: "This command allows the user to query the seceret and API keys for the account",
        params: &[p!("id", "uuid", true, "ID of the user whose keys are required")],
        handler: directory::get_user_keys,
    },
    CommandSpec {
        name: "listDomains",
        response: "listdomainsresponse",
        item_key: "domain",
        authorized: &[AccountType::Admin, AccountType::DomainAdmin],
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists domains and provides detailed information for listed domains",
        params: &[
            p!("id", "uuid", false, "List domain by domain ID."),
            p!("name", "string", false, "List domain by domain name."),
            p!("level", "integer", false, "List domains by domain level."),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_domains,
    },
    CommandSpec {
        name: "listAccounts",
        response: "listaccountsresponse",
        item_key: "account",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists accounts and provides detailed account information for listed accounts",
        params: &[
            p!("id", "uuid", false, "list account by account ID"),
            p!("name", "string", false, "list account by account name"),
            p!("domainid", "uuid", false, "list only resources belonging to the domain specified"),
            p!("accounttype", "integer", false, "list accounts by account type"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_accounts,
    },
    CommandSpec {
        name: "listProjects",
        response: "listprojectsresponse",
        item_key: "project",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "3.0.0",
        description: "Lists projects and provides detailed information for listed projects",
        params: &[
            p!("id", "uuid", false, "list projects by project ID"),
            p!("name", "string", false, "list projects by name"),
            p!("account", "string", false, "list projects this account is a member of"),
            p!("domainid", "uuid", false, "list only resources belonging to the domain specified"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_projects,
    },
    CommandSpec {
        name: "listZones",
        response: "listzonesresponse",
        item_key: "zone",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists zones",
        params: &[
            p!("id", "uuid", false, "the ID of the zone"),
            p!("name", "string", false, "the name of the zone"),
            p!("available", "boolean", false, "true if you want to retrieve all available Zones. False if you only want to return the Zones from which you have at least one VM. Default is false."),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_zones,
    },
    CommandSpec {
        name: "listNetworks",
        response: "listnetworksresponse",
        item_key: "network",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all available networks.",
        params: &[
            p!("id", "uuid", false, "list networks by ID"),
            p!("zoneid", "uuid", false, "the zone ID of the network"),
            p!("projectid", "uuid", false, "list objects by project"),
            p!("name", "string", false, "list networks by name"),
            p!("type", "string", false, "the type of the network. Supported values are: isolated, l2, shared and all"),
            p!("issystem", "boolean", false, "true if network is system, false otherwise"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_networks,
    },
    CommandSpec {
        name: "listAffinityGroups",
        response: "listaffinitygroupsresponse",
        item_key: "affinitygroup",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists affinity groups",
        params: &[
            p!("id", "uuid", false, "list the affinity group by the ID provided"),
            p!("name", "string", false, "lists affinity groups by name"),
            p!("type", "string", false, "lists affinity groups by type"),
            p!("virtualmachineid", "uuid", false, "lists affinity groups by virtual machine ID"),
            p!("projectid", "uuid", false, "list objects by project"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_affinity_groups,
    },
    CommandSpec {
        name: "createAffinityGroup",
        response: "createaffinitygroupresponse",
        item_key: "affinitygroup",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: true,
        since: "",
        description: "Creates an affinity/anti-affinity group",
        params: &[
            p!("name", "string", true, "name of the affinity group"),
            p!("type", "string", true, "Type of the affinity group from the available affinity/anti-affinity group types"),
            p!("description", "string", false, "optional description of the affinity group"),
            p!("projectid", "uuid", false, "create affinity group for project"),
            p!("account", "string", false, "an account for the affinity group. Must be used with domainId."),
            p!("domainid", "uuid", false, "domainId of the account owning the affinity group"),
        ],
        handler: provisioning::create_affinity_group,
    },
    CommandSpec {
        name: "deleteAffinityGroup",
        response: "deleteaffinitygroupresponse",
        item_key: "affinitygroup",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: true,
        since: "",
        description: "Deletes affinity group",
        params: &[
            p!("id", "uuid", false, "The ID of the affinity group. Mutually exclusive with name parameter"),
            p!("name", "string", false, "The name of the affinity group. Mutually exclusive with ID parameter"),
            p!("projectid", "uuid", false, "the ID of the project of the affinity group"),
        ],
        handler: provisioning::delete_affinity_group,
    },
    CommandSpec {
        name: "listServiceOfferings",
        response: "listserviceofferingsresponse",
        item_key: "serviceoffering",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all available service offerings.",
        params: &[
            p!("id", "uuid", false, "ID of the service offering"),
            p!("name", "string", false, "name of the service offering"),
            p!("zoneid", "uuid", false, "id of zone disk offering is associated with"),
            p!("issystem", "boolean", false, "is this a system vm offering"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_service_offerings,
    },
    CommandSpec {
        name: "listTemplates",
        response: "listtemplatesresponse",
        item_key: "template",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "List all public, private, and privileged templates.",
        params: &[
            p!("templatefilter", "string", true, "possible values are \"featured\", \"self\", \"selfexecutable\",\"sharedexecutable\",\"executable\", and \"community\"."),
            p!("id", "uuid", false, "the template ID"),
            p!("name", "string", false, "the template name"),
            p!("zoneid", "uuid", false, "list templates by zoneId"),
            p!("projectid", "uuid", false, "list objects by project"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_templates,
    },
    CommandSpec {
        name: "listDiskOfferings",
        response: "listdiskofferingsresponse",
        item_key: "diskoffering",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all available disk offerings.",
        params: &[
            p!("id", "uuid", false, "ID of the disk offering"),
            p!("name", "string", false, "name of the disk offering"),
            p!("zoneid", "uuid", false, "id of zone disk offering is associated with"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_disk_offerings,
    },
    CommandSpec {
        name: "listPublicIpAddresses",
        response: "listpublicipaddressesresponse",
        item_key: "publicipaddress",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all public IP addresses",
        params: &[
            p!("networkid", "uuid", false, "lists all public IP addresses by source network ID"),
            p!("associatednetworkid", "uuid", false, "lists all public IP addresses associated to the network specified"),
            p!("allocatedonly", "boolean", false, "limits search results to allocated public IP addresses"),
            p!("forvirtualnetwork", "boolean", false, "the virtual network for the IP address"),
            p!("ipaddress", "string", false, "lists the specified IP address"),
            p!("id", "uuid", false, "lists IP address by ID"),
            p!("state", "string", false, "lists all public IP addresses by state"),
            p!("zoneid", "uuid", false, "lists all public IP addresses by zone ID"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_public_ip_addresses,
    },
    CommandSpec {
        name: "deployVirtualMachine",
        response: "deployvirtualmachineresponse",
        item_key: "virtualmachine",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: true,
        since: "",
        description: "Creates and automatically starts a virtual machine based on a service offering, disk offering, and template.",
        params: &[
            p!("serviceofferingid", "uuid", true, "the ID of the service offering for the virtual machine"),
            p!("templateid", "uuid", true, "the ID of the template for the virtual machine"),
            p!("zoneid", "uuid", true, "availability zone for the virtual machine"),
            p!("networkids", "list", false, "list of network ids used by virtual machine. Can't be specified with ipToNetworkList parameter"),
            p!("iptonetworklist", "map", false, "ip to network mapping. Can't be specified with networkIds parameter. Example: iptonetworklist[0].ip=10.10.10.11&iptonetworklist[0].networkid=uuid"),
            p!("name", "string", false, "host name for the virtual machine"),
            p!("displayname", "string", false, "an optional user generated name for the virtual machine"),
            p!("userdata", "string", false, "an optional binary data that can be sent to the virtual machine upon a successful deployment. This binary data must be base64 encoded before adding it to the request."),
            p!("keypair", "string", false, "name of the ssh key pair used to login to the virtual machine"),
            p!("affinitygroupids", "list", false, "comma separated list of affinity groups id that are going to be applied to the virtual machine."),
            p!("details", "map", false, "used to specify the custom parameters."),
            p!("projectid", "uuid", false, "Deploy vm for the project"),
            p!("diskofferingid", "uuid", false, "the ID of the disk offering for the virtual machine."),
            p!("size", "long", false, "the arbitrary size for the DATADISK volume. Mutually exclusive with diskOfferingId"),
            p!("startvm", "boolean", false, "true if start vm after creating; defaulted to true if not specified"),
            p!("account", "string", false, "an optional account for the virtual machine. Must be used with domainId."),
            p!("domainid", "uuid", false, "an optional domainId for the virtual machine."),
        ],
        handler: provisioning::deploy_virtual_machine,
    },
    CommandSpec {
        name: "destroyVirtualMachine",
        response: "destroyvirtualmachineresponse",
        item_key: "virtualmachine",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: true,
        since: "",
        description: "Destroys a virtual machine.",
        params: &[
            p!("id", "uuid", true, "The ID of the virtual machine"),
            p!("expunge", "boolean", false, "If true is passed, the vm is expunged immediately. False by default."),
            p!("volumeids", "list", false, "Comma separated list of UUIDs for volumes that will be deleted"),
        ],
        handler: provisioning::destroy_virtual_machine,
    },
    CommandSpec {
        name: "listVolumes",
        response: "listvolumesresponse",
        item_key: "volume",
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all volumes.",
        params: &[
            p!("virtualmachineid", "uuid", false, "the ID of the virtual machine"),
            p!("id", "uuid", false, "the ID of the disk volume"),
            p!("type", "string", false, "the type of disk volume"),
            p!("zoneid", "uuid", false, "the ID of the availability zone"),
            p!("projectid", "uuid", false, "list objects by project"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: directory::list_volumes,
    },
    CommandSpec {
        name: "queryAsyncJobResult",
        response: "queryasyncjobresultresponse",
        item_key: "asyncjobs",
        authorized: ALL_TYPES,
        is_list: false,
        is_async: false,
        since: "",
        description: "Retrieves the current status of asynchronous job.",
        params: &[p!("jobid", "uuid", true, "the ID of the asynchronous job")],
        handler: provisioning::query_async_job_result,
    },
];

/// Looks a command up by its exact (case-sensitive) name.
pub fn find(name: &str) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|c| c.name == name)
}

// ---- listVirtualMachines ---------------------------------------------------------------

const DETAIL_VALUES: &[&str] = &[
    "all", "group", "nics", "stats", "secgrp", "tmpl", "servoff", "diskoff", "backoff", "iso",
    "volume", "min", "affgrp",
];

/// Which optional parts of a VM response were requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Details {
    pub nics: bool,
    pub stats: bool,
    pub servoff: bool,
    pub tmpl: bool,
    pub secgrp: bool,
    pub affgrp: bool,
    pub group: bool,
}

impl Details {
    const ALL: Details = Details {
        nics: true,
        stats: true,
        servoff: true,
        tmpl: true,
        secgrp: true,
        affgrp: true,
        group: true,
    };

    fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        let Some(v) = v.filter(|v| !v.is_empty()) else {
            return Ok(Self::ALL);
        };
        let mut d = Details {
            nics: false,
            stats: false,
            servoff: false,
            tmpl: false,
            secgrp: false,
            affgrp: false,
            group: false,
        };
        for tok in v.split(',').filter(|t| !t.is_empty()) {
            match tok {
                "all" => return Ok(Self::ALL),
                "nics" => d.nics = true,
                "stats" => d.stats = true,
                "servoff" => d.servoff = true,
                "tmpl" => d.tmpl = true,
                "secgrp" => d.secgrp = true,
                "affgrp" => d.affgrp = true,
                "group" => d.group = true,
                t if DETAIL_VALUES.contains(&t) => {}
                _ => {
                    return Err(ApiError::invalid_value(format!(
                        "The details parameter contains a non permitted value. The allowed values are [{}]",
                        DETAIL_VALUES.join(", ")
                    )))
                }
            }
        }
        Ok(d)
    }
}

/// Parses `tags[i].key` / `tags[i].value` map parameters.
fn tag_filters(call: &Call<'_>) -> Vec<(String, Option<String>)> {
    let mut by_index: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    for (k, v) in call.params {
        let Some(rest) = k.strip_prefix("tags[") else {
            continue;
        };
        let Some((idx, field)) = rest.split_once("].") else {
            continue;
        };
        let e = by_index.entry(idx.to_string()).or_default();
        match field {
            "key" => e.0 = Some(v.clone()),
            "value" => e.1 = Some(v.clone()),
            _ => {}
        }
    }
    by_index
        .into_values()
        .filter_map(|(k, v)| k.map(|k| (k, v)))
        .collect()
}

/// Applies id/ids, visibility and the filters of `listVirtualMachines`; returns matching
/// VM indices in internal-id order.
fn select_vms(call: &Call<'_>, usage_history: bool) -> Result<Vec<usize>, ApiError> {
    let w: &World = call.world;
    let caller = &w.accounts[call.caller];
    let root = caller.is_root_admin();
    let admin_like = caller.kind != AccountType::User;

    let id = call.get_nonempty("id");
    let ids = call.get_nonempty("ids");
    if id.is_some() && ids.is_some() {
        return Err(ApiError::invalid_value(
            "Specify either id or ids but not both parameters",
        ));
    }
    let mut id_set: Option<Vec<usize>> = None;
    if let Some(id) = id {
        let i = w.vm_index_by_id(id).ok_or_else(|| call.bad("id", id))?;
        id_set = Some(vec![i]);
    }
    if let Some(ids) = ids {
        let mut v = Vec::new();
        for tok in ids.split(',') {
            // Tokens that are not lowercase canonical UUIDs are silently dropped, as for
            // every parameter with a `since` annotation.
            if !is_canonical_uuid(tok) {
                continue;
            }
            v.push(w.vm_index_by_id(tok).ok_or_else(|| call.bad("ids", tok))?);
        }
        if !v.is_empty() {
            v.sort_unstable();
            v.dedup();
            id_set = Some(v);
        }
    }

    let listall = if usage_history {
        false
    } else {
        call.bool_param("listall")?.unwrap_or(false)
    };
    let haenable = if usage_history {
        None
    } else {
        call.bool_param("haenable")?
    };
    let zone = match call.get_nonempty("zoneid").filter(|_| !usage_history) {
        Some(z) => Some(
            w.zones
                .iter()
                .position(|x| x.id == z)
                .ok_or_else(|| call.bad("zoneid", z))?,
        ),
        None => None,
    };
    let host = match call
        .get_nonempty("hostid")
        .filter(|_| root && !usage_history)
    {
        Some(h) => Some(
            w.hosts
                .iter()
                .position(|x| x.id == h)
                .ok_or_else(|| call.bad("hostid", h))?,
        ),
        None => None,
    };
    // projectid: none = non-project VMs; -1 = all visible projects; uuid = that project.
    enum Proj {
        None,
        All,
        One(usize),
    }
    let project = match call.get_nonempty("projectid").filter(|_| !usage_history) {
        None => Proj::None,
        Some("-1") => Proj::All,
        Some(p) => Proj::One(
            w.projects
                .iter()
                .position(|x| x.id == p)
                .ok_or_else(|| call.bad("projectid", p))?,
        ),
    };
    let domainid = call.get_nonempty("domainid").filter(|_| !usage_history);
    if let Some(d) = domainid {
        if d != w.domain_id {
            return Err(call.bad("domainid", d));
        }
    }
    let account_filter = match call.get_nonempty("account").filter(|_| !usage_history) {
        Some(a) => match w.account_index(a) {
            Some(i) => Some(i),
            None => {
                return Err(ApiError::invalid_value(format!(
                    "Unable to find account {a} in domain {}",
                    domainid.unwrap_or(&w.domain_id)
                )))
            }
        },
        None => None,
    };
    let template = match call.get_nonempty("templateid").filter(|_| !usage_history) {
        Some(t) => Some(
            w.template_index(t)
                .filter(|i| w.templates[*i].id == t)
                .ok_or_else(|| call.bad("templateid", t))?,
        ),
        None => None,
    };
    let network = match call.get_nonempty("networkid").filter(|_| !usage_history) {
        Some(n) => Some(
            w.networks
                .iter()
                .position(|x| x.id == n)
                .ok_or_else(|| call.bad("networkid", n))?,
        ),
        None => None,
    };
    let state = call.get_nonempty("state").filter(|_| !usage_history);
    let keyword = call.get_nonempty("keyword").map(str::to_lowercase);
    let name = call.get_nonempty("name");
    let tags = if usage_history {
        Vec::new()
    } else {
        tag_filters(call)
    };
    let hide_destroyed =
        caller.kind == AccountType::User && !w.settings.allow_user_view_destroyed_vm;
    let wide = admin_like && (listall || id_set.is_some() || account_filter.is_some());

    let visible = |vm: &Vm| -> bool {
        if vm.removed {
            return false;
        }
        match (&project, vm.project) {
            (Proj::None, Some(_)) => return false,
            (Proj::None, None) => {
                if !wide && vm.account != call.caller {
                    return false;
                }
                if let Some(a) = account_filter {
                    if vm.account != a || (!admin_like && a != call.caller) {
                        return false;
                    }
                }
            }
            (Proj::All, None) => return false,
            (Proj::One(p), Some(q)) if *p != q => return false,
            (Proj::One(_), None) => return false,
            (Proj::All | Proj::One(_), Some(q)) => {
                if !admin_like && !w.projects[q].members.contains(&call.caller) {
                    return false;
                }
            }
        }
        if hide_destroyed && matches!(vm.state, VmState::Destroyed | VmState::Expunging) {
            return false;
        }
        true
    };
    let matches = |vm: &Vm| -> bool {
        if let Some(z) = zone {
            if vm.zone != z {
                return false;
            }
        }
        if let Some(h) = host {
            if vm.host != h || !on_host(vm) {
                return false;
            }
        }
        if let Some(t) = template {
            if vm.template != t {
                return false;
            }
        }
        if let Some(n) = network {
            if vm.visible_nic().is_none_or(|nic| nic.network != n) {
                return false;
            }
        }
        if let Some(ha) = haenable {
            if vm.haenable != ha {
                return false;
            }
        }
        if let Some(s) = state {
            let destroyedish = matches!(vm.state, VmState::Destroyed | VmState::Expunging);
            if s.eq_ignore_ascii_case("Present") {
                if destroyedish {
                    return false;
                }
            } else if !vm.state.as_str().eq_ignore_ascii_case(s) {
                return false;
            }
        }
        if let Some(n) = name {
            let ok = if usage_history {
                vm.display_name.to_lowercase().contains(&n.to_lowercase())
            } else {
                vm.name.eq_ignore_ascii_case(n)
            };
            if !ok {
                return false;
            }
        }
        if let Some(k) = &keyword {
            let ip = vm.visible_ip().map(|i| i.to_string()).unwrap_or_default();
            let hit = vm.display_name.to_lowercase().contains(k.as_str())
                || vm.name.to_lowercase().contains(k.as_str())
                || (!ip.is_empty() && ip.contains(k.as_str()))
                || vm.state.as_str().eq_ignore_ascii_case(k)
                || (root && instance_name(vm).to_lowercase().contains(k.as_str()));
            if !hit {
                return false;
            }
        }
        if !tags.is_empty() {
            let any = tags.iter().any(|(tk, tv)| {
                vm.tags
                    .iter()
                    .any(|(k, v)| k == tk && tv.as_ref().is_none_or(|tv| tv == v))
            });
            if !any {
                return false;
            }
        }
        true
    };

    let vms = w.vms();
    let out = match id_set {
        Some(ids) => ids
            .into_iter()
            .filter(|i| visible(&vms[*i]) && matches(&vms[*i]))
            .collect(),
        None => (0..vms.len())
            .filter(|i| visible(&vms[*i]) && matches(&vms[*i]))
            .collect(),
    };
    Ok(out)
}

fn on_host(vm: &Vm) -> bool {
    matches!(vm.state, VmState::Running | VmState::Starting)
}

fn instance_name(vm: &Vm) -> String {
    format!("i-2-{}-VM", vm.seq)
}

/// Who is looking and what they asked for.
#[derive(Debug, Clone, Copy)]
struct View {
    root: bool,
    details: Details,
    metrics: bool,
    stats_enabled: bool,
}

fn nic_json(w: &World, vm: &Vm, with_vm_id: bool) -> Option<Value> {
    let nic = vm.visible_nic()?;
    let net = w.networks.get(nic.network)?;
    let mut m = Map::new();
    m.insert("id".into(), json!(nic.id));
    m.insert("networkid".into(), json!(net.id));
    m.insert("networkname".into(), json!(net.name));
    if net.kind != NetworkType::L2 {
        m.insert("netmask".into(), json!(net.netmask().to_string()));
        m.insert("gateway".into(), json!(net.gateway.to_string()));
    }
    if let Some(ip) = vm.visible_ip() {
        m.insert("ipaddress".into(), json!(ip.to_string()));
    }
    m.insert("isolationuri".into(), json!(format!("vlan://{}", net.vlan)));
    m.insert("broadcasturi".into(), json!(format!("vlan://{}", net.vlan)));
    m.insert("traffictype".into(), json!("Guest"));
    m.insert("type".into(), json!(net.kind.as_str()));
    m.insert("isdefault".into(), json!(true));
    m.insert("macaddress".into(), json!(nic.mac));
    m.insert("deviceid".into(), json!("0"));
    m.insert("secondaryip".into(), json!([]));
    m.insert("extradhcpoption".into(), json!([]));
    if with_vm_id {
        m.insert("virtualmachineid".into(), json!(vm.id));
    }
    Some(Value::Object(m))
}

fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

fn stats_fields(m: &mut Map<String, Value>, vm: &Vm, s: &Sample) {
    let memkbs = u64::from(vm.memory_mb) * 1024;
    m.insert("cpuused".into(), json!(traffic::format_cpu(s.cpu_centi)));
    m.insert("networkkbsread".into(), json!(s.rx_kib));
    m.insert("networkkbswrite".into(), json!(s.tx_kib));
    m.insert("diskkbsread".into(), json!(s.disk_read_kib));
    m.insert("diskkbswrite".into(), json!(s.disk_write_kib));
    m.insert("diskioread".into(), json!(s.disk_read_kib / 8));
    m.insert("diskiowrite".into(), json!(s.disk_write_kib / 8));
    m.insert("memorykbs".into(), json!(memkbs));
    m.insert(
        "memoryintfreekbs".into(),
        json!(memkbs * (30 + traffic::mix(vm.seq, s.n) % 20) / 100),
    );
    m.insert("memorytargetkbs".into(), json!(memkbs));
}

fn vm_json(w: &World, vm: &Vm, v: View) -> Value {
    let acc = &w.accounts[vm.account];
    let zone = &w.zones[vm.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(vm.id));
    m.insert("name".into(), json!(vm.name));
    m.insert("displayname".into(), json!(vm.display_name));
    if v.root {
        m.insert("instancename".into(), json!(instance_name(vm)));
    }
    match vm.project.and_then(|p| w.projects.get(p)) {
        Some(p) => {
            m.insert("account".into(), json!(p.account_name));
            m.insert("projectid".into(), json!(p.id));
            m.insert("project".into(), json!(p.name));
        }
        None => {
            m.insert("account".into(), json!(acc.name));
        }
    }
    m.insert("userid".into(), json!(acc.user_id));
    m.insert("username".into(), json!(acc.username));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!("ROOT"));
    m.insert("created".into(), json!(format_time(vm.created_ms)));
    m.insert("lastupdated".into(), json!(format_time(vm.last_updated_ms)));
    m.insert("state".into(), json!(vm.state.as_str()));
    m.insert("haenable".into(), json!(vm.haenable));
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    if on_host(vm) {
        if let Some(h) = w.hosts.get(vm.host) {
            if v.root {
                m.insert("hostid".into(), json!(h.id));
                m.insert("hostname".into(), json!(h.name));
            }
            m.insert("hostcontrolstate".into(), json!(h.control.as_str()));
        }
    }
    m.insert("hypervisor".into(), json!("Simulator"));
    m.insert("displayvm".into(), json!(true));
    m.insert("isdynamicallyscalable".into(), json!(false));
    m.insert("passwordenabled".into(), json!(false));
    m.insert("rootdeviceid".into(), json!(0));
    m.insert("rootdevicetype".into(), json!("ROOT"));
    m.insert("guestosid".into(), json!(SIM_OS_ID));
    m.insert("ostypeid".into(), json!(SIM_OS_ID));
    m.insert("osdisplayname".into(), json!("Ubuntu 22.04 LTS"));
    if v.details.tmpl {
        if let Some(t) = w.templates.get(vm.template) {
            m.insert("templateid".into(), json!(t.id));
            m.insert("templatename".into(), json!(t.name));
            m.insert("templatedisplaytext".into(), json!(t.display_text));
        }
    }
    if v.details.servoff {
        if let Some(o) = w.service_offerings.get(vm.offering) {
            m.insert("serviceofferingid".into(), json!(o.id));
            m.insert("serviceofferingname".into(), json!(o.name));
        }
        m.insert("cpunumber".into(), json!(vm.cpu_number));
        m.insert("cpuspeed".into(), json!(vm.cpu_speed));
        m.insert("memory".into(), json!(vm.memory_mb));
    }
    if let Some(d) = vm
        .data_disk
        .as_ref()
        .and_then(|d| w.disk_offerings.get(d.offering))
    {
        m.insert("diskofferingid".into(), json!(d.id));
        m.insert("diskofferingname".into(), json!(d.name));
    }
    if let Some(k) = &vm.keypair {
        m.insert("keypairs".into(), json!(k));
    }
    if !vm.details.is_empty() {
        let details: Map<String, Value> = vm
            .details
            .iter()
            .map(|(k, val)| (k.clone(), json!(val)))
            .collect();
        m.insert("details".into(), Value::Object(details));
    }
    if v.details.secgrp {
        m.insert("securitygroup".into(), json!([]));
    }
    if v.details.affgrp {
        let groups: Vec<Value> = vm
            .affinity_groups
            .iter()
            .filter_map(|g| w.affinity_groups.get(*g))
            .map(|g| json!({"id": g.id, "name": g.name, "type": g.kind.as_str(), "description": g.description}))
            .collect();
        m.insert("affinitygroup".into(), Value::Array(groups));
    }
    let tags: Vec<Value> = vm
        .tags
        .iter()
        .map(|(k, val)| {
            json!({"key": k, "value": val, "resourcetype": "UserVm", "resourceid": vm.id,
                   "account": acc.name, "domainid": w.domain_id, "domain": "ROOT"})
        })
        .collect();
    m.insert("tags".into(), Value::Array(tags));
    if v.details.nics {
        let nics: Vec<Value> = nic_json(w, vm, false).into_iter().collect();
        m.insert("nic".into(), Value::Array(nics));
    }
    let sample = vm.last_sample.filter(|_| v.stats_enabled);
    if v.details.stats {
        if let Some(s) = &sample {
            stats_fields(&mut m, vm, s);
        }
    }
    if v.metrics {
        m.insert(
            "cputotal".into(),
            json!(format!(
                "{:.2} Ghz",
                f64::from(vm.cpu_number * vm.cpu_speed) / 1000.0
            )),
        );
        m.insert(
            "memorytotal".into(),
            json!(format!("{:.2} GiB", f64::from(vm.memory_mb) / 1024.0)),
        );
        if let Some(ip) = vm.visible_ip() {
            m.insert("ipaddress".into(), json!(ip.to_string()));
        }
        if let Some(s) = &sample {
            m.insert("networkread".into(), json!(mib(s.rx_kib)));
            m.insert("networkwrite".into(), json!(mib(s.tx_kib)));
            m.insert("diskread".into(), json!(mib(s.disk_read_kib)));
            m.insert("diskwrite".into(), json!(mib(s.disk_write_kib)));
            m.insert(
                "diskiopstotal".into(),
                json!(s.disk_read_kib / 8 + s.disk_write_kib / 8),
            );
        }
    }
    Value::Object(m)
}

pub(crate) const SIM_OS_ID: &str = "5a0d7e3e-8b8c-4d0e-9a57-2f6a1c3b9e01";

/// A VM as `listVirtualMachines` shows it with every detail (job results, deploy answers).
pub(crate) fn vm_response(w: &World, vm: &Vm, root: bool) -> Value {
    let view = View {
        root,
        details: Details::ALL,
        metrics: false,
        stats_enabled: w.settings.stats_interval_seconds > 0,
    };
    vm_json(w, vm, view)
}

fn list_vms_common(call: &mut Call<'_>, metrics: bool) -> Result<Reply, ApiError> {
    let details = Details::parse(call.get("details"))?;
    let all = select_vms(call, false)?;
    let w: &World = call.world;
    let view = View {
        root: w.accounts[call.caller].is_root_admin(),
        details,
        metrics,
        stats_enabled: w.settings.stats_interval_seconds > 0,
    };
    let range = call.paging.slice(&all);
    let items = all[range]
        .iter()
        .map(|i| vm_json(w, &w.vms()[*i], view))
        .collect();
    Ok(Reply::List {
        items,
        count: all.len(),
    })
}

fn list_virtual_machines(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    list_vms_common(call, false)
}

fn list_virtual_machines_metrics(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    list_vms_common(call, true)
}

// ---- usage history ---------------------------------------------------------------------

fn parse_date(call: &Call<'_>, name: &str) -> Result<Option<Ms>, ApiError> {
    let Some(v) = call.get_nonempty(name) else {
        return Ok(None);
    };
    let t = v.trim();
    if let Ok(dt) = jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S", t) {
        if let Ok(z) = dt.to_zoned(jiff::tz::TimeZone::UTC) {
            return Ok(Some(z.timestamp().as_millisecond()));
        }
    }
    if let Ok(d) = jiff::civil::Date::strptime("%Y-%m-%d", t) {
        if let Ok(z) = d.to_zoned(jiff::tz::TimeZone::UTC) {
            return Ok(Some(z.timestamp().as_millisecond()));
        }
    }
    if let Some(ms) = super::api::parse_expires(t) {
        return Ok(Some(ms));
    }
    Err(call.bad(name, v))
}

fn sample_json(vm: &Vm, s: &Sample) -> Value {
    let mut m = Map::new();
    m.insert("timestamp".into(), json!(format_time(s.at_ms)));
    stats_fields(&mut m, vm, s);
    m.insert(
        "diskiopstotal".into(),
        json!(s.disk_read_kib / 8 + s.disk_write_kib / 8),
    );
    m.insert("networkread".into(), json!(mib(s.rx_kib)));
    m.insert("networkwrite".into(), json!(mib(s.tx_kib)));
    Value::Object(m)
}

fn list_usage_history(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let start = parse_date(call, "startdate")?;
    let end = parse_date(call, "enddate")?;
    let all = select_vms(call, true)?;
    let w: &World = call.world;
    let retention_from =
        w.now_ms() - (w.settings.stats_retention_seconds as Ms).saturating_mul(1000);
    let range = call.paging.slice(&all);
    let items: Vec<Value> = all[range]
        .iter()
        .map(|i| {
            let vm = &w.vms()[*i];
            let stats: Vec<Value> = if w.settings.stats_interval_seconds == 0 {
                Vec::new()
            } else {
                vm.history
                    .iter()
                    .filter(|s| s.at_ms >= retention_from)
                    .filter(|s| start.is_none_or(|t| s.at_ms >= t))
                    .filter(|s| end.is_none_or(|t| s.at_ms <= t))
                    .map(|s| sample_json(vm, s))
                    .collect()
            };
            json!({"id": vm.id, "name": vm.name, "displayname": vm.display_name, "stats": stats})
        })
        .collect();
    let count = items.len();
    Ok(Reply::List { items, count })
}

// ---- listNics --------------------------------------------------------------------------

/// Whether an account may see and act on a VM: admins any VM, users their own and their
/// projects' VMs.
pub(crate) fn vm_visible_to(w: &World, caller: usize, vm: &Vm) -> bool {
    w.accounts[caller].kind != AccountType::User
        || match vm.project {
            Some(p) => w.projects[p].members.contains(&caller),
            None => vm.account == caller,
        }
}

fn list_nics(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let vmid = call.require("virtualmachineid")?;
    let w: &World = call.world;
    let idx = w
        .vm_index_by_id(vmid)
        .ok_or_else(|| call.bad("virtualmachineid", vmid))?;
    let vm = &w.vms()[idx];
    let caller = &w.accounts[call.caller];
    if vm.removed || !vm_visible_to(w, call.caller, vm) {
        return Err(ApiError {
            code: 531,
            cs: Some(4365),
            text: format!(
                "Account {} does not have permission to access the virtual machine",
                caller.name
            ),
            error_wrapper: false,
        });
    }
    let mut items: Vec<Value> = nic_json(w, vm, true).into_iter().collect();
    if let Some(nicid) = call.get_nonempty("nicid") {
        items.retain(|n| n["id"] == nicid);
    }
    if let Some(net) = call.get_nonempty("networkid") {
        items.retain(|n| n["networkid"] == net);
    }
    if let Some(k) = call.get_nonempty("keyword") {
        items.retain(|n| n["ipaddress"].as_str().is_some_and(|ip| ip.contains(k)));
    }
    let count = items.len();
    let range = call.paging.slice(&items);
    Ok(Reply::List {
        items: items[range].to_vec(),
        count,
    })
}

// ---- listCapabilities / listApis -------------------------------------------------------

fn list_capabilities(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let s = &call.world.settings;
    let mut m = Map::new();
    m.insert("securitygroupsenabled".into(), json!(false));
    m.insert("dynamicrolesenabled".into(), json!(true));
    m.insert("cloudstackversion".into(), json!(s.cloudstack_version));
    m.insert("userpublictemplateenabled".into(), json!(false));
    m.insert("supportELB".into(), json!("false"));
    m.insert("projectinviterequired".into(), json!(false));
    m.insert("allowusercreateprojects".into(), json!(true));
    m.insert("customdiskofferingminsize".into(), json!(1));
    m.insert("customdiskofferingmaxsize".into(), json!(1024));
    m.insert("regionsecondaryenabled".into(), json!(false));
    m.insert("kvmsnapshotenabled".into(), json!(false));
    m.insert(
        "allowuserviewdestroyedvm".into(),
        json!(s.allow_user_view_destroyed_vm),
    );
    // CloudStack reports the setting, or true for admins (who may always expunge).
    let caller_admin = call.caller_account().kind != AccountType::User;
    m.insert(
        "allowuserexpungerecovervm".into(),
        json!(s.allow_user_expunge_recover_vm || caller_admin),
    );
    m.insert("allowuserexpungerecovervolume".into(), json!(false));
    m.insert("allowuserviewalldomainaccounts".into(), json!(false));
    m.insert("kubernetesserviceenabled".into(), json!(false));
    m.insert(
        "kubernetesclusterexperimentalfeaturesenabled".into(),
        json!(false),
    );
    m.insert("defaultuipagesize".into(), json!(20));
    m.insert(
        "instancesstatsretentiontime".into(),
        json!(s.stats_retention_seconds / 60),
    );
    m.insert("instancesstatsuseronly".into(), json!(false));
    m.insert("instancesdisksstatsretentionenabled".into(), json!(false));
    m.insert("instancesdisksstatsretentiontime".into(), json!(0));
    if let Some(t) = call.throttle.or(s.throttle) {
        m.insert("apilimitinterval".into(), json!(t.interval_seconds));
        m.insert("apilimitmax".into(), json!(t.max));
    }
    Ok(Reply::Object("capability", Value::Object(m)))
}

fn api_json(spec: &CommandSpec) -> Value {
    let params: Vec<Value> = spec
        .params
        .iter()
        .map(|p| {
            json!({"name": p.name, "description": p.description, "type": p.kind,
                   "required": p.required, "length": 255})
        })
        .collect();
    let mut m = Map::new();
    m.insert("name".into(), json!(spec.name));
    m.insert("description".into(), json!(spec.description));
    m.insert("isasync".into(), json!(spec.is_async));
    if !spec.since.is_empty() {
        m.insert("since".into(), json!(spec.since));
    }
    m.insert("related".into(), json!(""));
    m.insert("params".into(), Value::Array(params));
    m.insert("response".into(), json!([]));
    Value::Object(m)
}

fn list_apis(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let w: &World = call.world;
    let allowed = |s: &CommandSpec| access(w, call.caller, s) == Access::Allowed;
    let not_found = || {
        ApiError::server(
            530,
            "Api Discovery plugin was unable to find an api by that name or process any apis",
        )
    };
    let items: Vec<Value> = match call.get_nonempty("name") {
        Some(name) => {
            let spec = find(name).ok_or_else(not_found)?;
            if !allowed(spec) {
                return Err(not_found());
            }
            vec![api_json(spec)]
        }
        None => COMMANDS
            .iter()
            .filter(|s| allowed(s))
            .map(api_json)
            .collect(),
    };
    // CloudStack's rate limiter counts one call per API name it checks for non-root callers.
    call.extra_throttle_hits = items.len() as u64;
    let count = items.len();
    Ok(Reply::List { items, count })
}
