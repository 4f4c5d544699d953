package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type proc struct {
	name, logPath string
	cmd           *exec.Cmd
	done          chan struct{}
	waitErr       error
}

type supervisor struct {
	dir    string
	procs  []*proc // in start order; stopped in reverse
	exited chan *proc
}

func (s *supervisor) logPath(name string) string { return filepath.Join(s.dir, name+".log") }

func (s *supervisor) start(name, bin string, args []string) (*proc, error) {
	if s.exited == nil {
		s.exited = make(chan *proc, 4)
	}
	logPath := s.logPath(name)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logFile, "### %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group: a terminal Ctrl-C reaches only this runner, which then stops the
	// children in order. Pdeathsig: if the runner is killed outright, the children die too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	s.procs = append(s.procs, p)
	_ = os.WriteFile(filepath.Join(s.dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
		select {
		case s.exited <- p:
		default:
		}
	}()
	return p, nil
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		logf("%s did not stop within %s; killing it", p.name, grace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (s *supervisor) stopAll() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		p.stop(20 * time.Second)
		os.Remove(filepath.Join(s.dir, p.name+".pid"))
	}
	s.procs = nil
}

func (s *supervisor) forget(p *proc) {
	for i, q := range s.procs {
		if q == p {
			s.procs = append(s.procs[:i], s.procs[i+1:]...)
			break
		}
	}
	// Its exit notification, if already queued, must not look like a later crash.
	for {
		select {
		case q := <-s.exited:
			if q != p {
				s.exited <- q
				return
			}
		default:
			return
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// attempts: a free port can be taken by someone else between probing and binding; retry
// with new ports when the log says so.
const portAttempts = 3

func (s *supervisor) startEtcd(ctx context.Context, bin string, timeout time.Duration) (string, error) {
	for attempt := 1; ; attempt++ {
		clientPort, err := freePort()
		if err != nil {
			return "", err
		}
		peerPort, err := freePort()
		if err != nil {
			return "", err
		}
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
		dataDir := filepath.Join(s.dir, "etcd-data")
		os.RemoveAll(dataDir)
		p, err := s.start("etcd", bin, []string{
			"--name=capc-health-shim-test",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=capc-health-shim-test=" + peerURL,
			"--initial-cluster-state=new",
			"--unsafe-no-fsync=true", // throwaway data: no fsync, much faster on slow disks
			"--log-level=warn",
		})
		if err != nil {
			return "", err
		}
		logf("etcd starting on %s (log: %s)", clientURL, p.logPath)
		err = waitHTTP(ctx, p, http.DefaultClient, clientURL+"/health", `"health":"true"`, timeout)
		if err == nil {
			return clientURL, nil
		}
		p.stop(5 * time.Second)
		s.forget(p)
		if attempt < portAttempts && portClash(p.logPath) {
			logf("etcd: port already in use, retrying with other ports")
			continue
		}
		return "", fmt.Errorf("%w; log: %s\n%s", err, p.logPath, tail(p.logPath, 20))
	}
}

func (s *supervisor) startAPIServer(ctx context.Context, bin, etcdURL string, k *pki, extraArgs []string, timeout time.Duration) (string, error) {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		url := fmt.Sprintf("https://127.0.0.1:%d", port)
		p, err := s.start("kube-apiserver", bin, append([]string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(s.dir, "apiserver-certs"),
			"--tls-cert-file=" + k.servingCert,
			"--tls-private-key-file=" + k.servingKey,
			"--client-ca-file=" + k.caCert,
			"--token-auth-file=" + k.tokenCSV,
			"--authorization-mode=RBAC",
			"--anonymous-auth=false",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + k.saPub,
			"--service-account-signing-key-file=" + k.saKey,
			"--api-audiences=https://kubernetes.default.svc.cluster.local",
			"--service-cluster-ip-range=" + serviceCIDR,
			// No kube-controller-manager or nodes here: the "kubernetes" Service endpoints
			// would be 127.0.0.1, which Endpoints validation rejects; don't maintain them.
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--profiling=false",
			"--v=1",
		}, extraArgs...))
		if err != nil {
			return "", err
		}
		logf("kube-apiserver starting on %s (log: %s)", url, p.logPath)
		err = waitHTTP(ctx, p, newAPIClient(url, k).http, url+"/readyz", "ok", timeout)
		if err == nil {
			return url, nil
		}
		p.stop(10 * time.Second)
		s.forget(p)
		if attempt < portAttempts && portClash(p.logPath) {
			logf("kube-apiserver: port already in use, retrying with another port")
			continue
		}
		return "", fmt.Errorf("%w; log: %s\n%s", err, p.logPath, tail(p.logPath, 20))
	}
}

func portClash(logPath string) bool {
	b, _ := os.ReadFile(logPath)
	return strings.Contains(string(b), "address already in use")
}

// waitHTTP polls url until it answers 200 with a body containing want, the process exits,
// the context ends or the deadline passes.
func waitHTTP(ctx context.Context, p *proc, c *http.Client, url, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer yet"
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
				cancel()
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (last: %s)", url, timeout, truncate(last, 600))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("%s exited while waiting for %s (%v)", p.name, url, p.waitErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// apiClient talks to kube-apiserver with the admin token over the throwaway CA.
type apiClient struct {
	base, token string
	http        *http.Client
}

func newAPIClient(base string, k *pki) *apiClient {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	c := &apiClient{base: base, token: k.token}
	c.http = &http.Client{Transport: bearer{tr, k.token}, Timeout: 30 * time.Second}
	return c
}

type bearer struct {
	rt    http.RoundTripper
	token string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}
