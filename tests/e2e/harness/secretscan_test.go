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
	})
	sort.Strings(found)
	want := []string{
		fmt.Sprintf("admin key: secret key (%d chars)", len(SimAdminSecret)),
		"log: signature=",
		fmt.Sprintf("status: secret key (%d chars)", len(SimReadOnlySecret)),
	}
	if strings.Join(found, "|") != strings.Join(want, "|") {
		t.Fatalf("found %q, want %q", found, want)
	}
	for _, f := range found {
		if strings.Contains(f, SimReadOnlySecret) || strings.Contains(f, SimAdminSecret) {
			t.Fatalf("the finding repeats the secret: %q", f)
		}
	}
}
