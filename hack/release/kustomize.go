package main

// The kustomize form of a release: deploy/'s kustomize tree (base/, components/, examples/,
// optional/ and its README.md) as a gzipped tar for make dist, with the base's image pinned to the
// bundle's digest, so that `kubectl apply -k <dir>/base` installs exactly the image the bundle
// holds and the components and examples keep working relative to it.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// kustomizeDirs are the parts of deploy/ the archive holds, under kustomizeTop.
var kustomizeDirs = []string{"base", "components", "examples", "optional", "README.md"}

// kustomizeTop is the archive's one top directory.
const kustomizeTop = "capc-health-shim-kustomize"

// kustomizeArchive writes deploy/'s kustomize tree as a .tar.gz to path, the base Deployment's
// image `from` (exactly once in deploy/base/deployment.yaml) replaced by `to`; every entry
// dated mtime, in sorted order, so the same commit gives the same bytes.
func kustomizeArchive(root, from, to, path string, mtime time.Time) error {
	deploy := filepath.Join(root, "deploy")
	type entry struct {
		name string
		dir  bool
		data []byte
	}
	entries := []entry{{name: kustomizeTop + "/", dir: true}}
	pinned := 0
	for _, top := range kustomizeDirs {
		err := filepath.WalkDir(filepath.Join(deploy, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(deploy, p)
			if err != nil {
				return err
			}
			name := kustomizeTop + "/" + filepath.ToSlash(rel)
			if d.IsDir() {
				entries = append(entries, entry{name: name + "/", dir: true})
				return nil
			}
			if !d.Type().IsRegular() {
				return fmt.Errorf("%s: not a regular file", p)
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if rel == filepath.Join("base", "deployment.yaml") {
				line := "image: " + from + "\n"
				if n := strings.Count(string(data), line); n != 1 {
					return fmt.Errorf("%s names %q %d times, want once", p, strings.TrimSpace(line), n)
				}
				data = []byte(strings.Replace(string(data), line, "image: "+to+"\n", 1))
				pinned++
			}
			entries = append(entries, entry{name: name, data: data})
			return nil
		})
		if err != nil {
			return fmt.Errorf("the kustomize tree: %w", err)
		}
	}
	if pinned != 1 {
		return fmt.Errorf("the kustomize tree: deploy/base/deployment.yaml not found")
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	gz.ModTime = mtime
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	for _, e := range entries {
		if e.dir {
			if dirs[e.name] {
				continue
			}
			dirs[e.name] = true
		}
		h := &tar.Header{Name: e.name, ModTime: mtime, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		if e.dir {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
