package deploy

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// PeerConfig configures how a client host serves its block cache to other
// clients (.Hotspot, issue 12).
type PeerConfig struct {
	// Listen is the address of the PeerCache service (mutual TLS, as the
	// storage server's); empty: the host neither serves nor is named as a
	// holder (it still fetches from others).
	Listen string
	// UploadRate bounds bytes per second served to peers (0: unlimited).
	UploadRate int64
	// UploadConcurrency bounds peer requests served at once (0:
	// client.DefaultUploadConcurrency).
	UploadConcurrency int
}

// grantKeys gives the server role its grant signer and verifier: the
// host's TLS key signs, the deployment CA checks.
func (h *Host) grantKeys() error {
	s, err := blockgrant.NewSigner(h.Creds.Cert, h.Creds.Name)
	if err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	h.cfg.Server.Grants, h.cfg.Server.GrantCheck = s, blockgrant.NewVerifier(h.Creds.CACertPool)
	if h.caKeyDir() != "" {
		// It may renew other nodes' certificates too (RenewCertificate).
		h.cfg.Server.Certs = certRenewer{h}
	}
	return nil
}

// peerSide fills the client's peer configuration and, with an address to
// listen on, opens the PeerCache listener (served by servePeer once the
// client exists).
func (h *Host) peerSide(ccfg *client.Config) error {
	pool := &peerConns{h: h, conns: map[string]*grpc.ClientConn{}}
	h.onClose(pool.close, nil)
	p := &ccfg.Peers
	p.Dial = pool.dial
	p.Grants = blockgrant.NewVerifier(h.Creds.CACertPool)
	p.UploadRate, p.UploadConcurrency = h.cfg.Peer.UploadRate, h.cfg.Peer.UploadConcurrency
	if h.cfg.Peer.Listen == "" {
		return nil
	}
	var err error
	if h.cfg.Network != nil {
		h.peerLn, err = h.cfg.Network.Listen(h.cfg.Site, h.cfg.Peer.Listen)
	} else {
		h.peerLn, err = net.Listen("tcp", h.cfg.Peer.Listen)
	}
	if err != nil {
		return fmt.Errorf("deploy: peer listen %s: %w", h.cfg.Peer.Listen, err)
	}
	p.Addr = h.peerLn.Addr().String()
	h.onClose(func() error { h.peerLn.Close(); return nil }, nil)
	return nil
}

// servePeer serves the client's cache on the peer listener.
func (h *Host) servePeer() {
	if h.peerLn == nil {
		return
	}
	g := grpc.NewServer(grpc.Creds(h.Creds.ServerCredentials()), grpc.MaxSendMsgSize(64<<20))
	wire.RegisterPeerCacheServer(g, h.Client.PeerService())
	go g.Serve(h.peerLn)
	h.onClose(func() error { g.Stop(); return nil }, nil)
}

// PeerAddr is where the host serves its cache ("" when it does not).
func (h *Host) PeerAddr() string {
	if h.peerLn == nil {
		return ""
	}
	return h.peerLn.Addr().String()
}

// peerConns are connections to other clients' PeerCache services, one per
// node and address, authenticated as that node.
type peerConns struct {
	h     *Host
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func (p *peerConns) dial(_ context.Context, node, addr string) (wire.PeerCacheClient, error) {
	key := node + "\x00" + addr
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[key]; ok {
		return wire.NewPeerCacheClient(c), nil
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(p.h.Creds.ClientCredentials(node)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20))}
	if d := p.h.dialer(); d != nil {
		opts = append(opts, grpc.WithContextDialer(d))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("deploy: peer %s at %s: %w", node, addr, err)
	}
	if len(p.conns) >= maxPeerConns { // bounded: drop them all, redial as needed
		for k, old := range p.conns {
			old.Close()
			delete(p.conns, k)
		}
	}
	p.conns[key] = c
	return wire.NewPeerCacheClient(c), nil
}

// maxPeerConns bounds the connections kept to other clients.
const maxPeerConns = 256

func (p *peerConns) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, c := range p.conns {
		c.Close()
		delete(p.conns, k)
	}
	return nil
}
