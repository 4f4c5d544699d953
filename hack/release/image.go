package main

// make image: the container image of the release binary, built without a container daemon and
// without a base image. go-containerregistry assembles the image (layer, config, manifest, OCI
// layout); this file decides what goes into the root filesystem and keeps every byte of it a
// function of the commit, so that the same commit gives the same digest.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

const (
	// imageUser is the numeric user and group the image runs as (the Deployment's runAsUser).
	imageUser = 65532
	// imageEntrypoint is where the binary lives in the image.
	imageEntrypoint = "/capc-health-shim"
	// imagePort is the listener of /status, /metrics, /healthz, /readyz (--status-addr).
	imagePort = "8443/tcp"
	// caBundlePath is the first place rustls-native-certs (via openssl-probe) looks when neither
	// SSL_CERT_FILE nor SSL_CERT_DIR is set; the chart's extraCA adds /etc/ssl/certs to SSL_CERT_DIR.
	caBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	imageSource  = "https://github.com/capc-health-shim/capc-health-shim"
	// archiveName and digestName are the files make image writes under target/image/.
	archiveName = "capc-health-shim-oci.tar"
	digestName  = "digest"
	sbomName    = "capc-health-shim.cdx.json"
	// layoutDirName is the same OCI layout as the archive, unpacked.
	layoutDirName = "oci"
)

// libraryDirs are searched, in order, for a shared library the binary needs (the multiarch
// directories of Debian and Ubuntu first, then the classic ones).
var libraryDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// imageFile is one regular file of the root filesystem.
type imageFile struct {
	Path   string // absolute, in the image
	Mode   int64
	Data   []byte
	Origin string // where it came from, for the SBOM and the log
}

// imageInputs is what identifies a build: the same inputs give the same digest.
type imageInputs struct {
	Binary   string    // the release binary
	Ref      string    // the reference the image is named by, e.g. ghcr.io/x/capc-health-shim:v0.1.0
	Version  string    // the workspace version, without v
	Revision string    // the commit
	Created  time.Time // the commit's time (SOURCE_DATE_EPOCH): every timestamp in the image
	License  string
	Dirty    bool // the work tree differs from Revision
}

// neededLibraries returns the program interpreter and every shared library the ELF file needs,
// directly or through another library, resolved with find (soname → host path). A statically
// linked file gives "" and none.
func neededLibraries(binary string, find func(soname string) (string, error)) (interp string, libs map[string]string, err error) {
	f, err := elf.Open(binary)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", nil, fmt.Errorf("%s: reading PT_INTERP: %w", binary, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	libs = map[string]string{}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("%s: DT_NEEDED: %w", binary, err)
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if _, done := libs[name]; done || path.Base(interp) == name {
			continue
		}
		host, err := find(name)
		if err != nil {
			return "", nil, err
		}
		libs[name] = host
		lf, err := elf.Open(host)
		if err != nil {
			return "", nil, err
		}
		more, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return "", nil, fmt.Errorf("%s: DT_NEEDED: %w", host, err)
		}
		queue = append(queue, more...)
	}
	return interp, libs, nil
}

// findLibrary looks for a soname in libraryDirs.
func findLibrary(soname string) (string, error) {
	for _, dir := range libraryDirs {
		p := filepath.Join(dir, soname)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s: not found in %s", soname, strings.Join(libraryDirs, ", "))
}

// caBundle is Mozilla's root store as the Go module golang.org/x/crypto/x509roots/fallback pins
// it (so the bundle is a function of go.sum, not of the build machine), as one PEM file. Roots
// that carry a distrust-after constraint are left out: a PEM bundle cannot say so, and trusting
// them without it would trust more than NSS does.
func caBundle() (data []byte, count int) {
	var buf bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})
		count++
	}
	return buf.Bytes(), count
}

// accountFiles are /etc/passwd and /etc/group: root and the user the image runs as, with no
// login shell (the image has none).
func accountFiles() []imageFile {
	u := strconv.Itoa(imageUser)
	return []imageFile{
		{Path: "/etc/passwd", Mode: 0o644, Origin: "written by hack/release",
			Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + u + ":" + u + ":nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Origin: "written by hack/release",
			Data: []byte("root:x:0:\nnonroot:x:" + u + ":\n")},
	}
}

// rootFilesystem lists every file of the image: the binary, the interpreter and shared libraries
// it needs (copied from the build machine, at the paths the dynamic loader looks in), the CA
// bundle and the account files. Nothing else: no shell, no package manager.
func rootFilesystem(binary string) ([]imageFile, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	files := []imageFile{{Path: imageEntrypoint, Mode: 0o755, Data: bin, Origin: binary}}
	interp, libs, err := neededLibraries(binary, findLibrary)
	if err != nil {
		return nil, err
	}
	add := func(imagePath, host string) error {
		data, err := os.ReadFile(host) // follows symlinks: the image holds the file itself
		if err != nil {
			return err
		}
		files = append(files, imageFile{Path: imagePath, Mode: 0o755, Data: data, Origin: host})
		return nil
	}
	if interp != "" {
		if err := add(interp, interp); err != nil {
			return nil, err
		}
	}
	for _, host := range libs {
		// At the directory it was found in: a directory the loader searches by default.
		if err := add(host, host); err != nil {
			return nil, err
		}
	}
	ca, _ := caBundle()
	files = append(files, imageFile{Path: caBundlePath, Mode: 0o644, Data: ca,
		Origin: "golang.org/x/crypto/x509roots/fallback (Mozilla NSS roots)"})
	files = append(files, accountFiles()...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}

// layerTar writes the files, and every directory above them, as a tar with fixed owners (root),
// modes and times, in path order: the same files give the same bytes.
func layerTar(files []imageFile, mtime time.Time) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	type entry struct {
		name string
		file *imageFile
	}
	var entries []entry
	for d := range dirs {
		entries = append(entries, entry{name: strings.TrimPrefix(d, "/") + "/"})
	}
	for i := range files {
		entries = append(entries, entry{name: strings.TrimPrefix(files[i].Path, "/"), file: &files[i]})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, ModTime: mtime, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		if e.file == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, e.file.Mode, int64(len(e.file.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if e.file != nil {
			if _, err := tw.Write(e.file.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// imageConfig is the runtime configuration: what `docker run` / the kubelet start without args.
func imageConfig(in imageInputs) v1.Config {
	return v1.Config{
		Entrypoint:   []string{imageEntrypoint},
		Cmd:          []string{"run"},
		User:         fmt.Sprintf("%d:%d", imageUser, imageUser),
		ExposedPorts: map[string]struct{}{imagePort: {}},
		WorkingDir:   "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":       "capc-health-shim",
			"org.opencontainers.image.description": "CloudStack VM health for Cluster API Machines: signal, never delete",
			"org.opencontainers.image.source":      imageSource,
			"org.opencontainers.image.revision":    in.Revision,
			"org.opencontainers.image.version":     in.Version,
			"org.opencontainers.image.licenses":    in.License,
			"org.opencontainers.image.created":     in.Created.UTC().Format(time.RFC3339),
		},
	}
}

// buildImage assembles the OCI image: one gzip layer of the root filesystem and the config.
func buildImage(in imageInputs, files []imageFile) (v1.Image, error) {
	layerBytes, err := layerTar(files, in.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: in.Created},
		CreatedBy: "make image (hack/release): the release binary, its shared libraries, a CA bundle, /etc/passwd and /etc/group",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: in.Created}
	cf.Config = imageConfig(in)
	return mutate.ConfigFile(img, cf)
}

// writeArchive writes the image as an OCI image layout into dir (what `crane push DIR` reads) and
// the same in a tar (what `skopeo copy oci-archive:` and `kind load image-archive` read), its
// index naming it by ref, with fixed times and owners.
func writeArchive(img v1.Image, ref, dir, archive string, mtime time.Time) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	annotations := map[string]string{"io.containerd.image.name": ref}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		annotations["org.opencontainers.image.ref.name"] = ref[i+1:]
	}
	if err := p.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		return err
	}
	var names []string
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	out, err := os.Create(archive + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(archive + ".tmp")
	tw := tar.NewWriter(out)
	for _, name := range names {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		h := &tar.Header{Name: name, ModTime: mtime, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		if st.IsDir() {
			h.Name, h.Typeflag, h.Mode = name+"/", tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, st.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !st.IsDir() {
			f, err := os.Open(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(archive+".tmp", archive)
}

// gitRevision is the commit of the repository and its time; dirty says whether the work tree
// differs from it (then the image is not that commit's, and make image says so).
func gitRevision(root string) (commit string, when time.Time, dirty bool, err error) {
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%H %ct").Output()
	if err != nil {
		return "", time.Time{}, false, fmt.Errorf("git log in %s: %w", root, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 {
		return "", time.Time{}, false, fmt.Errorf("git log: unexpected %q", out)
	}
	secs, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return "", time.Time{}, false, err
	}
	status, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	if err != nil {
		return "", time.Time{}, false, err
	}
	return fields[0], time.Unix(secs, 0).UTC(), len(bytes.TrimSpace(status)) > 0, nil
}

// makeImage is `release-tool image`: the archive, its digest and the SBOM under out.
func makeImage(root, binary, ref, out string) error {
	in, files, img, err := imageOfCheckout(root, binary, ref)
	if err != nil {
		return err
	}
	if in.Dirty {
		fmt.Fprintln(os.Stderr, "image: the work tree has uncommitted changes: the image is not commit "+in.Revision+"'s")
	}
	ref, when := in.Ref, in.Created
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	archive := filepath.Join(out, archiveName)
	if err := writeArchive(img, ref, filepath.Join(out, layoutDirName), archive, when); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, digestName), []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	sbom, err := imageSBOM(root, in, digest.String(), files)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, sbomName), sbom, 0o644); err != nil {
		return err
	}
	st, err := os.Stat(archive)
	if err != nil {
		return err
	}
	fmt.Printf("image %s@%s\n", ref, digest)
	fmt.Printf("  %s (%.1f MiB), %s, %s\n", archive, float64(st.Size())/(1<<20), filepath.Join(out, digestName), filepath.Join(out, sbomName))
	for _, f := range files {
		fmt.Printf("  %-45s %9d bytes  from %s\n", f.Path, len(f.Data), f.Origin)
	}
	return nil
}

// imageOfCheckout is the image of the binary built from the repository's checked-out commit.
func imageOfCheckout(root, binary, ref string) (imageInputs, []imageFile, v1.Image, error) {
	version, err := workspaceVersion(root)
	if err != nil {
		return imageInputs{}, nil, nil, err
	}
	commit, when, dirty, err := gitRevision(root)
	if err != nil {
		return imageInputs{}, nil, nil, err
	}
	if ref == "" {
		ref = defaultImageRef(version)
	}
	in := imageInputs{Binary: binary, Ref: ref, Version: version, Revision: commit, Created: when, License: "Apache-2.0", Dirty: dirty}
	files, err := rootFilesystem(binary)
	if err != nil {
		return in, nil, nil, err
	}
	img, err := buildImage(in, files)
	return in, files, img, err
}

// defaultImageRef is the reference the base's Deployment names.
func defaultImageRef(version string) string {
	return "ghcr.io/capc-health-shim/capc-health-shim:v" + version
}
