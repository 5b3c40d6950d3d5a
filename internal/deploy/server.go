package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// lateLocal is the router's in-process shortcut to this host's server: the
// router is created before the server, which is filled in before any call.
type lateLocal struct{ wire.StorageClient }

// startServer runs the server role: the store, the gRPC listener (through
// the shaped network if any) and server.Server, registered under its
// membership lease.
func (h *Host) startServer(ctx context.Context, local *lateLocal) (err error) {
	cfg := h.cfg
	st, err := store.Open(filepath.Join(cfg.DataDir, "store"), store.Options{Logger: cfg.Logger.With("component", "store")})
	if err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	h.Store = st
	h.onClose(st.Close, nil)

	if cfg.Network != nil {
		h.listener, err = cfg.Network.Listen(cfg.Site, cfg.Listen)
	} else {
		h.listener, err = net.Listen("tcp", cfg.Listen)
	}
	if err != nil {
		return fmt.Errorf("deploy: listen %s: %w", cfg.Listen, err)
	}
	scfg := cfg.Server
	scfg.ID, scfg.Site, scfg.Addr, scfg.Logger = h.id.Server, cfg.Site, h.listener.Addr().String(), cfg.Logger
	scfg.RootUID, scfg.RootGID = uint32(os.Getuid()), uint32(os.Getgid())
	scfg.Peers = func(ctx context.Context, id string) (wire.PeerClient, error) { return h.Router.Peer(ctx, id) }
	h.Server = server.New(scfg, st, h.Conf, cfg.LockTTL)
	local.StorageClient = server.LocalClient(h.Server)
	h.grpc = grpc.NewServer(grpc.Creds(credentials.NewTLS(h.Creds.ServerTLS())),
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20),
		grpc.ChainUnaryInterceptor(h.gate.unary, h.Server.UnaryInterceptor()), grpc.ChainStreamInterceptor(h.gate.stream))
	wire.RegisterStorageServer(h.grpc, h.Server)
	wire.RegisterPeerServer(h.grpc, h.Server.PeerService())
	go h.grpc.Serve(h.listener)
	h.onClose(func() error { h.grpc.Stop(); return nil }, nil)
	if err := h.Server.Start(ctx); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	h.onClose(h.Server.Close, func() error {
		// As kill -9: no more answers, and the leases are left to expire
		// (abandoned before Halt, which would end the registration).
		h.grpc.Stop()
		h.etcd.Abandon()
		h.Server.Halt()
		return nil
	})
	return nil
}
