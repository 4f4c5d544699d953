package harness

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// moduleDir is where the Go module cache holds a dependency of this module (at the version
// go.mod selects), e.g. to read the webhook manifests shipped in its zip.
func moduleDir(path string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path)
	cmd.Env = append(cmd.Environ(), modFlags(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", path, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s is not in the module cache (run go mod download)", path)
	}
	return dir, nil
}

// modFlags is GOFLAGS for a go command the harness starts: modules from go.mod, plus whatever the
// caller's GOFLAGS asks for (CI passes -modcacherw so its fresh module cache can be deleted).
func modFlags() string {
	return strings.TrimSpace("GOFLAGS=-mod=mod " + os.Getenv("GOFLAGS"))
}
