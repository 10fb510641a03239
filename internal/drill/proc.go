package drill

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process the drill started and can kill and start again
// with the same arguments (same ports, same names), as an operator's
// restart would.
type proc struct {
	name string
	path string
	args []string
	// ready, when set, is a line of the process's output that says it
	// serves; start waits for it.
	ready string
	logw  io.Writer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// childEnv is the environment of the drill's children: the drill's own,
// less the SLUICE_* variables, so that a shell set up for another fleet
// cannot point a child at it (sluiced and sluice-agent read them as flag
// defaults).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

// start runs the process and, with ready set, waits (at most timeout) for
// the line that says it serves.
func (p *proc) start(ctx context.Context, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.name)
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = childEnv()
	cmd.SysProcAttr = childAttr()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start %s: %w", p.name, p.path, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		close(done)
	}()
	ready := make(chan struct{})
	var once sync.Once
	if p.ready == "" {
		once.Do(func() { close(ready) })
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			if p.logw != nil {
				fmt.Fprintf(p.logw, "[%s] %s\n", p.name, line)
			}
			if p.ready != "" && strings.Contains(line, p.ready) {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	p.cmd, p.done = cmd, done
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-done:
		p.cmd = nil
		return fmt.Errorf("%s: exited at start (%v)", p.name, cmd.ProcessState)
	case <-t.C:
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	<-done
	p.cmd = nil
	if ctx.Err() != nil {
		return fmt.Errorf("%s: start: %w", p.name, ctx.Err())
	}
	return fmt.Errorf("%s: not ready within %v", p.name, timeout)
}

// stop ends the process: SIGKILL when kill (a crash), else SIGTERM and,
// after grace, SIGKILL. It waits for the exit. Stopping a stopped process
// does nothing.
func (p *proc) stop(kill bool, grace time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	cmd, done := p.cmd, p.done
	p.cmd = nil
	if kill {
		_ = cmd.Process.Kill()
		<-done
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = cmd.Process.Kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
	}
	return nil
}

// exited reports whether the process was started and has exited.
func (p *proc) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
