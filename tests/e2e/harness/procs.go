package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RepoRoot is the directory holding the repository's Cargo.toml (found upwards from here).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "Cargo.toml")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "tests", "e2e", "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no capc-health-shim checkout above %s", dir)
		}
		dir = parent
	}
}

// CargoBinary is a binary built by `cargo build` (debug profile), honouring CARGO_TARGET_DIR.
func CargoBinary(root, name string) (string, error) {
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = filepath.Join(root, "target")
	} else if !filepath.IsAbs(target) {
		target = filepath.Join(root, target)
	}
	p := filepath.Join(target, "debug", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found: run `cargo build --workspace --bins` first", p)
	}
	return p, nil
}

// Process is a child process whose output goes to a log file; Stop ends it (TERM, then KILL).
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu    sync.Mutex
	lines []string // stdout lines, for address discovery
}

// StartProcess runs bin with args; its stdout and stderr go to logPath, stdout lines are kept too.
// The process runs in the repository root (the runner and the scenarios use relative paths).
func StartProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	// Its own process group (Stop signals all of it); and it is told to stop should this
	// process die without Stop (a panic, a test timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			p.mu.Lock()
			if len(p.lines) < 1000 {
				p.lines = append(p.lines, line)
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended (and how).
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// WaitLine waits (with a deadline) for a stdout line matching re and returns its first group.
func (p *Process) WaitLine(ctx context.Context, re *regexp.Regexp, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, l := range p.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				p.mu.Unlock()
				return m[1], nil
			}
		}
		p.mu.Unlock()
		if done, err := p.Exited(); done {
			return "", fmt.Errorf("%s exited (%v) before printing %q; log %s:\n%s", p.Name, err, re, p.Log, tail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("%s printed no %q within %s; log %s", p.Name, re, timeout, p.Log)
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace; returns the exit error.
func (p *Process) Stop(grace time.Duration) error {
	if done, err := p.Exited(); done {
		return err
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return p.err
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitFor polls cond every interval until it returns true, an error, or the timeout passes.
func WaitFor(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return fmt.Errorf("%s: not reached within %s (last error: %v)", what, timeout, lastErr)
			}
			return fmt.Errorf("%s: not reached within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Every calls fn every interval until ctx ends.
func Every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}
