package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"io"
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
		"capc-health-shim-" + v + "-kustomize.tar.gz",
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
	// The kustomize tree, extracted: base builds with the image pinned (and nothing else
	// changed), the namespaced-secrets component on it, and the examples that refer to both.
	tree := extractTarGz(t, filepath.Join(out, "capc-health-shim-"+v+"-kustomize.tar.gz"))
	top := filepath.Join(tree, kustomizeTop)
	for _, d := range []string{"base", "components/namespaced-secrets", "components/monitoring", "examples", "optional"} {
		if st, err := os.Stat(filepath.Join(top, d)); err != nil || !st.IsDir() {
			t.Errorf("the kustomize archive has no %s/ (%v)", d, err)
		}
	}
	built, err := kustomizeBuild(filepath.Join(top, "base"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(built), "image: "+ref+"@"+digest+"\n") {
		t.Errorf("the archive's base does not pin %s@%s", ref, digest)
	}
	orig, err := kustomizeBuild(filepath.Join(defaultRoot(), "deploy", "base"), nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := loadBase(defaultRoot()) // b is pinned by now
	if err != nil {
		t.Fatal(err)
	}
	unpinned, _ := baseImage(fresh)
	if strings.Replace(string(orig), "image: "+unpinned+"\n", "image: "+ref+"@"+digest+"\n", 1) != string(built) {
		t.Errorf("the archive's base differs from deploy/base in more than the image")
	}
	withSecrets, err := kustomizeBuild(filepath.Join(top, "base"), []string{filepath.Join(top, "components", "namespaced-secrets")})
	if err != nil {
		t.Fatalf("base + namespaced-secrets from the archive: %v", err)
	}
	if !strings.Contains(string(withSecrets), ref+"@"+digest) {
		t.Errorf("base + namespaced-secrets does not pin the image")
	}
	if _, err := kustomizeBuild(filepath.Join(top, "examples", "namespaced-secrets"), nil); err != nil {
		t.Errorf("examples/namespaced-secrets from the archive: %v", err)
	}
	// The same commit gives the same archive.
	again := t.TempDir()
	if _, err := makeDist(fresh, imageDir, ref, again); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"capc-health-shim-" + v + "-kustomize.tar.gz"} {
		s1, _ := sha256File(filepath.Join(out, f))
		s2, _ := sha256File(filepath.Join(again, f))
		if s1 != s2 {
			t.Errorf("%s differs between two dists of one commit", f)
		}
	}
	notes, err := os.ReadFile(filepath.Join(out, "CHANGELOG-"+v+".md"))
	if err != nil || !strings.HasPrefix(string(notes), "## "+b.version) {
		t.Errorf("changelog entry %q (%v)", notes, err)
	}
}

// extractTarGz unpacks a .tar.gz into a new directory (refusing paths that leave it).
func extractTarGz(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("%s leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: entry type %c", h.Name, h.Typeflag)
		}
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
