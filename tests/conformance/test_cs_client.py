"""The `cs` client from PyPI (exoscale's CloudStack client, an implementation we did not
write) against cloudstack-sim: if the simulator's signing, wire format or errors drifted
from CloudStack's, this independent client would notice."""

import pytest
import requests
from cs import CloudStack, CloudStackApiException

SPECIAL = "web *(prod)+1 ünï/çødé"


def client(sim, secret=None):
    return CloudStack(endpoint=sim["endpoint"], key=sim["key"], secret=secret or sim["secret"], timeout=10)


def create_vm(sim, name, **extra):
    resp = requests.post(
        sim["base"] + "/sim/vms", json={"name": name, "state": "Running", "guest": "healthy", **extra}, timeout=10
    )
    assert resp.status_code == 201, resp.text
    vm = resp.json()
    assert vm["id"], vm
    return vm


def test_signed_list_with_special_characters_in_keyword_finds_the_vm(sim):
    vm = create_vm(sim, SPECIAL)
    create_vm(sim, "unrelated-vm")
    result = client(sim).listVirtualMachines(keyword=SPECIAL, listall=True, details="nics,stats")
    assert result["count"] == 1
    [found] = result["virtualmachine"]
    assert found["id"] == vm["id"]
    assert found["name"] == SPECIAL
    assert found["state"] == "Running"


CLUSTER_TAG = "cluster.x-k8s.io/cluster-name"


def test_signed_list_with_a_tags_map_parameter_filters_by_key_and_value(sim):
    # cs turns the list into tags[0].key=…&tags[0].value=… — names with brackets, a key with
    # '/' and a value with a space, all signed. CloudStack returns the VMs carrying a tag with
    # that key and that value; the simulator compares both exactly (commands/vms.rs, select_vms).
    tagged = create_vm(sim, "tags-match", tags={CLUSTER_TAG: "my cluster"})
    other = create_vm(sim, "tags-other-value", tags={CLUSTER_TAG: "other cluster"})
    untagged = create_vm(sim, "tags-untagged")
    cs = client(sim)

    # The control: without the filter the listing sees all three (so 1 below is the filter's doing).
    everything = {vm["id"] for vm in cs.listVirtualMachines(listall=True, keyword="tags-")["virtualmachine"]}
    assert {tagged["id"], other["id"], untagged["id"]} <= everything

    result = cs.listVirtualMachines(tags=[{"key": CLUSTER_TAG, "value": "my cluster"}], listall=True)
    assert result.get("count") == 1, result
    [found] = result["virtualmachine"]
    assert found["id"] == tagged["id"]
    assert {"key": CLUSTER_TAG, "value": "my cluster"} in [
        {"key": t["key"], "value": t["value"]} for t in found.get("tags", [])
    ], found.get("tags")

    # A value no VM carries (the key alone does not match): nothing, as CloudStack answers it.
    none = cs.listVirtualMachines(tags=[{"key": CLUSTER_TAG, "value": "no such cluster"}], listall=True)
    assert none.get("count", 0) == 0, none
    assert none.get("virtualmachine", []) == [], none


def test_pagination_with_fetch_list_collects_every_page(sim):
    ids = {create_vm(sim, f"page-vm-{i}")["id"] for i in range(7)}
    vms = client(sim).listVirtualMachines(listall=True, keyword="page-vm-", fetch_list=True, pagesize=3)
    assert {vm["id"] for vm in vms} == ids


def test_wrong_secret_gets_401_with_cloudstacks_text(sim):
    with pytest.raises(CloudStackApiException) as err:
        client(sim, secret="not-the-secret").listVirtualMachines(listall=True)
    assert err.value.response.status_code == 401
    assert err.value.error["errorcode"] == 401
    assert err.value.error["errortext"] == "unable to verify user credentials and/or request signature"
    assert "cserrorcode" not in err.value.error


def test_unknown_command_gets_cloudstacks_error(sim):
    with pytest.raises(CloudStackApiException) as err:
        client(sim).listFlyingSaucers()
    assert err.value.response.status_code == 401
    body = err.value.response.json()
    assert list(body) == ["errorresponse"]
    assert body["errorresponse"]["errorcode"] == 401


def test_a_tilde_signed_the_cs_way_is_rejected_like_cloudstack_does(sim):
    # cs leaves '~' unescaped while CloudStack's server encodes it as %7E: a faithful
    # simulator rejects the signature (cloudstack-api.md §1.2b).
    with pytest.raises(CloudStackApiException) as err:
        client(sim).listVirtualMachines(keyword="a~b", listall=True)
    assert err.value.response.status_code == 401


def test_page_size_above_the_servers_maximum_is_a_431(sim):
    with pytest.raises(CloudStackApiException) as err:
        client(sim).listVirtualMachines(listall=True, page=1, pagesize=501)
    assert err.value.response.status_code == 431
    assert "Page size can't exceed max allowed page size value: 500" in err.value.error["errortext"]


def test_list_routers_and_an_arping_diagnostics_job_through_cs(sim):
    # The probe's calls (docs/guest-probe.md): find the Running router of the VM's network,
    # run arping in it, poll queryAsyncJobResult until the job is done.
    vm = create_vm(sim, "probe-target")
    # The guest configures its address at the end of the boot's DHCP phase (simulated time).
    resp = requests.post(sim["base"] + "/sim/clock", json={"advance_seconds": 30}, timeout=10)
    assert resp.status_code == 200, resp.text
    cs = client(sim)
    [nic] = cs.listNics(virtualmachineid=vm["id"])["nic"]
    routers = cs.listRouters(networkid=nic["networkid"], state="Running", listall=True, projectid=-1)
    assert routers["count"] == 1
    [router] = routers["router"]
    assert router["role"] == "VIRTUAL_ROUTER"
    assert router["nic"][0]["networkid"] == nic["networkid"]

    submitted = cs.runDiagnostics(targetid=router["id"], ipaddress=nic["ipaddress"], type="arping", params="-c 3 -f")
    jobid = submitted["jobid"]
    job = cs.queryAsyncJobResult(jobid=jobid)
    for _ in range(50):  # the job lasts one simulated second (real time here)
        if job["jobstatus"] != 0:
            break
        requests.post(sim["base"] + "/sim/clock", json={"advance_seconds": 0.5}, timeout=10)
        job = cs.queryAsyncJobResult(jobid=jobid)
    assert job["jobstatus"] == 1, job
    assert list(job["jobresult"]) == ["diagnostics"]
    d = job["jobresult"]["diagnostics"]
    assert d["exitcode"] == "0"
    assert d["stderr"] == "b''"
    assert d["stdout"].startswith(f"b'ARPING {nic['ipaddress']} from {router['guestipaddress']} eth0\\n")
    assert f"Unicast reply from {nic['ipaddress']} [{nic['macaddress'].upper()}]" in d["stdout"]
    assert d["stdout"].endswith("Received 1 response(s)\\n'")
