//! `listNics` and the NIC response (also part of the VM response), and who may see a VM.

use serde_json::{json, Map, Value};

use crate::api::{ApiError, Call, Reply};
use crate::world::{AccountType, NetworkType, Vm, World};

pub(super) fn nic_json(w: &World, vm: &Vm, with_vm_id: bool) -> Option<Value> {
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

/// Whether an account may see and act on a VM: admins any VM, users their own and their
/// projects' VMs.
pub(crate) fn vm_visible_to(w: &World, caller: usize, vm: &Vm) -> bool {
    w.accounts[caller].kind != AccountType::User
        || match vm.project {
            Some(p) => w.projects[p].members.contains(&caller),
            None => vm.account == caller,
        }
}

pub(super) fn list_nics(call: &mut Call<'_>) -> Result<Reply, ApiError> {
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
