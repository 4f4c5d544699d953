package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
)

// A fake make-image output: the dist copies and pins, it does not build.
func fakeImageDir(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	digest := "sha256:" + strings.Repeat("ab", 32)
	files := map[string]string{
		archiveName:        "oci archive bytes",
		digestName:         digest + "\n",
		sbomName:           `{"bomFormat":"CycloneDX"}`,
		"capc-health-shim": "#!/bin/sh\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, digest
}

func TestDistHoldsEveryReleaseFilePinnedAndSummed(t *testing.T) {
	b, err := loadBase(defaultRoot())
	if err != nil {
		t.Fatal(err)
	}
	imageDir, digest := fakeImageDir(t)
	out := t.TempDir()
	const ref = "registry.example.com/capc-health-shim:v" + "0.1.0"
	files, err := makeDist(b, imageDir, ref, out)
	if err != nil {
		t.Fatal(err)
	}
	v := "v" + b.version
	want := []string{
		"CHANGELOG-" + v + ".md",
		"addon-components.yaml",
		"capc-health-shim-" + b.version + ".tgz",
		"capc-health-shim-" + v + "-image-digest",
		"capc-health-shim-" + v + "-oci.tar",
		"capc-health-shim-" + v + ".cdx.json",
		"metadata.yaml",
		sumsName,
	}
	for _, w := range want {
		found := false
		for _, f := range files {
			found = found || f == w
		}
		if !found {
			t.Errorf("%s missing from %v", w, files)
		}
	}
	if len(files) != len(want)+1 { // + the CLI binary, named by platform
		t.Errorf("files %v", files)
	}
	// Every file is in SHA256SUMS with its real sum.
	f, err := os.Open(filepath.Join(out, sumsName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	summed := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		sum, name, ok := strings.Cut(s.Text(), "  ")
		if !ok {
			t.Fatalf("bad line %q", s.Text())
		}
		got, err := sha256File(filepath.Join(out, name))
		if err != nil || got != sum {
			t.Errorf("%s: sum %s, file %s (%v)", name, sum, got, err)
		}
		summed++
	}
	if summed != len(files)-1 {
		t.Errorf("%d files summed, want %d", summed, len(files)-1)
	}
	// The clusterctl components and the packaged chart name the image by its digest.
	components, err := os.ReadFile(filepath.Join(out, "addon-components.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(components), ref+"@"+digest) {
		t.Errorf("addon-components.yaml does not pin %s@%s", ref, digest)
	}
	ch, err := loader.Load(filepath.Join(out, "capc-health-shim-"+b.version+".tgz"))
	if err != nil {
		t.Fatalf("helm cannot load the packaged chart: %v", err)
	}
	image, _ := ch.Values["image"].(map[string]interface{})
	if image["digest"] != digest {
		t.Errorf("chart image values %v, want digest %s", image, digest)
	}
	notes, err := os.ReadFile(filepath.Join(out, "CHANGELOG-"+v+".md"))
	if err != nil || !strings.HasPrefix(string(notes), "## "+b.version) {
		t.Errorf("changelog entry %q (%v)", notes, err)
	}
}

func TestDistRefusesAVersionWithoutAChangelogEntryOrAnImage(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "CHANGELOG.md")
	text := "# Changelog\n\n## 0.2.0\n\n- two\n\n## [v0.1.0] - 2026-12-01\n\n- one\n"
	if err := os.WriteFile(log, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := changelogEntry(log, "0.1.0"); err != nil || e != "## [v0.1.0] - 2026-12-01\n\n- one\n" {
		t.Errorf("0.1.0: %q %v", e, err)
	}
	if e, err := changelogEntry(log, "0.2.0"); err != nil || !strings.HasSuffix(e, "- two\n") || strings.Contains(e, "one") {
		t.Errorf("0.2.0: %q %v", e, err)
	}
	if _, err := changelogEntry(log, "0.3.0"); err == nil || !strings.Contains(err.Error(), "no entry for 0.3.0") {
		t.Errorf("0.3.0: %v", err)
	}
	b, err := loadBase(defaultRoot())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := makeDist(b, t.TempDir(), "", t.TempDir()); err == nil || !strings.Contains(err.Error(), "make image") {
		t.Errorf("without make image's output: %v", err)
	}
}
