package configsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrRefused means every endpoint of the configuration service refused the
// connection: nothing listens there.
var ErrRefused = errors.New("connection refused")

// allRefused dials every endpoint once (a TCP connect, at most a second
// each, in parallel) and returns an error wrapping ErrRefused when all of
// them refuse the connection. Any other outcome (one answers, a timeout, an
// unresolvable name) returns nil: the caller's real dial reports it.
func allRefused(ctx context.Context, endpoints []string, dial func(context.Context, string) (net.Conn, error)) error {
	if dial == nil {
		d := &net.Dialer{}
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	results := make(chan bool, len(endpoints))
	for _, ep := range endpoints {
		go func() {
			conn, err := dial(ctx, hostPort(ep))
			if err == nil {
				conn.Close()
			}
			results <- err != nil && errors.Is(err, syscall.ECONNREFUSED)
		}()
	}
	for range endpoints {
		if !<-results {
			return nil
		}
	}
	return fmt.Errorf("no configuration member answers at %s (%w); is 'wheelfs config' running?",
		strings.Join(endpoints, ","), ErrRefused)
}

// hostPort strips a URL scheme from an etcd endpoint.
func hostPort(ep string) string {
	if strings.Contains(ep, "://") {
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			return u.Host
		}
	}
	return ep
}
