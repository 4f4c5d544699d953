package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// buildRecipe is part of the cache key (with tools/go.mod minus comments, tools/go.sum and the
// Go version): bump it when the way the binaries are built changes.
const buildRecipe = "v1: CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -X version'"

type binaries struct {
	dir, etcd, apiserver string
}

// ensureBinaries returns the cached etcd and kube-apiserver for the pins in toolsDir,
// building them first if this pin set was never built on this machine.
func ensureBinaries(ctx context.Context, toolsDir, cacheRoot string) (binaries, error) {
	gomod, err := os.ReadFile(filepath.Join(toolsDir, "go.mod"))
	if err != nil {
		return binaries{}, fmt.Errorf("read tools module: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(toolsDir, "go.sum"))
	if err != nil {
		return binaries{}, fmt.Errorf("read tools module: %w", err)
	}
	goVersion, err := goEnv(ctx, toolsDir, "GOVERSION", "GOOS", "GOARCH")
	if err != nil {
		return binaries{}, err
	}
	kubeVersion := requiredVersion(gomod, "k8s.io/kubernetes")
	etcdVersion := requiredVersion(gomod, "go.etcd.io/etcd/server/v3")
	if kubeVersion == "" || etcdVersion == "" {
		return binaries{}, fmt.Errorf("%s/go.mod must require k8s.io/kubernetes and go.etcd.io/etcd/server/v3", toolsDir)
	}

	h := sha256.New()
	for _, part := range [][]byte{[]byte(buildRecipe), []byte(goVersion), normalizeGoMod(gomod), gosum} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	root := filepath.Join(cacheRoot, key)
	b := binaries{
		dir:       filepath.Join(root, "bin"),
		etcd:      filepath.Join(root, "bin", "etcd"),
		apiserver: filepath.Join(root, "bin", "kube-apiserver"),
	}
	if complete(b) {
		logf("using cached kube-apiserver %s + etcd %s from %s", kubeVersion, etcdVersion, b.dir)
		return b, nil
	}

	// One build per pin set at a time (parallel test processes may all start here).
	if err := os.MkdirAll(root, 0o755); err != nil {
		return b, err
	}
	lock, err := os.OpenFile(filepath.Join(root, "build.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return b, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("another process is building %s; waiting for it", root)
		if err := flockCtx(ctx, lock); err != nil {
			return b, err
		}
	}
	if complete(b) {
		return b, nil
	}

	tmp := filepath.Join(root, "bin.tmp")
	os.RemoveAll(tmp)
	os.RemoveAll(b.dir)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return b, err
	}
	buildLog := filepath.Join(root, "build.log")
	logf("building kube-apiserver %s and etcd %s with %s (first use of these pins; several minutes on 2 cores); log: %s",
		kubeVersion, etcdVersion, strings.Fields(goVersion)[0], buildLog)
	started := time.Now()

	major, minor := kubeMajorMinor(kubeVersion)
	ldflags := []string{"-s", "-w"}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ldflags = append(ldflags,
			"-X", pkg+".gitVersion="+kubeVersion,
			"-X", pkg+".gitMajor="+major,
			"-X", pkg+".gitMinor="+minor,
			"-X", pkg+".gitTreeState=clean",
			"-X", pkg+".buildDate=1970-01-01T00:00:00Z")
	}
	// Both main packages in one `go build` so the compiler's parallelism spans both.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", strings.Join(ldflags, " "),
		"-o", tmp+"/", "k8s.io/kubernetes/cmd/kube-apiserver", "go.etcd.io/etcd/server/v3")
	cmd.Dir = toolsDir
	cmd.Env = append(os.Environ(), modFlags(), "GOWORK=off", "CGO_ENABLED=0")
	logFile, err := os.Create(buildLog)
	if err != nil {
		return b, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	err = cmd.Run()
	logFile.Close()
	if err != nil {
		return b, fmt.Errorf("go build in %s failed (%v); log: %s\n%s", toolsDir, err, buildLog, tail(buildLog, 30))
	}
	// etcd's main package is the module root go.etcd.io/etcd/server/v3, so go build names it "v3"
	// or "server" depending on the Go version: rename whatever is not kube-apiserver.
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if e.Name() != "kube-apiserver" {
			if err := os.Rename(filepath.Join(tmp, e.Name()), filepath.Join(tmp, "etcd")); err != nil {
				return b, err
			}
		}
	}
	pins := fmt.Sprintf("k8s.io/kubernetes %s\ngo.etcd.io/etcd/server/v3 %s\n%s\nrecipe %s\nbuilt %s in %s\n",
		kubeVersion, etcdVersion, goVersion, buildRecipe, time.Now().UTC().Format(time.RFC3339), time.Since(started).Round(time.Second))
	if err := os.WriteFile(filepath.Join(tmp, "PINS"), []byte(pins), 0o644); err != nil {
		return b, err
	}
	if err := os.Rename(tmp, b.dir); err != nil {
		return b, err
	}
	if !complete(b) {
		return b, fmt.Errorf("build finished but %s lacks etcd or kube-apiserver; log: %s", b.dir, buildLog)
	}
	logf("built in %s: %s", time.Since(started).Round(time.Second), b.dir)
	return b, nil
}

func complete(b binaries) bool {
	for _, p := range []string{b.etcd, b.apiserver, filepath.Join(b.dir, "PINS")} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			return false
		}
	}
	return true
}

func flockCtx(ctx context.Context, f *os.File) error {
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return nil
		} else if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func goEnv(ctx context.Context, dir string, names ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"env"}, names...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), modFlags(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env: %w (is Go installed?)", err)
	}
	return strings.Join(strings.Fields(string(out)), " "), nil
}

// normalizeGoMod drops comments (incl. "// indirect") and blank lines, so editing a comment in
// tools/go.mod does not invalidate the cached binaries.
func normalizeGoMod(gomod []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(gomod), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// requiredVersion finds "<module> <version>" in a go.mod's require lines.
func requiredVersion(gomod []byte, module string) string {
	sc := bufio.NewScanner(strings.NewReader(string(gomod)))
	inReplace := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "replace"):
			inReplace = strings.HasSuffix(line, "(")
			continue
		case line == ")":
			inReplace = false
			continue
		}
		if inReplace {
			continue
		}
		line = strings.TrimPrefix(line, "require ")
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return ""
}

func kubeMajorMinor(v string) (string, string) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "1", "0"
	}
	return parts[0], parts[1]
}

// modFlags is GOFLAGS for the go commands this runner starts: modules from go.mod, plus whatever
// the caller's GOFLAGS asks for (CI passes -modcacherw so its fresh module cache can be deleted).
func modFlags() string {
	return strings.TrimSpace("GOFLAGS=-mod=mod " + os.Getenv("GOFLAGS"))
}
