"""hack/cloudstack-role: the raw-API script's signer against the shared known-answer vectors,
its dry run against cloudstack-sim's signature check, and the role itself enforced by
cloudstack-sim (the seed scenario's `capi` account carries the same rules)."""

import importlib.util
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from conftest import debug_binary

ROOT = Path(__file__).resolve().parents[2]
ROLE_DIR = ROOT / "hack" / "cloudstack-role"
SCRIPT = ROLE_DIR / "create-role.py"
VECTORS = ROOT.parent / "shared" / "cloudstack-signing-vectors.json"


def load_script():
    spec = importlib.util.spec_from_file_location("create_role", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


role = load_script()


def vectors():
    if not VECTORS.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{VECTORS} is required when CI=true")
        pytest.skip(f"{VECTORS} not present (needs ../shared next to the repository)")
    return json.loads(VECTORS.read_text())


def test_signer_matches_every_shared_vector():
    data = vectors()
    assert data["vectors"], "no vectors in the file"
    for v in data["vectors"]:
        params = v["params"]
        assert role.canonical_string(params) == v["canonical"], v["name"]
        assert role.signature(data["secret_key"], params) == v["signature"], v["name"]
        assert role.signed_query(data["secret_key"], params) == v["query_on_wire"], v["name"]


def test_values_are_encoded_like_java_urlencoder():
    assert role.encode_value("a b*c~d+e/f") == "a%20b*c%7Ed%2Be%2Ff"
    assert role.encode_value("ünï") == "%C3%BCn%C3%AF"
    assert role.encode_value("A-z_0.9") == "A-z_0.9"
    # signature v3 with an `expires` every CloudStack release parses
    import datetime

    now = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    params = role.request_params("KEY", "listApis", {"name": "x"}, now)
    assert params["signatureversion"] == "3"
    assert params["expires"] == "2026-01-01T12:05:00+0000"
    assert params["response"] == "json"


def test_cloudmonkey_commands_and_script_create_the_same_rules():
    text = (ROLE_DIR / "cloudmonkey.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    creates = [line for line in lines if line.startswith("create role ")]
    assert len(creates) == 1 and "name=capc-health-shim-ro" in creates[0] and "type=User" in creates[0]
    rules = []
    for line in lines:
        if line.startswith("create rolepermission "):
            kv = dict(part.split("=", 1) for part in line.split()[2:])
            rules.append((kv["rule"], kv["permission"]))
    assert rules == role.RULES
    assert rules[-1] == ("*", "deny")
    assert [r for r, _ in rules[:-1]] == role.ALLOWED


def test_the_seed_scenarios_restricted_account_has_exactly_this_role():
    seed = json.loads((ROOT / "cloudstack-fixtures" / "scenarios" / "seed.json").read_text())
    [capi] = [a for a in seed["accounts"] if a["name"] == "capi"]
    assert capi["role"]["type"] == role.ROLE_TYPE
    assert [(r["rule"], r["permission"]) for r in capi["role"]["rules"]] == role.RULES


def run_script(sim, *args, key=None, secret=None):
    env = dict(
        os.environ,
        CLOUDSTACK_API_URL=sim["endpoint"],
        CLOUDSTACK_API_KEY=key or sim["key"],
        CLOUDSTACK_SECRET_KEY=secret or sim["secret"],
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_dry_run_prints_every_request_signed_and_sends_nothing(sim):
    out = run_script(sim, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert sim["secret"] not in out.stdout + out.stderr
    assert sim["key"] not in out.stdout, "the API key is redacted in printed requests"
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + len(role.RULES)
    seen_rules = []
    for i, line in enumerate(lines):
        method, url = line.split(" ", 1)
        assert method == "GET" and url.startswith(sim["endpoint"] + "?")
        pairs = [kv.split("=", 1) for kv in url.split("?", 1)[1].split("&")]
        assert pairs[-1][0] == "signature"
        params = {k: urllib.parse.unquote(v) for k, v in pairs[:-1]}
        assert params.pop("apiKey") == "API_KEY"
        params["apiKey"] = sim["key"]
        # the printed signature is the one the script would send with the real key
        assert urllib.parse.unquote(pairs[-1][1]) == role.signature(sim["secret"], params), line
        assert params["signatureversion"] == "3" and params["expires"].endswith("+0000")
        if i == 0:
            assert params["command"] == "createRole"
            assert (params["name"], params["type"]) == ("capc-health-shim-ro", "User")
        else:
            assert params["command"] == "createRolePermission"
            assert params["roleid"] == role.DRY_RUN_ROLE_ID
            seen_rules.append((params["rule"], params["permission"]))
    assert seen_rules == role.RULES


def test_the_scripts_signer_passes_the_simulators_signature_check(sim):
    client = role.Client(sim["endpoint"], sim["key"], sim["secret"], timeout=10)
    answer = client.call("listApis", name="listVirtualMachines")  # raises unless HTTP 200
    assert [a["name"] for a in answer["api"]] == ["listVirtualMachines"]
    out = run_script(sim, "--call", "listApis", "name=listVirtualMachines")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["api"][0]["name"] == "listVirtualMachines"
    # and a wrong secret is refused by the same check
    bad = run_script(sim, "--call", "listApis", "name=listVirtualMachines", secret="wrong")
    assert bad.returncode == 1
    assert "HTTP 401" in bad.stderr and "wrong" not in bad.stderr


def account(seed_sim, name):
    seed = json.loads(seed_sim["scenario"].read_text())
    [a] = [a for a in seed["accounts"] if a["name"] == name]
    return role.Client(seed_sim["endpoint"], a["api_key"], a["secret_key"], timeout=10)


def test_a_key_with_the_role_lists_vms_and_nothing_else(seed_sim):
    capi = account(seed_sim, "capi")
    vms = capi.call("listVirtualMachines", listall="true", details="nics,stats")
    assert vms.get("count", 0) > 0, vms
    nics = capi.call("listNics", virtualmachineid=vms["virtualmachine"][0]["id"])
    assert "nic" in nics
    capi.call("listCapabilities")
    assert sorted(a["name"] for a in capi.call("listApis")["api"]) == sorted(role.ALLOWED)
    # The simulator implements deployVirtualMachine (the root admin gets past the role check
    # to parameter validation: a 431 for the bogus ids), so the role's `*` deny rule is what
    # refuses it for this key — with CloudStack's text.
    admin = account(seed_sim, "admin")
    with pytest.raises(role.ApiError) as err:
        admin.call("deployVirtualMachine", serviceofferingid="x", templateid="y", zoneid="z")
    assert err.value.status == 431, err.value
    with pytest.raises(role.ApiError) as err:
        capi.call("deployVirtualMachine", serviceofferingid="x", templateid="y", zoneid="z")
    assert err.value.status == 401, err.value
    assert "is not available for user" in err.value.body, err.value.body


def test_the_shim_itself_works_with_the_role_key(seed_sim):
    sim_bin = os.environ.get("CLOUDSTACK_SIM_BIN")
    shim = Path(sim_bin).with_name("capc-health-shim") if sim_bin else debug_binary("capc-health-shim")
    if not shim.exists():
        pytest.fail(f"{shim} not found: run `cargo build --workspace --bins` first (make test does)")
    seed = json.loads(seed_sim["scenario"].read_text())
    [capi] = [a for a in seed["accounts"] if a["name"] == "capi"]
    env = dict(
        os.environ,
        CLOUDSTACK_API_URL=seed_sim["endpoint"],
        CLOUDSTACK_API_KEY=capi["api_key"],
        CLOUDSTACK_SECRET_KEY=capi["secret_key"],
    )
    out = subprocess.run(
        [str(shim), "check", "--polls", "1", "-o", "json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    reports = json.loads(out.stdout)
    assert reports, "the role key sees the seed VMs"


def test_probe_cloudmonkey_commands_and_script_create_the_same_rules():
    text = (ROLE_DIR / "cloudmonkey-probe.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    creates = [line for line in lines if line.startswith("create role ")]
    assert len(creates) == 1 and "name=capc-health-shim-probe" in creates[0] and "type=Admin" in creates[0]
    rules = []
    for line in lines:
        if line.startswith("create rolepermission "):
            kv = dict(part.split("=", 1) for part in line.split()[2:])
            rules.append((kv["rule"], kv["permission"]))
    assert rules == role.PROBE_RULES
    assert rules[-1] == ("*", "deny"), "an Admin-type role without the final deny may call every Admin API"
    assert [r for r, _ in rules[:-1]] == role.PROBE_ALLOWED


def test_the_probe_dry_run_creates_an_admin_role_with_exactly_the_probe_rules(sim):
    out = run_script(sim, "--probe", "--dry-run")
    assert out.returncode == 0, out.stderr
    requests = [urllib.parse.parse_qs(urllib.parse.urlsplit(line.split(" ", 1)[1]).query)
                for line in out.stdout.splitlines() if line.startswith("GET ")]
    assert requests[0]["command"] == ["createRole"]
    assert requests[0]["name"] == ["capc-health-shim-probe"] and requests[0]["type"] == ["Admin"]
    rules = [(r["rule"][0], r["permission"][0]) for r in requests[1:]]
    assert rules == role.PROBE_RULES


def test_the_seed_scenarios_probe_account_has_exactly_the_probe_role():
    seed = json.loads((ROOT / "cloudstack-fixtures" / "scenarios" / "seed.json").read_text())
    [probe] = [a for a in seed["accounts"] if a["name"] == "probe"]
    assert probe["role"]["type"] == role.PROBE_ROLE_TYPE
    assert [(r["rule"], r["permission"]) for r in probe["role"]["rules"]] == role.PROBE_RULES


def test_a_probe_key_arpings_from_the_router_and_can_do_nothing_else(seed_sim):
    probe = account(seed_sim, "probe")
    capi = account(seed_sim, "capi")
    vm = capi.call("listVirtualMachines", listall="true", details="nics")["virtualmachine"][0]
    nic = vm["nic"][0]
    routers = probe.call("listRouters", networkid=nic["networkid"], state="Running",
                         listall="true", projectid="-1")
    assert routers.get("count", 0) >= 1, routers
    router = routers["router"][0]
    job = probe.call("runDiagnostics", targetid=router["id"], ipaddress=nic["ipaddress"],
                     type="arping", params="-c 3 -f")
    assert job.get("jobid"), job
    result = probe.call("queryAsyncJobResult", jobid=job["jobid"])
    assert result["jobstatus"] in (0, 1), result
    # The final `*` deny: no VM listing, no role administration, nothing but the three calls.
    for command, args in [("listVirtualMachines", {"listall": "true"}), ("createRole", {"name": "x", "type": "Admin"}),
                          ("listApis", {})]:
        with pytest.raises(role.ApiError) as err:
            probe.call(command, **args)
        assert err.value.status in (401, 432), (command, err.value)


def test_the_shims_check_probes_with_the_probe_key(seed_sim, tmp_path):
    sim_bin = os.environ.get("CLOUDSTACK_SIM_BIN")
    shim = Path(sim_bin).with_name("capc-health-shim") if sim_bin else debug_binary("capc-health-shim")
    if not shim.exists():
        pytest.fail(f"{shim} not found: run `cargo build --workspace --bins` first (make test does)")
    seed = json.loads(seed_sim["scenario"].read_text())
    keys = {a["name"]: a for a in seed["accounts"]}
    probe_file = tmp_path / "probe-credentials"
    probe_file.write_text(
        f"api-url: {seed_sim['endpoint']}\napi-key: {keys['probe']['api_key']}\n"
        f"secret-key: {keys['probe']['secret_key']}\n"
    )
    env = dict(
        os.environ,
        CLOUDSTACK_API_URL=seed_sim["endpoint"],
        CLOUDSTACK_API_KEY=keys["capi"]["api_key"],
        CLOUDSTACK_SECRET_KEY=keys["capi"]["secret_key"],
    )
    out = subprocess.run(
        [str(shim), "check", "--polls", "4", "--interval", "2s", "--stats-interval", "2s",
         "--probe-credentials-file", str(probe_file), "-o", "json"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [l for l in out.stderr.splitlines() if l.startswith("probe:")]
    jobs = int(line.split()[1])
    replies = int(line.split(", ")[1].split()[0])
    assert jobs >= 1 and replies >= 1, line
    assert "refused" not in line, line
    assert keys["probe"]["secret_key"] not in out.stdout + out.stderr
