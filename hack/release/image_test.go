package main

// The image's pieces without building the binary: the root filesystem's layer and the image are
// a function of their inputs (same inputs, same digest; another time or file, another digest),
// the shared-library closure of a real ELF file, the SBOM's crate closure, and the release
// files pinned to a digest through clusterctl's and Helm's libraries. make test-image runs the
// built image itself (imagetest.go).

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testFiles() []imageFile {
	files := append(accountFiles(),
		imageFile{Path: imageEntrypoint, Mode: 0o755, Data: []byte("\x7fELF not really"), Origin: "test"},
		imageFile{Path: "/lib/x86_64-linux-gnu/libc.so.6", Mode: 0o755, Data: []byte("libc"), Origin: "test"})
	return files
}

func testInputs() imageInputs {
	return imageInputs{Ref: "example.com/shim:v1", Version: "1.0.0", Revision: strings.Repeat("a", 40),
		Created: time.Unix(1_700_000_000, 0).UTC(), License: "Apache-2.0"}
}

func digestOf(t *testing.T, in imageInputs, files []imageFile) string {
	t.Helper()
	img, err := buildImage(in, files)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestTheImageIsAFunctionOfItsInputs(t *testing.T) {
	in := testInputs()
	first := digestOf(t, in, testFiles())
	if again := digestOf(t, in, testFiles()); again != first {
		t.Fatalf("same inputs, digests %s and %s", first, again)
	}
	// The archive too: two writes, the same bytes.
	img, err := buildImage(in, testFiles())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	for _, p := range []string{a, b} {
		if err := writeArchive(img, in.Ref, p+".d", p, in.Created); err != nil {
			t.Fatal(err)
		}
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if len(ab) == 0 || string(ab) != string(bb) {
		t.Fatalf("two archives of one image differ (%d and %d bytes)", len(ab), len(bb))
	}
	later := in
	later.Created = in.Created.Add(time.Second)
	if digestOf(t, later, testFiles()) == first {
		t.Error("another commit time, the same digest: the time is not in the image")
	}
	changed := testFiles()
	changed[len(changed)-1].Data = []byte("libc, patched")
	if digestOf(t, in, changed) == first {
		t.Error("another file, the same digest")
	}
}

func TestTheImageConfigRunsTheShimAsNonRoot(t *testing.T) {
	img, err := buildImage(testInputs(), testFiles())
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || c.Entrypoint[0] != "/capc-health-shim" || c.Cmd[0] != "run" {
		t.Errorf("config %+v", c)
	}
	if _, ok := c.ExposedPorts["8443/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("exposed ports %v, want 8443/tcp (the --status-addr default)", c.ExposedPorts)
	}
	for _, l := range []string{"source", "revision", "version", "licenses"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("label %s missing", l)
		}
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != "application/vnd.oci.image.config.v1+json" ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("manifest %+v: want OCI media types and one gzip layer", m)
	}
}

// The closure of a real dynamically linked program of this machine: the interpreter and libc
// at least, each found, none twice.
func TestNeededLibrariesOfARealProgram(t *testing.T) {
	interp, libs, err := neededLibraries("/bin/ls", findLibrary)
	if err != nil {
		t.Fatal(err)
	}
	if interp == "" || libs["libc.so.6"] == "" {
		t.Fatalf("interp %q, libs %v: want the loader and libc.so.6", interp, libs)
	}
	if _, _, err := neededLibraries("/bin/ls", func(string) (string, error) { return "", os.ErrNotExist }); err == nil {
		t.Error("a library that cannot be found must fail the build, not be left out")
	}
}

func TestTheCABundleIsMozillasWithoutConstrainedRoots(t *testing.T) {
	data, n := caBundle()
	if n < 100 || strings.Count(string(data), "BEGIN CERTIFICATE") != n {
		t.Fatalf("%d roots in the bundle", n)
	}
}

// The SBOM lists what the binary links: normal dependencies, transitively; not dev- or
// build-only ones.
func TestTheSBOMFollowsNormalDependenciesOnly(t *testing.T) {
	raw := `{"packages":[
	  {"id":"root","name":"capc-health-shim","version":"0.1.0","license":"Apache-2.0","source":null},
	  {"id":"a","name":"tokio","version":"1.0.0","license":"MIT","source":"registry+https://github.com/rust-lang/crates.io-index"},
	  {"id":"b","name":"bytes","version":"1.1.0","license":"MIT","source":"registry+https://github.com/rust-lang/crates.io-index"},
	  {"id":"c","name":"proptest","version":"1.0.0","license":"MIT","source":"registry+https://github.com/rust-lang/crates.io-index"},
	  {"id":"d","name":"cc","version":"1.0.0","license":"MIT","source":"registry+https://github.com/rust-lang/crates.io-index"}],
	 "resolve":{"nodes":[
	  {"id":"root","deps":[{"pkg":"a","dep_kinds":[{"kind":null}]},{"pkg":"c","dep_kinds":[{"kind":"dev"}]},{"pkg":"d","dep_kinds":[{"kind":"build"}]}]},
	  {"id":"a","deps":[{"pkg":"b","dep_kinds":[{"kind":null}]}]},
	  {"id":"b","deps":[]},{"id":"c","deps":[]},{"id":"d","deps":[]}]}}`
	var meta cargoMetadata
	if err := json.Unmarshal([]byte(raw), &meta); err != nil {
		t.Fatal(err)
	}
	doc, err := sbomDocument(&meta, map[string]string{"tokio@1.0.0": strings.Repeat("f", 64)}, testInputs(), "sha256:"+strings.Repeat("0", 64), testFiles())
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for _, want := range []string{`"bomFormat": "CycloneDX"`, `"specVersion": "1.6"`, "pkg:cargo/tokio@1.0.0", "pkg:cargo/bytes@1.1.0", strings.Repeat("f", 64), `"/etc/passwd"`, "2023-11-14T22:13:20Z"} {
		if !strings.Contains(text, want) {
			t.Errorf("SBOM lacks %s", want)
		}
	}
	for _, unwanted := range []string{"proptest", "pkg:cargo/cc@"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("SBOM lists %s, which is not in the binary", unwanted)
		}
	}
	again, _ := sbomDocument(&meta, nil, testInputs(), "sha256:"+strings.Repeat("0", 64), testFiles())
	if strings.Contains(string(again), strings.Repeat("f", 64)) || len(again) == 0 {
		t.Error("a checksum from nowhere")
	}
}

// make release-manifests IMAGE=…: clusterctl's default image and the chart's default render name
// repository:tag@digest; a digest that is not one is refused.
func TestReleaseFilesPinnedToTheDigest(t *testing.T) {
	unsetenv(t, imageVar, logVar)
	digest := "sha256:" + strings.Repeat("ab", 32)
	digestFile := filepath.Join(t.TempDir(), "digest")
	if err := os.WriteFile(digestFile, []byte(digest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const ref = "registry.example.com/team/capc-health-shim:v9.9.9"
	b, err := loadPinnedBase(repoRoot(t), ref, digestFile)
	if err != nil {
		t.Fatal(err)
	}
	_, url := writeRepo(t, b)
	comps, err := clusterctlGenerate(context.Background(), url, "v"+b.version, "")
	if err != nil {
		t.Fatal(err)
	}
	y, _ := comps.Yaml()
	if !strings.Contains(string(y), "image: "+ref+"@"+digest) {
		t.Errorf("clusterctl's default image is not %s@%s", ref, digest)
	}
	dir := filepath.Join(t.TempDir(), chartName)
	if err := writeChart(b, dir); err != nil {
		t.Fatal(err)
	}
	text, err := helmTemplate(dir, "capc-health-shim", "ns", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `image: "`+ref+"@"+digest+`"`) {
		t.Errorf("the pinned chart does not render %s@%s", ref, digest)
	}
	// The committed chart takes a digest as a value, and refuses what is not one.
	text, err = helmTemplate(chartDir(t), "capc-health-shim", "ns", nil, []string{"image.digest=" + digest})
	if err != nil || !strings.Contains(text, ":v"+b.version+"@"+digest+`"`) {
		t.Errorf("--set image.digest: %v", err)
	}
	if _, err := helmTemplate(chartDir(t), "capc-health-shim", "ns", nil, []string{"image.digest=latest"}); err == nil {
		t.Error("image.digest=latest accepted")
	}
	if err := os.WriteFile(digestFile, []byte("sha256:short\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadPinnedBase(repoRoot(t), ref, digestFile); err == nil {
		t.Error("a malformed digest file accepted")
	}
	if _, err := loadPinnedBase(repoRoot(t), "no-tag-here", ""); err == nil {
		t.Error("--image without --digest-file accepted")
	}
}

// The Dockerfile cannot be built here (no engine), but what its build stage copies can be
// checked: a directory holding just those files is a workspace cargo accepts, with the lock
// file as it is (--locked), and .dockerignore keeps none of them out.
func TestTheDockerfileCopiesWhatCargoNeeds(t *testing.T) {
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	ignore, _ := os.ReadFile(filepath.Join(root, ".dockerignore"))
	ctx := t.TempDir()
	froms := 0
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "FROM" {
			froms++
		}
		if froms != 1 || f[0] != "COPY" || strings.HasPrefix(f[1], "--") {
			continue
		}
		srcs, dst := f[1:len(f)-1], f[len(f)-1]
		for _, src := range srcs {
			for _, ig := range strings.Split(string(ignore), "\n") {
				ig = strings.TrimSuffix(strings.TrimSpace(ig), "/")
				if ig != "" && !strings.HasPrefix(ig, "#") && (src == ig || strings.HasPrefix(src, ig+"/")) {
					t.Errorf("COPY %s: .dockerignore leaves %s out of the build context", src, ig)
				}
			}
			target := filepath.Join(ctx, dst)
			if strings.HasSuffix(dst, "/") {
				target = filepath.Join(ctx, dst, filepath.Base(src))
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("cp", "-r", filepath.Join(root, src), target).CombinedOutput(); err != nil {
				t.Fatalf("COPY %s: %v: %s", src, err, out)
			}
		}
	}
	cmd := exec.Command("cargo", "metadata", "--locked", "--format-version", "1", "--manifest-path", filepath.Join(ctx, "Cargo.toml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build context is not a workspace cargo accepts: %v\n%s", err, lastLines(string(out), 10))
	}
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
