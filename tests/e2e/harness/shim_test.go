package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// helpDefaults reads every flag's default from the built binary's `run --help`.
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := CargoBinary(root, "capc-health-shim")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "run", "--help").Output()
	if err != nil {
		t.Fatalf("capc-health-shim run --help: %v", err)
	}
	// A flag line ("      --poll-interval <POLL_INTERVAL>"), then its help, then "[default: …]".
	flag := regexp.MustCompile(`^\s+(?:-\w, )?(--[a-z0-9-]+)`)
	def := regexp.MustCompile(`\[default: "?([^"\]]*)"?\]`)
	defaults, current := map[string]string{}, ""
	for _, line := range strings.Split(string(out), "\n") {
		if m := flag.FindStringSubmatch(line); m != nil {
			current = m[1]
			defaults[current] = ""
		}
		if m := def.FindStringSubmatch(line); m != nil && current != "" {
			defaults[current] = m[1]
		}
	}
	if len(defaults) < 20 {
		t.Fatalf("read only %d flags from run --help:\n%s", len(defaults), out)
	}
	return defaults
}

// Every flag the e2e passes the shim is its default times the time scale, or is listed in
// NonDefaultShimFlags with a reason that tests/e2e/README.md repeats.
func TestShimArgsAreTheProductsDefaultsScaled(t *testing.T) {
	defaults := helpDefaults(t)
	cfg := ShimConfig{Namespace: "ns", Kubeconfig: "k", APIURL: "http://sim/client/api", Scale: TimeScale,
		ProbeSecret: ProbeSecret, ExtraArgs: []string{"--mode", "observe"}}
	args := ShimArgs(cfg, "127.0.0.1:1")
	if args[0] != "run" {
		t.Fatalf("args %v", args)
	}
	checked := 0
	for i := 1; i < len(args); i++ {
		name, value, inline := strings.Cut(args[i], "=")
		if !strings.HasPrefix(name, "--") {
			t.Fatalf("unexpected argument %q in %v", args[i], args)
		}
		def, known := defaults[name]
		if !known {
			t.Errorf("%s: not a flag of capc-health-shim run", name)
			continue
		}
		if !inline && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			value = args[i+1]
			i++
		}
		if _, listed := NonDefaultShimFlags[name]; listed {
			continue
		}
		checked++
		d, err := time.ParseDuration(def)
		if err != nil {
			t.Errorf("%s %s: not in NonDefaultShimFlags and its default %q is no duration to scale", name, value, def)
			continue
		}
		if want := scaled(d, TimeScale); value != want {
			t.Errorf("%s %s: the default %s scaled by %.2f is %s; pass that or list the flag with its reason", name, value, def, TimeScale, want)
		}
	}
	if checked < 10 {
		t.Errorf("only %d scaled defaults checked", checked)
	}
	root, _ := RepoRoot()
	readme, err := os.ReadFile(filepath.Join(root, "tests", "e2e", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range NonDefaultShimFlags {
		if !strings.Contains(string(readme), "`"+name+"`") {
			t.Errorf("tests/e2e/README.md does not list %s, a flag the harness passes away from its default", name)
		}
	}
}
