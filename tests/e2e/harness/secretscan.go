package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Needles the shim must never write anywhere: the CloudStack secret keys of the simulator
// (CAPC's, the read-only key's and the guest probe's), the probe's API key too (a key that may
// run diagnostics on routers is worth hiding whole), and any request signature (the shim signs
// every call; a logged URL would carry one).
var secretNeedles = []string{SimReadOnlySecret, SimAdminSecret, SimProbeSecret, SimProbeKey, "signature="}

// ScanForSecrets reports "<where>: <needle>" for every needle found in the named texts.
// Pure, so the harness unit tests can check it.
func ScanForSecrets(texts map[string]string) []string {
	var found []string
	for where, text := range texts {
		lower := strings.ToLower(text)
		for _, n := range secretNeedles {
			if strings.Contains(lower, strings.ToLower(n)) {
				found = append(found, fmt.Sprintf("%s: %s", where, redactNeedle(n)))
			}
		}
	}
	return found
}

// redactNeedle names a found secret without repeating it in the report.
func redactNeedle(n string) string {
	switch n {
	case "signature=":
		return n
	case SimProbeKey:
		return fmt.Sprintf("probe API key (%d chars)", len(n))
	}
	return fmt.Sprintf("secret key (%d chars)", len(n))
}

// shimSurfaces saves what the running shim shows to the world — /status, /metrics — and the
// namespace's Events, next to its log, and returns them by name for the scan.
func shimSurfaces(ctx context.Context, c client.Client, s *Shim, ns, logDir string) map[string]string {
	texts := map[string]string{}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, p := range []string{"/status", "/metrics"} {
		body, err := get(hc, s.StatusURL+p)
		if err != nil {
			body = "(could not read " + p + ": " + err.Error() + ")"
		}
		name := filepath.Join(logDir, fmt.Sprintf("shim-%s%s.txt", ns, strings.ReplaceAll(p, "/", "-")))
		_ = os.WriteFile(name, []byte(body), 0o644)
		texts[name] = body
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(ns)); err == nil {
		var b strings.Builder
		for _, e := range events.Items {
			fmt.Fprintf(&b, "%s %s %s/%s %s: %s\n", e.Type, e.Source.Component+e.ReportingController,
				e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		name := filepath.Join(logDir, "events-"+ns+".txt")
		_ = os.WriteFile(name, []byte(b.String()), 0o644)
		texts[name] = b.String()
	}
	return texts
}

func get(hc *http.Client, url string) (string, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// readFiles adds the named files' contents to texts (missing files are skipped).
func readFiles(texts map[string]string, paths ...string) {
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			texts[p] = string(b)
		}
	}
}
