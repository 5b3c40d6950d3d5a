package experiment

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

// listenIn opens a TCP listener in a testbed host's network namespace: a
// server of the experiment process that the other hosts reach over the
// emulated wide area.
func listenIn(st *testbed.State, host, addr string) (net.Listener, error) {
	var ln net.Listener
	err := st.InHost(host, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s at %s: %w", addr, host, err)
	}
	return ln, nil
}

// httpClientIn returns an HTTP client whose connections are made from a
// testbed host's network namespace, so that they take that host's path.
// proxy, if not empty, is the URL of a forward proxy.
func httpClientIn(st *testbed.State, host, proxy string, conns int, timeout time.Duration) (*http.Client, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := st.InHost(host, func() error {
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	if proxy != "" {
		u, err := url.Parse(proxy)
		if err != nil {
			return nil, err
		}
		tr.Proxy = http.ProxyURL(u)
	}
	return &http.Client{Transport: tr, Timeout: timeout}, nil
}

// daemon is a process the experiment started in a host's namespace.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startDaemon starts cmd in a host's network namespace, in its own
// session, and reaps it when it exits.
func startDaemon(st *testbed.State, host, name string, cmd *exec.Cmd) (*daemon, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := st.InHost(host, cmd.Start); err != nil {
		return nil, fmt.Errorf("start %s at %s: %w", name, host, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// exited tells whether the process has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, and SIGKILL after grace.
func (d *daemon) stop(grace time.Duration) error {
	if d.exited() {
		return nil
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-d.done:
		return nil
	case <-time.After(grace):
	}
	_ = d.cmd.Process.Kill()
	select {
	case <-d.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", d.name, d.cmd.Process.Pid)
	}
}
