//! The command table and the handlers of the supported API commands.
//!
//! To add a command, write a handler `fn(&mut Call) -> Result<Reply, ApiError>` and add a
//! [`CommandSpec`] to [`COMMANDS`]: name, response wrapper, item key, the account types its
//! `@APICommand(authorized=…)` annotation lists, whether page rules apply, and the
//! documented parameters (shown by `listApis`).

mod config;
mod discovery;
mod history;
mod nics;
mod vms;

use super::api::{ApiError, Call, Reply};
use super::world::AccountType;
use super::{directory, provisioning, routers};

use config::update_configuration;
use discovery::{list_apis, list_capabilities};
use history::list_usage_history;
use nics::list_nics;
pub(crate) use nics::vm_visible_to;
pub use vms::Details;
use vms::{list_virtual_machines, list_virtual_machines_metrics};
pub(crate) use vms::{vm_response, SIM_OS_ID};

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
    p!("accumulate", "boolean", false, "Accumulates the VM metrics data instead of returning only the most recent data collected. The default behavior is set by the global configuration vm.stats.increment.metrics."),
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
        name: "updateConfiguration",
        response: "updateconfigurationresponse",
        item_key: "configuration",
        authorized: &[AccountType::Admin],
        is_list: false,
        is_async: false,
        since: "",
        description: "Updates a configuration.",
        params: &[
            p!("name", "string", true, "the name of the configuration"),
            p!("value", "string", false, "the value of the configuration"),
        ],
        handler: update_configuration,
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
    CommandSpec {
        name: "listAsyncJobs",
        response: "listasyncjobsresponse",
        item_key: "asyncjobs",
        // ListAsyncJobsCmd: every account type (BaseListAccountResourcesCmd).
        authorized: ALL_TYPES,
        is_list: true,
        is_async: false,
        since: "",
        description: "Lists all pending asynchronous jobs for the account.",
        params: &[
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: provisioning::list_async_jobs,
    },
    CommandSpec {
        name: "listRouters",
        response: "listroutersresponse",
        item_key: "router",
        // ListRoutersCmd has no `authorized` list (ListRoutersCmd.java@cf3a101d). Role-less
        // simulator accounts get the default roles: Root Admin may call everything, Domain
        // Admin has an ALLOW row, User has none (create-default-role-api-mappings.sql@5c9058b5,
        // guest-probe.md §4). Resource Admin is left out: not re-checked (**unverified**).
        authorized: &[AccountType::Admin, AccountType::DomainAdmin],
        is_list: true,
        is_async: false,
        since: "",
        description: "List routers.",
        params: &[
            p!("id", "uuid", false, "the ID of the disk router"),
            p!("name", "string", false, "the name of the router"),
            p!("state", "string", false, "the state of the router"),
            p!("zoneid", "uuid", false, "the Zone ID of the router"),
            p!("hostid", "uuid", false, "the host ID of the router"),
            p!("networkid", "uuid", false, "list by network id"),
            p!("vpcid", "uuid", false, "List networks by VPC"),
            p!("forvpc", "boolean", false, "if true is passed for this parameter, list only VPC routers"),
            p!("listall", "boolean", false, "If set to false, list only resources belonging to the command's caller; if set to true - list resources that the caller is authorized to see. Default value is false"),
            p!("account", "string", false, "list resources by account. Must be used with the domainId parameter."),
            p!("domainid", "uuid", false, "list only resources belonging to the domain specified"),
            p!("projectid", "uuid", false, "list objects by project; if projectid=-1 lists All VMs"),
            p!("keyword", "string", false, "List by keyword"),
            p!("page", "integer", false, ""),
            p!("pagesize", "integer", false, ""),
        ],
        handler: routers::list_routers,
    },
    CommandSpec {
        name: "runDiagnostics",
        response: "rundiagnosticsresponse",
        item_key: "diagnostics",
        // `authorized = {RoleType.Admin}`, since 4.12.0.0 (RunDiagnosticsCmd.java@c098aaa2).
        authorized: &[AccountType::Admin],
        is_list: false,
        is_async: true,
        since: "4.12.0.0",
        description: "Execute network-utility command (ping/arping/tracert) on system VMs remotely",
        params: &[
            p!("targetid", "uuid", true, "The ID of the system VM instance to diagnose"),
            p!("ipaddress", "string", true, "The IP/Domain address to test connection to"),
            p!("type", "string", true, "The system VM diagnostics type  valid options are: ping, traceroute, arping"),
            p!("params", "string", false, "Additional command line options that apply for each command"),
        ],
        handler: routers::run_diagnostics,
    },
];

/// Looks a command up by its exact (case-sensitive) name.
pub fn find(name: &str) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|c| c.name == name)
}
