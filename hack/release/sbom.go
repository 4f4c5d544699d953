package main

// The image's software bill of materials (CycloneDX JSON, written next to the archive): the
// Rust crates compiled into the binary — the closure of capc-health-shim's normal dependencies
// in the locked graph (`cargo metadata --locked`), with their licences and Cargo.lock
// checksums — and the other files of the image (shared libraries, CA bundle, account files)
// with their SHA-256.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"time"

	"github.com/BurntSushi/toml"
	cdx "github.com/CycloneDX/cyclonedx-go"
)

// cargoMetadata is the part of `cargo metadata --format-version 1` the SBOM reads.
type cargoMetadata struct {
	Packages []struct {
		ID      string  `json:"id"`
		Name    string  `json:"name"`
		Version string  `json:"version"`
		License *string `json:"license"`
		Source  *string `json:"source"`
	} `json:"packages"`
	Resolve struct {
		Nodes []struct {
			ID   string `json:"id"`
			Deps []struct {
				Pkg      string `json:"pkg"`
				DepKinds []struct {
					Kind *string `json:"kind"`
				} `json:"dep_kinds"`
			} `json:"deps"`
		} `json:"nodes"`
	} `json:"resolve"`
}

// crateDeps is the locked graph reduced to what the binary links: from the root package, the
// dependencies of kind "normal" (not dev, not build), transitively. It returns the reachable
// package ids and, per id, the ids it depends on.
func crateDeps(m *cargoMetadata, rootName string) (reach []string, edges map[string][]string, err error) {
	var rootID string
	for _, p := range m.Packages {
		if p.Name == rootName && p.Source == nil {
			rootID = p.ID
		}
	}
	if rootID == "" {
		return nil, nil, fmt.Errorf("cargo metadata: no workspace package %q", rootName)
	}
	normal := map[string][]string{}
	for _, n := range m.Resolve.Nodes {
		for _, d := range n.Deps {
			for _, k := range d.DepKinds {
				if k.Kind == nil {
					normal[n.ID] = append(normal[n.ID], d.Pkg)
					break
				}
			}
		}
	}
	seen := map[string]bool{rootID: true}
	queue := []string{rootID}
	edges = map[string][]string{}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		reach = append(reach, id)
		for _, d := range normal[id] {
			edges[id] = append(edges[id], d)
			if !seen[d] {
				seen[d] = true
				queue = append(queue, d)
			}
		}
	}
	sort.Strings(reach)
	return reach, edges, nil
}

// lockChecksums is name@version → the registry checksum in Cargo.lock.
func lockChecksums(root string) (map[string]string, error) {
	var lock struct {
		Package []struct {
			Name     string `toml:"name"`
			Version  string `toml:"version"`
			Checksum string `toml:"checksum"`
		} `toml:"package"`
	}
	if _, err := toml.DecodeFile(filepath.Join(root, "Cargo.lock"), &lock); err != nil {
		return nil, fmt.Errorf("Cargo.lock: %w", err)
	}
	out := map[string]string{}
	for _, p := range lock.Package {
		if p.Checksum != "" {
			out[p.Name+"@"+p.Version] = p.Checksum
		}
	}
	return out, nil
}

// imageSBOM builds the CycloneDX document of the image. Everything in it is a function of the
// commit and the image (no clock, no random serial number): the same image, the same SBOM.
func imageSBOM(root string, in imageInputs, digest string, files []imageFile) ([]byte, error) {
	cmd := exec.Command("cargo", "metadata", "--format-version", "1", "--locked",
		"--filter-platform", "x86_64-unknown-linux-gnu", "--manifest-path", filepath.Join(root, "Cargo.toml"))
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("cargo metadata: %w", err)
	}
	var meta cargoMetadata
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, fmt.Errorf("cargo metadata: %w", err)
	}
	checksums, err := lockChecksums(root)
	if err != nil {
		return nil, err
	}
	return sbomDocument(&meta, checksums, in, digest, files)
}

// sbomDocument is imageSBOM without the I/O.
func sbomDocument(meta *cargoMetadata, checksums map[string]string, in imageInputs, digest string, files []imageFile) ([]byte, error) {
	reach, edges, err := crateDeps(meta, "capc-health-shim")
	if err != nil {
		return nil, err
	}
	byID := map[string]int{}
	for i, p := range meta.Packages {
		byID[p.ID] = i
	}
	ref := func(id string) string {
		p := meta.Packages[byID[id]]
		return "pkg:cargo/" + p.Name + "@" + p.Version
	}
	imageRef := "pkg:oci/capc-health-shim@" + digest
	var comps []cdx.Component
	var deps []cdx.Dependency
	imageDeps := []string{}
	for _, id := range reach {
		p := meta.Packages[byID[id]]
		c := cdx.Component{BOMRef: ref(id), Type: cdx.ComponentTypeLibrary, Name: p.Name, Version: p.Version, PackageURL: ref(id)}
		if p.Source == nil {
			c.Type = cdx.ComponentTypeApplication
			if p.Name == "capc-health-shim" {
				imageDeps = append(imageDeps, c.BOMRef)
				c.Properties = &[]cdx.Property{{Name: "capc-health-shim:revision", Value: in.Revision}}
			}
		}
		if p.License != nil {
			c.Licenses = &cdx.Licenses{{Expression: *p.License}}
		}
		if sum, ok := checksums[p.Name+"@"+p.Version]; ok {
			c.Hashes = &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}}
		}
		comps = append(comps, c)
		if ds := edges[id]; len(ds) > 0 {
			refs := make([]string, 0, len(ds))
			for _, d := range ds {
				refs = append(refs, ref(d))
			}
			sort.Strings(refs)
			deps = append(deps, cdx.Dependency{Ref: ref(id), Dependencies: &refs})
		}
	}
	for _, f := range files {
		if f.Path == imageEntrypoint {
			continue // the capc-health-shim application above
		}
		sum := sha256.Sum256(f.Data)
		c := cdx.Component{BOMRef: "file:" + f.Path, Type: cdx.ComponentTypeFile, Name: path.Base(f.Path),
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex.EncodeToString(sum[:])}},
			Properties: &[]cdx.Property{{Name: "capc-health-shim:image-path", Value: f.Path}, {Name: "capc-health-shim:origin", Value: f.Origin}}}
		comps = append(comps, c)
		imageDeps = append(imageDeps, c.BOMRef)
	}
	sort.Strings(imageDeps)
	deps = append([]cdx.Dependency{{Ref: imageRef, Dependencies: &imageDeps}}, deps...)
	bom := cdx.NewBOM()
	// A serial number derived from the digest: one image, one SBOM identity.
	h := sha256.Sum256([]byte(digest))
	bom.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
	bom.Metadata = &cdx.Metadata{
		Timestamp: in.Created.UTC().Format(time.RFC3339),
		Component: &cdx.Component{BOMRef: imageRef, Type: cdx.ComponentTypeContainer, Name: "capc-health-shim",
			Version: in.Version, PackageURL: imageRef, Licenses: &cdx.Licenses{{Expression: in.License}}},
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{Type: cdx.ComponentTypeApplication, Name: "capc-health-shim hack/release"}}},
	}
	bom.Components = &comps
	bom.Dependencies = &deps
	var buf bytes.Buffer
	// 1.6: the newest version most SBOM tools read today.
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).SetPretty(true).EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
