package pki

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"google.golang.org/grpc/credentials"
)

// ErrRevoked means the peer's certificate names a node on the deny list.
var ErrRevoked = errors.New("pki: peer node is revoked")

// Denylist is the set of revoked node names (certificate CommonNames) a
// node refuses, and the connections it tracks so that revoking a node
// closes them too. The zero value and nil are empty lists.
type Denylist struct {
	mu    sync.Mutex
	names map[string]bool
	conns map[string]map[*trackedConn]bool // by peer name
}

// Set replaces the list and closes every tracked connection to or from a
// node on it. It returns the names that were not on the previous list.
func (d *Denylist) Set(names []string) (added []string) {
	d.mu.Lock()
	next := make(map[string]bool, len(names))
	var doomed []*trackedConn
	for _, n := range names {
		next[n] = true
		if !d.names[n] {
			added = append(added, n)
		}
		for c := range d.conns[n] {
			doomed = append(doomed, c)
		}
		// Untracked now, not when gRPC gets round to closing the
		// wrapper: Conns and a second Set see the denial at once.
		delete(d.conns, n)
	}
	d.names = next
	d.mu.Unlock()
	for _, c := range doomed {
		_ = c.Conn.Close()
	}
	slices.Sort(added)
	return added
}

// Denied reports whether name is on the list.
func (d *Denylist) Denied(name string) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.names[name]
}

// Conns counts the tracked open connections with name's node (tests).
func (d *Denylist) Conns(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns[name])
}

// check refuses a TLS peer whose leaf certificate names a denied node. It
// runs as tls.Config.VerifyConnection, after the chain is verified.
func (d *Denylist) check(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil // the chain verification already refused it
	}
	if name := cs.PeerCertificates[0].Subject.CommonName; d.Denied(name) {
		return fmt.Errorf("%w: %q", ErrRevoked, name)
	}
	return nil
}

// track registers c as a connection with node name, unless name is
// denied (then c is closed and ErrRevoked returned): the check and the
// registration are one step, so a Set racing with a handshake cannot miss
// the connection.
func (d *Denylist) track(name string, c net.Conn) (net.Conn, error) {
	d.mu.Lock()
	if d.names[name] {
		d.mu.Unlock()
		_ = c.Close()
		return nil, fmt.Errorf("%w: %q", ErrRevoked, name)
	}
	if d.conns == nil {
		d.conns = map[string]map[*trackedConn]bool{}
	}
	if d.conns[name] == nil {
		d.conns[name] = map[*trackedConn]bool{}
	}
	tc := &trackedConn{Conn: c, d: d, name: name}
	d.conns[name][tc] = true
	d.mu.Unlock()
	return tc, nil
}

// trackedConn leaves its Denylist's tracking when closed.
type trackedConn struct {
	net.Conn
	d    *Denylist
	name string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		delete(c.d.conns[c.name], c)
		if len(c.d.conns[c.name]) == 0 {
			delete(c.d.conns, c.name)
		}
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}

// ServerCredentials returns gRPC server transport credentials over
// ServerTLS whose connections the deny list tracks: revoking a node
// closes its open connections, not only refuses new ones.
func (c *Credentials) ServerCredentials() credentials.TransportCredentials {
	return &trackingCreds{TransportCredentials: credentials.NewTLS(c.ServerTLS()), d: c.denylist()}
}

// ClientCredentials is ServerCredentials' client side, over
// ClientTLS(serverName).
func (c *Credentials) ClientCredentials(serverName string) credentials.TransportCredentials {
	return &trackingCreds{TransportCredentials: credentials.NewTLS(c.ClientTLS(serverName)), d: c.denylist()}
}

type trackingCreds struct {
	credentials.TransportCredentials
	d *Denylist
}

func (t *trackingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := t.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return t.wrap(conn, ai)
}

func (t *trackingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := t.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return t.wrap(conn, ai)
}

func (t *trackingCreds) wrap(conn net.Conn, ai credentials.AuthInfo) (net.Conn, credentials.AuthInfo, error) {
	info, ok := ai.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return conn, ai, nil
	}
	tc, err := t.d.track(info.State.PeerCertificates[0].Subject.CommonName, conn)
	if err != nil {
		return nil, nil, err
	}
	return tc, ai, nil
}

func (t *trackingCreds) Clone() credentials.TransportCredentials {
	return &trackingCreds{TransportCredentials: t.TransportCredentials.Clone(), d: t.d}
}
