// Package simapi drives cloudstack-sim through cloudstack-go exactly the way the CAPC
// v0.6.1 controllers do for a cluster on a shared network (capi-interop.md D.4): the same
// service methods and helpers, the same parameters, and assertions on the fields CAPC reads.
//
// Run: cd tests/e2e && GOFLAGS=-mod=mod GOWORK=off go test ./simapi/ -v
// The simulator binary comes from $CLOUDSTACK_SIM, else $CARGO_TARGET_DIR/debug, else the
// repository's target/debug (build it with `cargo build -p cloudstack-sim`).
package simapi

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/cloudstack-go/v2/cloudstack"
)

const (
	apiKey       = "e2e-admin-key"
	secretKey    = "e2e-admin-secret"
	zoneName     = "zone1"
	networkName  = "shared-net"
	offeringName = "small"
	templateName = "ubuntu-2204-kube-v1.31.3"
	unknownID    = "0b9e4c1a-7d2f-4e3b-9a8c-1f2e3d4c5b6a"
)

// simBinary finds the cloudstack-sim executable.
func simBinary(t *testing.T) string {
	t.Helper()
	var candidates []string
	if p := os.Getenv("CLOUDSTACK_SIM"); p != "" {
		candidates = append(candidates, p)
	} else if d := os.Getenv("CARGO_TARGET_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "debug", "cloudstack-sim"))
	} else {
		// The package sits in tests/e2e/simapi; the repository root is three levels up.
		candidates = append(candidates,
			filepath.Join("..", "..", "..", "target", "debug", "cloudstack-sim"),
			filepath.Join("..", "..", "target", "debug", "cloudstack-sim"))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			abs, _ := filepath.Abs(c)
			return abs
		}
	}
	t.Fatalf("cloudstack-sim binary not found (tried %v): run `cargo build -p cloudstack-sim` "+
		"or set CLOUDSTACK_SIM", candidates)
	return ""
}

// startSim runs the simulator with the capc-e2e scenario on a free loopback port and
// returns its base URL.
func startSim(t *testing.T) string {
	t.Helper()
	bin := simBinary(t)
	scenario, _ := filepath.Abs(filepath.Join("..", "..", "..", "cloudstack-fixtures", "scenarios", "capc-e2e.json"))
	portFile := filepath.Join(t.TempDir(), "port")
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--scenario", scenario,
		"--time-scale", "1", "--port-file", portFile)
	var logs bytes.Buffer
	cmd.Stdout = &logs
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("cloudstack-sim output:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(portFile); err == nil {
			return "http://127.0.0.1:" + strings.TrimSpace(string(b))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("cloudstack-sim did not write %s within 20s; output:\n%s", portFile, logs.String())
	return ""
}

// adminVM is the part of the simulator's admin view (GET /sim/vms/{id}) checked here.
type adminVM struct {
	ID            string  `json:"id"`
	State         string  `json:"state"`
	Removed       bool    `json:"removed"`
	Guest         string  `json:"guest"`
	IPAddress     *string `json:"ipaddress"`
	Joined        bool    `json:"joined"`
	Deployed      bool    `json:"deployed"`
	UserdataBytes *int    `json:"userdata_bytes"`
	UserdataGzip  bool    `json:"userdata_gzip"`
	Template      string  `json:"template"`
	Offering      string  `json:"service_offering"`
}

func getAdminVM(t *testing.T, base, id string) adminVM {
	t.Helper()
	resp, err := http.Get(base + "/sim/vms/" + id)
	if err != nil {
		t.Fatalf("GET /sim/vms/%s: %v", id, err)
	}
	defer resp.Body.Close()
	var v adminVM
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("decoding /sim/vms/%s: %v", id, err)
	}
	return v
}

func gzipBase64(t *testing.T, s string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// waitFor polls cond every 200ms until it returns true or the timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
}

func mustContain(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)) {
		t.Fatalf("expected an error containing %q, got %v", want, err)
	}
}

func TestCAPCCallsAgainstSim(t *testing.T) {
	base := startSim(t)
	apiURL := base + "/client/api"
	cs := cloudstack.NewClient(apiURL, apiKey, secretKey, false)
	csAsync := cloudstack.NewAsyncClient(apiURL, apiKey, secretKey, false)
	csAsync.AsyncTimeout(60)

	// 1. listUsers (NewClientFromConf): the first user is the caller.
	users, err := cs.User.ListUsers(cs.User.NewListUsersParams())
	if err != nil {
		t.Fatalf("listUsers: %v", err)
	}
	if users.Count < 1 || users.Users[0].Account != "admin" || users.Users[0].Domainid == "" || users.Users[0].Id == "" {
		t.Fatalf("listUsers: unexpected %+v", users)
	}
	domainID := users.Users[0].Domainid

	// 2. listDomains (ResolveDomain): by id (count must be 1), then by path name + level.
	dp := cs.Domain.NewListDomainsParams()
	dp.SetListall(true)
	dp.SetId(domainID)
	domains, err := cs.Domain.ListDomains(dp)
	if err != nil || domains.Count != 1 || domains.Domains[0].Path != "ROOT" {
		t.Fatalf("listDomains id: %v %+v", err, domains)
	}
	if domains.Domains[0].Cpuavailable == "" || domains.Domains[0].Memoryavailable == "" || domains.Domains[0].Vmavailable == "" {
		t.Fatalf("listDomains: limits missing: %+v", domains.Domains[0])
	}
	dp = cs.Domain.NewListDomainsParams()
	dp.SetListall(true)
	dp.SetName("ROOT")
	dp.SetLevel(0)
	domains, err = cs.Domain.ListDomains(dp)
	if err != nil || domains.Count != 1 || domains.Domains[0].Id != domainID {
		t.Fatalf("listDomains name+level: %v %+v", err, domains)
	}
	dp = cs.Domain.NewListDomainsParams()
	dp.SetId(unknownID)
	_, err = cs.Domain.ListDomains(dp)
	mustContain(t, err, "Invalid parameter id value="+unknownID)

	// 3. listAccounts (ResolveAccount).
	ap := cs.Account.NewListAccountsParams()
	ap.SetDomainid(domainID)
	ap.SetName("admin")
	accounts, err := cs.Account.ListAccounts(ap)
	if err != nil || accounts.Count != 1 || accounts.Accounts[0].Name != "admin" || accounts.Accounts[0].Vmavailable == "" {
		t.Fatalf("listAccounts: %v %+v", err, accounts)
	}

	// 4. listProjects (ResolveProject, only with a project): an unknown name lists nothing.
	pp := cs.Project.NewListProjectsParams()
	pp.SetListall(true)
	pp.SetDomainid(domainID)
	pp.SetAccount("admin")
	pp.SetName("no-such-project")
	projects, err := cs.Project.ListProjects(pp)
	if err != nil || projects.Count != 0 {
		t.Fatalf("listProjects: %v %+v", err, projects)
	}

	// 5. listUsers in the account, then getUserKeys (GetUserWithKeys / ResolveUserKeys).
	up := cs.User.NewListUsersParams()
	up.SetAccount("admin")
	up.SetDomainid(domainID)
	up.SetListall(true)
	users, err = cs.User.ListUsers(up)
	if err != nil || users.Count != 1 {
		t.Fatalf("listUsers account: %v %+v", err, users)
	}
	up.SetId(users.Users[0].Id)
	if again, err := cs.User.ListUsers(up); err != nil || again.Count != 1 {
		t.Fatalf("listUsers id: %v %+v", err, again)
	}
	keys, err := cs.User.GetUserKeys(cs.User.NewGetUserKeysParams(users.Users[0].Id))
	if err != nil || keys.Apikey != apiKey || keys.Secretkey != secretKey {
		t.Fatalf("getUserKeys: %v %+v", err, keys)
	}

	// 6. listZones (ResolveZone): by name, then by id.
	zoneID, count, err := cs.Zone.GetZoneID(zoneName)
	if err != nil || count != 1 {
		t.Fatalf("GetZoneID: %v %d", err, count)
	}
	zone, count, err := cs.Zone.GetZoneByID(zoneID)
	if err != nil || count != 1 || zone.Name != zoneName {
		t.Fatalf("GetZoneByID: %v %d %+v", err, count, zone)
	}
	if _, count, err := cs.Zone.GetZoneID("no-such-zone"); count != 0 {
		t.Fatalf("GetZoneID unknown: count %d err %v", count, err)
	} else {
		mustContain(t, err, "No match found")
	}

	// 7. listNetworks (ResolveNetworkForZone): keyword, then id; the type must be Shared.
	network, count, err := cs.Network.GetNetworkByName(networkName, cloudstack.WithProject(""))
	if err != nil || count != 1 || network.Type != "Shared" || network.Id == "" {
		t.Fatalf("GetNetworkByName: %v %d %+v", err, count, network)
	}
	byID, count, err := cs.Network.GetNetworkByID(network.Id, cloudstack.WithProject(""))
	if err != nil || count != 1 || byID.Name != networkName || byID.Cidr != "10.10.0.0/16" {
		t.Fatalf("GetNetworkByID: %v %d %+v", err, count, byID)
	}

	// 8, 9. listAffinityGroups then createAffinityGroup (GetOrCreateAffinityGroup).
	const groupName = "e2e-anti"
	if _, _, err := cs.AffinityGroup.GetAffinityGroupByName(groupName, cloudstack.WithProject("")); err == nil {
		t.Fatalf("affinity group %s should not exist yet", groupName)
	}
	cp := cs.AffinityGroup.NewCreateAffinityGroupParams(groupName, "host anti-affinity")
	cp.SetName(groupName)
	created, err := cs.AffinityGroup.CreateAffinityGroup(cp)
	if err != nil || created.Id == "" || created.JobID == "" {
		t.Fatalf("createAffinityGroup: %v %+v", err, created)
	}
	group, count, err := cs.AffinityGroup.GetAffinityGroupByID(created.Id, cloudstack.WithProject(""))
	if err != nil || count != 1 || group.Name != groupName || group.Type != "host anti-affinity" {
		t.Fatalf("GetAffinityGroupByID: %v %d %+v", err, count, group)
	}
	if g, _, err := cs.AffinityGroup.GetAffinityGroupByName(groupName); err != nil || g.Id != created.Id {
		t.Fatalf("GetAffinityGroupByName: %v %+v", err, g)
	}

	// 11. listServiceOfferings (ResolveServiceOffering): name + zone, and by id.
	offering, count, err := cs.ServiceOffering.GetServiceOfferingByName(offeringName, cloudstack.WithZone(zoneID), cloudstack.WithProject(""))
	if err != nil || count != 1 || offering.Cpunumber != 2 || offering.Memory != 2048 {
		t.Fatalf("GetServiceOfferingByName: %v %d %+v", err, count, offering)
	}
	if o, count, err := cs.ServiceOffering.GetServiceOfferingByID(offering.Id); err != nil || count != 1 || o.Name != offeringName {
		t.Fatalf("GetServiceOfferingByID: %v %d %+v", err, count, o)
	}

	// 12. listTemplates (ResolveTemplate): name + executable + zone, and by id.
	templateID, count, err := cs.Template.GetTemplateID(templateName, "executable", zoneID, cloudstack.WithProject(""))
	if err != nil || count != 1 {
		t.Fatalf("GetTemplateID: %v %d", err, count)
	}
	if tpl, count, err := cs.Template.GetTemplateByID(templateID, "executable"); err != nil || count != 1 || tpl.Name != templateName {
		t.Fatalf("GetTemplateByID: %v %d %+v", err, count, tpl)
	}

	// 13. listDiskOfferings (ResolveDiskOffering, only with a disk offering).
	diskID, count, err := cs.DiskOffering.GetDiskOfferingID("Custom", cloudstack.WithZone(zoneID), cloudstack.WithProject(""))
	if err != nil || count != 1 {
		t.Fatalf("GetDiskOfferingID: %v %d", err, count)
	}
	disk, count, err := cs.DiskOffering.GetDiskOfferingByID(diskID)
	if err != nil || count != 1 || !disk.Iscustomized {
		t.Fatalf("GetDiskOfferingByID: %v %d %+v", err, count, disk)
	}

	// 14. listPublicIpAddresses (isFreeIPAvailable, only with spec.networks).
	ipp := cs.Address.NewListPublicIpAddressesParams()
	ipp.SetNetworkid(network.Id)
	ipp.SetAllocatedonly(false)
	ipp.SetForvirtualnetwork(false)
	ipp.SetListall(true)
	ipp.SetIpaddress("10.10.0.50")
	ips, err := cs.Address.ListPublicIpAddresses(ipp)
	if err != nil || ips.Count != 1 || ips.PublicIpAddresses[0].State != "Free" {
		t.Fatalf("listPublicIpAddresses: %v %+v", err, ips)
	}

	// 10. listVirtualMachinesMetrics before the deploy: unknown id and name are "no match".
	if _, count, err := cs.VirtualMachine.GetVirtualMachinesMetricByID(unknownID); count != 0 {
		t.Fatalf("metrics unknown id: count %d err %v", count, err)
	} else {
		mustContain(t, err, "no match found")
	}
	if _, count, err := cs.VirtualMachine.GetVirtualMachinesMetricByName("e2e-md-0"); count != 0 {
		t.Fatalf("metrics unknown name: count %d err %v", count, err)
	} else {
		mustContain(t, err, "no match")
	}

	// 15. deployVirtualMachine (DeployVM) on the non-async client: networkids, userdata as
	// base64 of gzip, affinity group, details.
	dep := cs.VirtualMachine.NewDeployVirtualMachineParams(offering.Id, templateID, zoneID)
	dep.SetNetworkids([]string{network.Id})
	dep.SetName("e2e-md-0")
	dep.SetDisplayname("e2e-md-0")
	dep.SetUserdata(gzipBase64(t, "#cloud-config\nruncmd: [kubeadm join]\n"))
	dep.SetAffinitygroupids([]string{created.Id})
	dep.SetDetails(map[string]string{"memoryOvercommitRatio": "1"})
	deployed, err := cs.VirtualMachine.DeployVirtualMachine(dep)
	if err != nil || deployed.Id == "" || deployed.JobID == "" {
		t.Fatalf("deployVirtualMachine: %v %+v", err, deployed)
	}
	vmID := deployed.Id

	// A second VM the spec.networks way: iptonetworklist with a fixed address, a data disk.
	dep2 := cs.VirtualMachine.NewDeployVirtualMachineParams(offering.Id, templateID, zoneID)
	dep2.SetIptonetworklist([]map[string]string{{"networkid": network.Id, "ip": "10.10.0.50"}})
	dep2.SetName("e2e-md-1")
	dep2.SetDisplayname("e2e-md-1")
	dep2.SetDiskofferingid(diskID)
	dep2.SetSize(20)
	deployed2, err := cs.VirtualMachine.DeployVirtualMachine(dep2)
	if err != nil || deployed2.Id == "" {
		t.Fatalf("deployVirtualMachine iptonetworklist: %v %+v", err, deployed2)
	}

	// A duplicate live name and a wrong template id are refused like CloudStack does.
	_, err = cs.VirtualMachine.DeployVirtualMachine(dep)
	mustContain(t, err, "already exists")
	bad := cs.VirtualMachine.NewDeployVirtualMachineParams(offering.Id, unknownID, zoneID)
	bad.SetName("e2e-md-9")
	_, err = cs.VirtualMachine.DeployVirtualMachine(bad)
	mustContain(t, err, "Invalid parameter templateid value="+unknownID)

	// 10 again (GetOrCreateVMInstance → ResolveVMInstanceDetails): Starting, then Running
	// with the NIC address.
	vm, count, err := cs.VirtualMachine.GetVirtualMachinesMetricByID(vmID, cloudstack.WithProject(""))
	if err != nil || count != 1 || vm.Id != vmID {
		t.Fatalf("metrics by id: %v %d %+v", err, count, vm)
	}
	if vm.State != "Starting" && vm.State != "Running" {
		t.Fatalf("fresh VM state %q", vm.State)
	}
	waitFor(t, "VM running", 20*time.Second, func() (bool, string) {
		v, _, err := cs.VirtualMachine.GetVirtualMachinesMetricByID(vmID)
		if err != nil {
			return false, err.Error()
		}
		return v.State == "Running" && len(v.Nic) == 1 && v.Nic[0].Ipaddress != "", v.State
	})
	if byName, _, err := cs.VirtualMachine.GetVirtualMachinesMetricByName("e2e-md-0"); err != nil || byName.Id != vmID {
		t.Fatalf("metrics by name: %v %+v", err, byName)
	}
	admin := getAdminVM(t, base, vmID)
	if !admin.Deployed || admin.UserdataBytes == nil || !admin.UserdataGzip || admin.Guest != "healthy" ||
		admin.Template != templateName || admin.Offering != offeringName {
		t.Fatalf("admin view: %+v", admin)
	}
	waitFor(t, "guest joined", 10*time.Second, func() (bool, string) {
		a := getAdminVM(t, base, vmID)
		return a.Joined, a.State
	})

	// 20. queryAsyncJobResult of the deploy job: finished, with the VM.
	job, err := cs.Asyncjob.QueryAsyncJobResult(cs.Asyncjob.NewQueryAsyncJobResultParams(deployed.JobID))
	if err != nil || job.Jobstatus != 1 || job.Jobresulttype != "object" || !strings.Contains(string(job.Jobresult), vmID) {
		t.Fatalf("queryAsyncJobResult: %v %+v", err, job)
	}
	if raw, err := cs.GetAsyncJobResult(deployed.JobID, 10); err != nil || !strings.Contains(string(raw), "virtualmachine") {
		t.Fatalf("GetAsyncJobResult: %v %s", err, raw)
	}

	// 16. listVirtualMachines (findVirtualMachine after a deploy error).
	lp := cs.VirtualMachine.NewListVirtualMachinesParams()
	lp.SetTemplateid(templateID)
	lp.SetZoneid(zoneID)
	lp.SetNetworkid(network.Id)
	lp.SetName("e2e-md-0")
	listed, err := cs.VirtualMachine.ListVirtualMachines(lp)
	if err != nil || listed.Count != 1 || listed.VirtualMachines[0].Id != vmID {
		t.Fatalf("listVirtualMachines: %v %+v", err, listed)
	}
	if len(listed.VirtualMachines[0].Affinitygroup) != 1 || listed.VirtualMachines[0].Affinitygroup[0].Id != created.Id {
		t.Fatalf("listVirtualMachines affinity groups: %+v", listed.VirtualMachines[0].Affinitygroup)
	}

	// 17. listCapabilities (DestroyVMInstance): admins may expunge.
	caps, err := cs.Configuration.ListCapabilities(cs.Configuration.NewListCapabilitiesParams())
	if err != nil || !caps.Capabilities.Allowuserexpungerecovervm {
		t.Fatalf("listCapabilities: %v %+v", err, caps)
	}
	expunge := caps.Capabilities.Allowuserexpungerecovervm

	// 18. listVolumes type=DATADISK on the async client (listVMInstanceDatadiskVolumeIDs).
	dataDisks := func(id string) []string {
		p := csAsync.Volume.NewListVolumesParams()
		p.SetVirtualmachineid(id)
		p.SetType("DATADISK")
		r, err := csAsync.Volume.ListVolumes(p)
		if err != nil {
			t.Fatalf("listVolumes %s: %v", id, err)
		}
		var ids []string
		for _, v := range r.Volumes {
			ids = append(ids, v.Id)
		}
		return ids
	}
	if ids := dataDisks(vmID); len(ids) != 0 {
		t.Fatalf("first VM has data disks %v", ids)
	}
	disks2 := dataDisks(deployed2.Id)
	if len(disks2) != 1 {
		t.Fatalf("second VM data disks %v", disks2)
	}

	// 19. destroyVirtualMachine through the async client (polls queryAsyncJobResult).
	destroy := func(id string, volumes []string) error {
		p := csAsync.VirtualMachine.NewDestroyVirtualMachineParams(id)
		p.SetExpunge(expunge)
		if len(volumes) > 0 {
			p.SetVolumeids(volumes)
		}
		r, err := csAsync.VirtualMachine.DestroyVirtualMachine(p)
		if err == nil && r.Id != id {
			return fmt.Errorf("destroy job result names VM %q, want %q", r.Id, id)
		}
		return err
	}
	// The destroy-fails fault: CAPC's destroy job fails with CloudStack's "Failed to destroy
	// Instance" (530) on every try, the VM stays, until the fault is cleared.
	adminFault := func(method string, body string) {
		req, err := http.NewRequest(method, base+"/sim/vms/"+deployed2.Id+"/faults", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s faults: %v %v", method, err, resp)
		}
		resp.Body.Close()
	}
	adminFault(http.MethodPost, `{"fault": "destroy-fails"}`)
	for i := 0; i < 2; i++ {
		mustContain(t, destroy(deployed2.Id, nil), "Failed to destroy Instance")
		if a := getAdminVM(t, base, deployed2.Id); a.Removed || a.State != "Running" {
			t.Fatalf("after a failed destroy: %+v", a)
		}
	}
	adminFault(http.MethodDelete, "")
	for _, d := range []struct {
		id      string
		volumes []string
	}{{vmID, nil}, {deployed2.Id, disks2}} {
		if err := destroy(d.id, d.volumes); err != nil {
			t.Fatalf("destroyVirtualMachine %s: %v", d.id, err)
		}
		// After the destroy CAPC re-reads the VM: Expunging or no match means done.
		v, _, err := cs.VirtualMachine.GetVirtualMachinesMetricByID(d.id)
		if err == nil && v.State != "Expunging" {
			t.Fatalf("after destroy with expunge: state %q", v.State)
		} else if err != nil && !strings.Contains(strings.ToLower(err.Error()), "no match found") {
			t.Fatalf("after destroy: %v", err)
		}
	}
	waitFor(t, "VM expunged", 10*time.Second, func() (bool, string) {
		_, count, err := cs.VirtualMachine.GetVirtualMachinesMetricByID(vmID)
		return count == 0 && err != nil && strings.Contains(err.Error(), "No match found"), fmt.Sprint(err)
	})
	if a := getAdminVM(t, base, vmID); !a.Removed {
		t.Fatalf("admin view after expunge: %+v", a)
	}
	// Destroying a VM that is gone is CAPC's "already gone" success case.
	mustContain(t, destroy(vmID, nil), "unable to find uuid for id")

	// 21. deleteAffinityGroup (the non-async client ignores the job; the group goes away).
	delp := cs.AffinityGroup.NewDeleteAffinityGroupParams()
	delp.SetId(created.Id)
	delResp, err := cs.AffinityGroup.DeleteAffinityGroup(delp)
	if err != nil || delResp.JobID == "" {
		t.Fatalf("deleteAffinityGroup: %v %+v", err, delResp)
	}
	if job, err := cs.Asyncjob.QueryAsyncJobResult(cs.Asyncjob.NewQueryAsyncJobResultParams(delResp.JobID)); err != nil || job.Jobstatus != 1 {
		t.Fatalf("deleteAffinityGroup job: %v %+v", err, job)
	}
	if _, _, err := cs.AffinityGroup.GetAffinityGroupByID(created.Id); err == nil {
		t.Fatalf("affinity group %s still resolves after delete", created.Id)
	}
}
