package main

// make test-image: the image run from its own filesystem. The archive's layers are unpacked
// into a directory, and the image's entrypoint runs there as its user, the root read-only, in a
// mount namespace of its own (unshare + chroot, as root on the test machine): no container
// engine, but the same files, user and configuration a kubelet would use.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// forbiddenInImage are programs an image of ours must not carry: shells and package managers.
var forbiddenInImage = []string{"sh", "bash", "dash", "ash", "zsh", "busybox", "toybox",
	"apt", "apt-get", "dpkg", "apk", "rpm", "yum", "dnf", "microdnf", "pip", "pip3", "python3"}

// Mount points the test (like a container runtime) mounts into the root filesystem.
const (
	testKubeDir = "/var/run/capc-image-test" // the test API server's kubeconfig
	// The seed scenario's CAPC user (cloudstack-fixtures/scenarios/seed.json).
	testAPIKey   = "capi-api-key"
	testSecret   = "capi-secret-key"
	simWaitLimit = 30 * time.Second
)

// imageTest collects what the test saw, for the report, and fails on the first broken promise.
type imageTest struct {
	root, work, rootfs string
	config             v1.Config
	digest             v1.Hash // the digest file's
	ref                string  // the name the archive's index gives the image
	lines              []string
}

func (t *imageTest) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	fmt.Println("test-image: " + line)
	t.lines = append(t.lines, line)
}

func testImage(root, out, binary, simBin, kubeconfig, crane string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("test-image needs root: it mounts the image's files read-only in a mount namespace of its own and chroots there as user %d (run make test as root, or sudo make test-image)", imageUser)
	}
	work, err := os.MkdirTemp("", "capc-image-test-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	t := &imageTest{root: root, work: work, rootfs: filepath.Join(work, "rootfs")}
	steps := []struct {
		name string
		run  func() error
	}{
		{"unpack", func() error { return t.unpack(out) }},
		{"current", func() error { return t.current(out, binary) }},
		{"push", func() error { return t.push(out, crane) }},
		{"contents", t.contents},
		{"version", t.version},
		{"tls", func() error { return t.checkTLS(simBin) }},
		{"run", func() error { return t.runReady(kubeconfig) }},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			return fmt.Errorf("test-image %s: %w", s.name, err)
		}
	}
	report := strings.Join(t.lines, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(out, "test-image.txt"), []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Println("test-image: passed; report in", filepath.Join(out, "test-image.txt"))
	return nil
}

// unpack reads the archive as an OCI layout, finds the image the digest file names, checks its
// configuration and extracts its layers into the root filesystem.
func (t *imageTest) unpack(out string) error {
	want, err := os.ReadFile(filepath.Join(out, digestName))
	if err != nil {
		return err
	}
	digest, err := v1.NewHash(strings.TrimSpace(string(want)))
	if err != nil {
		return fmt.Errorf("digest file: %w", err)
	}
	layoutDir := filepath.Join(t.work, "layout")
	if err := untar(filepath.Join(out, archiveName), layoutDir, false); err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != digest {
		return fmt.Errorf("the archive's index holds %d manifests, want exactly %s", len(im.Manifests), digest)
	}
	t.digest, t.ref = digest, im.Manifests[0].Annotations["io.containerd.image.name"]
	if t.ref == "" {
		return fmt.Errorf("the archive's index does not name the image (io.containerd.image.name)")
	}
	img, err := idx.Image(digest)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	t.config = cf.Config
	c := cf.Config
	revision := c.Labels["org.opencontainers.image.revision"]
	switch {
	case cf.OS != "linux" || cf.Architecture != "amd64":
		return fmt.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	case c.User != fmt.Sprintf("%d:%d", imageUser, imageUser):
		return fmt.Errorf("user %q", c.User)
	case len(c.Entrypoint) != 1 || strings.Join(c.Cmd, " ") != "run":
		return fmt.Errorf("entrypoint %q, cmd %q", c.Entrypoint, c.Cmd)
	case len(c.ExposedPorts) != 1:
		return fmt.Errorf("exposed ports %v", c.ExposedPorts)
	case len(revision) != 40:
		return fmt.Errorf("label revision %q", revision)
	}
	if _, ok := c.ExposedPorts[imagePort]; !ok {
		return fmt.Errorf("exposed ports %v, want %s", c.ExposedPorts, imagePort)
	}
	for _, l := range []string{"source", "version", "licenses"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			return fmt.Errorf("label org.opencontainers.image.%s missing", l)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var compressed int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return err
		}
		compressed += n
	}
	st, err := os.Stat(filepath.Join(out, archiveName))
	if err != nil {
		return err
	}
	t.say("image %s: %d layer(s), %.1f MiB compressed, archive %.1f MiB; user %s, entrypoint %v, cmd %v, port %s, revision %s",
		digest, len(layers), mib(compressed), mib(st.Size()), c.User, c.Entrypoint, c.Cmd, imagePort, revision)
	flat := mutate.Extract(img)
	defer flat.Close()
	return untarReader(flat, t.rootfs, true)
}

// current: the archive is the image of the release binary and the checked-out commit — built
// again here, it has the same digest and the archive the same bytes (a stale target/image, or an
// image that is not a function of its inputs, fails).
func (t *imageTest) current(out, binary string) error {
	_, _, img, err := imageOfCheckout(t.root, binary, t.ref)
	if err != nil {
		return err
	}
	again, err := img.Digest()
	if err != nil {
		return err
	}
	if again != t.digest {
		return fmt.Errorf("built again from %s and the checkout, the image is %s, not %s: make image again", binary, again, t.digest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	archive := filepath.Join(t.work, "again.tar")
	if err := writeArchive(img, t.ref, filepath.Join(t.work, "again"), archive, cf.Created.Time); err != nil {
		return err
	}
	a, err := os.ReadFile(archive)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(out, archiveName))
	if err != nil {
		return err
	}
	if !bytes.Equal(a, b) {
		return fmt.Errorf("built again, the archive differs from %s", archiveName)
	}
	t.say("built again from the binary and the checkout: the same digest and a byte-identical archive (%d bytes)", len(a))
	return nil
}

// push: the layout directory pushed with crane (the command the docs give) to a registry (go-
// containerregistry's, in this process) arrives under its digest, and the registry serves it.
func (t *imageTest) push(out, crane string) error {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/capc-health-shim:v0.1.0"
	run := func(args ...string) (string, error) {
		out, err := exec.Command(crane, args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("crane %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	pushed, err := run("push", filepath.Join(out, layoutDirName), ref)
	if err != nil {
		return err
	}
	got, err := run("digest", ref)
	if err != nil {
		return err
	}
	if !strings.HasSuffix(pushed, "@"+t.digest.String()) || got != t.digest.String() {
		return fmt.Errorf("crane push printed %q and the registry serves %s, want %s", pushed, got, t.digest)
	}
	t.say("crane push %s to a registry: it serves %s as %s", layoutDirName, got, ref)
	return nil
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// contents checks that the root filesystem holds exactly the entrypoint, the libraries its ELF
// file needs (resolved inside the image), the CA bundle and the account files — and so no shell
// or package manager — and reports the unpacked size.
func (t *imageTest) contents() error {
	var files []string
	var total int64
	err := filepath.Walk(t.rootfs, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, t.rootfs), "/")
		for _, bad := range forbiddenInImage {
			if info.Name() == bad {
				return fmt.Errorf("%s is in the image", rel)
			}
		}
		if !info.IsDir() {
			if !info.Mode().IsRegular() {
				return fmt.Errorf("%s: not a regular file (%s)", rel, info.Mode())
			}
			files = append(files, rel)
			total += info.Size()
		}
		return nil
	})
	if err != nil {
		return err
	}
	entry := filepath.Join(t.rootfs, t.config.Entrypoint[0])
	inImage := func(soname string) (string, error) {
		for _, dir := range libraryDirs {
			p := filepath.Join(t.rootfs, dir, soname)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				return p, nil
			}
		}
		return "", fmt.Errorf("%s: needed, not in the image", soname)
	}
	interp, libs, err := neededLibraries(entry, inImage)
	if err != nil {
		return err
	}
	want := []string{t.config.Entrypoint[0], caBundlePath, "/etc/group", "/etc/passwd"}
	if interp != "" {
		want = append(want, interp)
	}
	for _, p := range libs {
		want = append(want, strings.TrimPrefix(p, t.rootfs))
	}
	sort.Strings(want)
	sort.Strings(files)
	if strings.Join(files, " ") != strings.Join(want, " ") {
		return fmt.Errorf("files %v, want exactly %v", files, want)
	}
	pemData, err := os.ReadFile(filepath.Join(t.rootfs, caBundlePath))
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemData) {
		return fmt.Errorf("%s holds no certificate", caBundlePath)
	}
	n := bytes.Count(pemData, []byte("-----BEGIN CERTIFICATE-----"))
	if n < 100 {
		return fmt.Errorf("%s holds %d certificates, a public root store has over 100", caBundlePath, n)
	}
	t.say("%d files, %.1f MiB unpacked: %s; %d CA certificates; no shell or package manager", len(files), mib(total), strings.Join(files, ", "), n)
	// Mount points, as a runtime makes them before it mounts /proc and the volumes.
	for _, d := range []string{"/proc", extraCADir, testKubeDir} {
		if err := os.MkdirAll(filepath.Join(t.rootfs, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// inImage is one start of the entrypoint inside the image.
type inImage struct {
	args  []string
	env   map[string]string
	binds map[string]string // host directory → directory in the image (read-only)
}

// command is the entrypoint with args, in a new mount namespace where the root filesystem is a
// read-only bind mount with /proc and the binds mounted, chrooted there as the image's user,
// with only the image's environment and env.
func (t *imageTest) command(ctx context.Context, r inImage) (*exec.Cmd, error) {
	user := strings.SplitN(t.config.User, ":", 2)
	if len(user) != 2 {
		return nil, fmt.Errorf("user %q is not uid:gid", t.config.User)
	}
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	script := []string{
		"R=" + q(t.rootfs),
		`mount --bind "$R" "$R"`,
		`mount -o remount,bind,ro "$R"`,
		`mount -t proc proc "$R/proc"`,
	}
	hosts := make([]string, 0, len(r.binds))
	for h := range r.binds {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		dst := `"$R"` + q(r.binds[h])
		script = append(script, "mount --bind "+q(h)+" "+dst, "mount -o remount,bind,ro "+dst)
	}
	script = append(script, `exec "$@"`)
	envBin, err := exec.LookPath("env")
	if err != nil {
		return nil, err
	}
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		return nil, err
	}
	args := []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-ec", strings.Join(script, "\n"), "sh", envBin, "-i"}
	envs := append([]string{}, t.config.Env...)
	for k, v := range r.env {
		envs = append(envs, k+"="+v)
	}
	sort.Strings(envs)
	args = append(args, envs...)
	args = append(args, chroot, "--userspec="+user[0]+":"+user[1], "--groups="+user[1], t.rootfs)
	args = append(args, t.config.Entrypoint...)
	args = append(args, r.args...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.Dir = "/"
	return cmd, nil
}

// runToEnd runs one start to its exit; the exit code, stdout and stderr.
func (t *imageTest) runToEnd(r inImage, limit time.Duration) (int, string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd, err := t.command(ctx, r)
	if err != nil {
		return 0, "", "", err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return 0, stdout.String(), stderr.String(), fmt.Errorf("%v did not finish in %s", r.args, limit)
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String(), nil
	case err != nil:
		return 0, "", "", err
	}
	return 0, stdout.String(), stderr.String(), nil
}

// version: `--version` names the commit the image's label names, which is the repository's.
func (t *imageTest) version() error {
	code, stdout, stderr, err := t.runToEnd(inImage{args: []string{"--version"}}, 20*time.Second)
	if err != nil {
		return err
	}
	commit, _, _, err := gitRevision(t.root)
	if err != nil {
		return err
	}
	label := t.config.Labels["org.opencontainers.image.revision"]
	if code != 0 || !strings.Contains(stdout, commit) || label != commit {
		return fmt.Errorf("--version: exit %d, %q (stderr %q); want the commit %s (label %s)", code, stdout, stderr, commit, label)
	}
	t.say("--version as %s on a read-only root: %s", t.config.User, strings.TrimSpace(stdout))
	return nil
}

// checkTLS: `check` against cloudstack-sim serving HTTPS with a certificate of a test CA. With
// the CA added the chart's way (a directory named in SSL_CERT_DIR next to the image's
// /etc/ssl/certs) the poll runs; without it the same command cannot verify the server.
func (t *imageTest) checkTLS(simBin string) error {
	caDir := filepath.Join(t.work, "extra-ca")
	certFile, keyFile, err := testCertificates(caDir, filepath.Join(t.work, "sim-tls"))
	if err != nil {
		return err
	}
	portFile := filepath.Join(t.work, "sim-port")
	sim := exec.Command(simBin, "--listen", "127.0.0.1:0", "--port-file", portFile,
		"--tls-cert", certFile, "--tls-key", keyFile,
		"--scenario", filepath.Join(t.root, "cloudstack-fixtures", "scenarios", "seed.json"))
	var simLog bytes.Buffer
	sim.Stdout, sim.Stderr = &simLog, &simLog
	if err := sim.Start(); err != nil {
		return err
	}
	defer func() { _ = sim.Process.Kill(); _ = sim.Wait() }()
	port, err := waitForFile(portFile, simWaitLimit)
	if err != nil {
		return fmt.Errorf("cloudstack-sim: %w; its output: %s", err, simLog.String())
	}
	env := map[string]string{
		"CLOUDSTACK_API_URL":    "https://127.0.0.1:" + port + "/client/api",
		"CLOUDSTACK_API_KEY":    testAPIKey,
		"CLOUDSTACK_SECRET_KEY": testSecret,
	}
	binds := map[string]string{caDir: extraCADir}
	args := []string{"check", "--polls", "1", "--request-timeout", "5s"}
	with := map[string]string{"SSL_CERT_DIR": systemCADir + ":" + extraCADir}
	for k, v := range env {
		with[k] = v
	}
	code, stdout, stderr, err := t.runToEnd(inImage{args: args, env: with, binds: binds}, time.Minute)
	if err != nil {
		return err
	}
	if code != 0 || !strings.Contains(stdout, "VM") {
		return fmt.Errorf("check with the test CA in SSL_CERT_DIR: exit %d; stdout %q; stderr %q", code, stdout, stderr)
	}
	t.say("check over TLS with SSL_CERT_DIR=%s: exit 0, %d lines of verdicts", with["SSL_CERT_DIR"], strings.Count(stdout, "\n"))
	code, stdout, stderr, err = t.runToEnd(inImage{args: args, env: env, binds: binds}, time.Minute)
	if err != nil {
		return err
	}
	// 3: CloudStack could not be reached (src/check: exit::UNREACHABLE).
	if code != 3 || !strings.Contains(strings.ToLower(stdout+stderr), "certificate") {
		return fmt.Errorf("check without the test CA: exit %d (want 3, a certificate error); stdout %q; stderr %q", code, stdout, stderr)
	}
	t.say("check over TLS with the image's CA bundle only: exit %d, %s", code, firstLineWith(stdout+stderr, "certificate"))
	for _, secret := range []string{testSecret} {
		if strings.Contains(stdout+stderr, secret) {
			return fmt.Errorf("check printed the secret key")
		}
	}
	return nil
}

// runReady: the default command (`run`) against the test API server becomes ready and serves
// /readyz over HTTPS (its self-signed certificate), then stops cleanly on SIGTERM.
func (t *imageTest) runReady(kubeconfig string) error {
	kubeDir := filepath.Join(t.work, "kube")
	if err := os.MkdirAll(kubeDir, 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(kubeDir, "kubeconfig"), data, 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	args := append(append([]string{}, t.config.Cmd...), "--status-addr", "127.0.0.1:"+port,
		"--lease-namespace", "default", "--lease-name", "capc-image-test-"+strconv.Itoa(os.Getpid()))
	cmd, err := t.command(context.Background(), inImage{args: args,
		env:   map[string]string{"KUBECONFIG": testKubeDir + "/kubeconfig", "HOSTNAME": "capc-image-test"},
		binds: map[string]string{kubeDir: testKubeDir}})
	if err != nil {
		return err
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the shim's own self-signed certificate
	started := time.Now()
	deadline := started.Add(90 * time.Second)
	var last string
	for {
		resp, err := client.Get("https://127.0.0.1:" + port + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
			if resp.StatusCode == http.StatusOK {
				break
			}
		} else {
			last = err.Error()
		}
		select {
		case err := <-done:
			return fmt.Errorf("run exited before it was ready (%v); its output: %s", err, logs.String())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("/readyz not 200 within 90 s (last: %s); output: %s", last, logs.String())
		}
	}
	ready := time.Since(started)
	who, err := processUserAndRoot(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("run after SIGTERM: %v; output: %s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("run did not stop within 30 s of SIGTERM")
	}
	t.say("run (the image's cmd) against the test API server: /readyz %s after %.1f s over HTTPS, %s; exit 0 on SIGTERM", last, ready.Seconds(), who)
	return nil
}

// processUserAndRoot reads, from /proc, that the process runs as the image's user (real,
// effective, saved and filesystem uid) and that its root is mounted read-only.
func processUserAndRoot(pid int) (string, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	var uids []string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "Uid:") {
			uids = strings.Fields(strings.TrimPrefix(l, "Uid:"))
		}
	}
	for _, u := range uids {
		if u != strconv.Itoa(imageUser) {
			return "", fmt.Errorf("the shim runs with uids %v, want %d", uids, imageUser)
		}
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		// mountinfo: id parent major:minor root mount-point options … (proc(5))
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "/" {
			for _, o := range strings.Split(f[5], ",") {
				if o == "ro" {
					return fmt.Sprintf("uid %s, root mounted %s", uids[0], f[5]), nil
				}
			}
			return "", fmt.Errorf("the shim's root is mounted %s, want ro", f[5])
		}
	}
	return "", fmt.Errorf("no root mount in /proc/%d/mountinfo", pid)
}

func firstLineWith(text, word string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(strings.ToLower(l), word) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

func waitForFile(p string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(p); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return strings.TrimSpace(string(b)), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", fmt.Errorf("%s not written within %s", p, limit)
}

// testCertificates makes a test CA (its certificate in caDir, as a Secret key would be mounted)
// and a server certificate for 127.0.0.1 signed by it; the server's chain and key files.
func testCertificates(caDir, serverDir string) (certFile, keyFile string, err error) {
	for _, d := range []string{caDir, serverDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", err
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "capc-health-shim image test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cloudstack-sim"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return "", "", err
	}
	pemOf := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	certFile, keyFile = filepath.Join(serverDir, "tls.crt"), filepath.Join(serverDir, "tls.key")
	if err := os.WriteFile(filepath.Join(caDir, "test-ca.pem"), pemOf("CERTIFICATE", caDER), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(certFile, append(pemOf("CERTIFICATE", srvDER), pemOf("CERTIFICATE", caDER)...), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pemOf("PRIVATE KEY", keyDER), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// untar extracts a tar file into dir.
func untar(file, dir string, owners bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return untarReader(f, dir, owners)
}

// untarReader extracts directories and regular files (nothing else is expected in our archives
// or image), refusing names that leave dir; with owners, ownership and modes are the tar's.
func untarReader(r io.Reader, dir string, owners bool) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			out.Close()
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected tar entry type %q", h.Name, h.Typeflag)
		}
		if owners {
			if err := os.Chmod(target, os.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
			if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
				return err
			}
		}
	}
}
