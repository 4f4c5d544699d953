package harness

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

func TestScanForSecretsFindsKeysAndSignaturesWithoutRepeatingThem(t *testing.T) {
	found := ScanForSecrets(map[string]string{
		"clean":     "VM vm-1 is Running; listVirtualMachines answered 200",
		"log":       "GET /client/api?command=listVirtualMachines&Signature=abc",
		"status":    `{"error":"401 for key ` + SimReadOnlySecret + `"}`,
		"admin key": strings.ToUpper(SimAdminSecret),
		"events":    "Warning capc-health-shim Machine/m-1 ProbeRefused: key " + SimProbeKey + " secret " + SimProbeSecret,
		"probe ok":  `{"probe":{"enabled":true,"endpoint":"http://127.0.0.1:1/client/api","counts":{"replies":3}}}`,
	})
	sort.Strings(found)
	want := []string{
		fmt.Sprintf("admin key: secret key (%d chars)", len(SimAdminSecret)),
		fmt.Sprintf("events: probe API key (%d chars)", len(SimProbeKey)),
		fmt.Sprintf("events: secret key (%d chars)", len(SimProbeSecret)),
		"log: signature=",
		fmt.Sprintf("status: secret key (%d chars)", len(SimReadOnlySecret)),
	}
	if strings.Join(found, "|") != strings.Join(want, "|") {
		t.Fatalf("found %q, want %q", found, want)
	}
	for _, f := range found {
		if strings.Contains(f, SimReadOnlySecret) || strings.Contains(f, SimAdminSecret) ||
			strings.Contains(f, SimProbeSecret) || strings.Contains(f, SimProbeKey) {
			t.Fatalf("the finding repeats the secret: %q", f)
		}
	}
}
