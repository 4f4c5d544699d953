package main

// make dist: what a maintainer attaches to a release, in one flat directory — the image
// (OCI archive, digest, SBOM) as make image built it, the clusterctl files and the Helm chart
// with the image pinned to that digest, the chart packaged as `helm install` takes it, the CLI
// binary, deploy/'s kustomize tree (base, components, examples) with the same pin as a .tar.gz,
// the version's CHANGELOG entry, and SHA256SUMS over all of it.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

// sumsName is the checksum file, in the format `sha256sum -c` reads.
const sumsName = "SHA256SUMS"

// makeDist writes the bundle of version b.version into out (emptied first), from imageDir
// (what make image wrote: archive, digest, SBOM and the binary it was built from). ref names
// the image the files are pinned to (default: the base's image reference).
func makeDist(b *base, imageDir, ref, out string) ([]string, error) {
	digest, err := readDigest(filepath.Join(imageDir, digestName))
	if err != nil {
		return nil, err
	}
	unpinned, err := baseImage(b)
	if err != nil {
		return nil, err
	}
	if ref == "" {
		ref = unpinned
	}
	notes, err := changelogEntry(filepath.Join(b.root, "CHANGELOG.md"), b.version)
	if err != nil {
		return nil, err
	}
	if err := pinImage(b, ref, digest); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	v := "v" + b.version
	copies := map[string]string{
		archiveName: fmt.Sprintf("capc-health-shim-%s-oci.tar", v),
		digestName:  fmt.Sprintf("capc-health-shim-%s-image-digest", v),
		sbomName:    fmt.Sprintf("capc-health-shim-%s.cdx.json", v),
		// The binary the image holds: the CLI for the operator's machine of the same platform.
		"capc-health-shim": fmt.Sprintf("capc-health-shim-%s-%s-%s", v, runtime.GOOS, runtime.GOARCH),
	}
	for from, to := range copies {
		if err := copyFile(filepath.Join(imageDir, from), filepath.Join(out, to)); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(out, copies["capc-health-shim"]), 0o755); err != nil {
		return nil, err
	}
	// clusterctl's two release assets, flat as a release publishes them.
	repo, err := os.MkdirTemp("", "dist-repository-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(repo)
	components, err := writeRepository(b, repo)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{components, filepath.Join(filepath.Dir(components), "metadata.yaml")} {
		if err := copyFile(f, filepath.Join(out, filepath.Base(f))); err != nil {
			return nil, err
		}
	}
	// The chart, pinned, packaged by Helm's own library (what `helm package` writes).
	chartDir, err := os.MkdirTemp("", "dist-chart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(chartDir)
	if err := writeChart(b, filepath.Join(chartDir, chartName)); err != nil {
		return nil, err
	}
	ch, err := loader.Load(filepath.Join(chartDir, chartName))
	if err != nil {
		return nil, fmt.Errorf("load the generated chart: %w", err)
	}
	if _, err := chartutil.Save(ch, out); err != nil {
		return nil, fmt.Errorf("package the chart: %w", err)
	}
	// deploy/'s kustomize tree, the base's image pinned to the digest too.
	_, when, _, err := gitRevision(b.root)
	if err != nil {
		return nil, err
	}
	if err := kustomizeArchive(b.root, unpinned, ref+"@"+digest, filepath.Join(out, kustomizeArchiveName(v)), when); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("CHANGELOG-%s.md", v)), []byte(notes), 0o644); err != nil {
		return nil, err
	}
	return writeSums(out)
}

// kustomizeArchiveName is the kustomize tree's file in the bundle of version v (v0.1.0).
func kustomizeArchiveName(v string) string {
	return fmt.Sprintf("capc-health-shim-%s-kustomize.tar.gz", v)
}

// baseImage is the image the base's Deployment names.
func baseImage(b *base) (string, error) {
	_, c, err := b.manager()
	if err != nil {
		return "", err
	}
	n, err := c.Pipe(kyaml.Lookup("image"))
	if err != nil || n == nil {
		return "", fmt.Errorf("the %s container has no image", managerContainer)
	}
	return n.YNode().Value, nil
}

var versionHeading = regexp.MustCompile(`^## \[?v?([0-9]+\.[0-9]+\.[0-9]+[^\]\s]*)\]?`)

// changelogEntry is the section `## <version>` (or `## [v<version>]`, with anything after it
// on the line, such as a date) of CHANGELOG.md, heading included; a release without an entry
// is refused.
func changelogEntry(path, version string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("the changelog: %w", err)
	}
	defer f.Close()
	var entry []string
	in := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if m := versionHeading.FindStringSubmatch(line); m != nil {
			if in {
				break
			}
			in = m[1] == version
		}
		if in {
			entry = append(entry, line)
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	text := strings.TrimSpace(strings.Join(entry, "\n"))
	if text == "" || len(entry) < 2 {
		return "", fmt.Errorf("%s has no entry for %s: add `## %s` with what changed", path, version, version)
	}
	return text + "\n", nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("%s (run make image first): %w", from, err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeSums writes SHA256SUMS over every other file of dir; the files, sorted.
func writeSums(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && e.Name() != sumsName {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, n := range names {
		sum, err := sha256File(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&sb, "%s  %s\n", sum, n)
	}
	if err := os.WriteFile(filepath.Join(dir, sumsName), []byte(sb.String()), 0o644); err != nil {
		return nil, err
	}
	return append(names, sumsName), nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
