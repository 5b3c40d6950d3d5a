package deploy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/route"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// lateLocal is the router's in-process shortcut to this host's server: the
// router is created before the server, which is filled in before any call.
type lateLocal struct{ server.LocalStorage }

// startServer runs the server role: the store, the gRPC listener (through
// the shaped network if any) and server.Server, registered under its
// membership lease.
func (h *Host) startServer(ctx context.Context, local *lateLocal) (err error) {
	cfg := h.cfg
	sopts := cfg.Store
	sopts.Logger = cfg.Logger.With("component", "store")
	st, err := store.Open(filepath.Join(cfg.DataDir, "store"), sopts)
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
	scfg.Users = h.guard // nil: client uids are trusted
	scfg.Peers = func(ctx context.Context, id string) (wire.PeerClient, error) { return h.Router.Peer(ctx, id) }
	// Registration retries within ConfigWait: right after the config
	// members start, they may still be joining each other and lose their
	// quorum for a few seconds.
	reg := &startService{Service: h.Conf, h: h, until: time.Now().Add(cfg.ConfigWait)}
	h.Server = server.New(scfg, st, reg, cfg.LockTTL)
	local.LocalStorage = server.LocalClient(h.Server)
	h.grpc = grpc.NewServer(grpc.Creds(h.Creds.ServerCredentials()),
		grpc.MaxRecvMsgSize(wire.MaxMessageSize), grpc.MaxSendMsgSize(wire.MaxMessageSize),
		// Clients and peers ping idle connections (route.KeepaliveTime).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: route.KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.InitialWindowSize(route.WindowSize), grpc.InitialConnWindowSize(route.ConnWindowSize),
		grpc.ChainUnaryInterceptor(h.denyUnary, h.Coord.UnaryServerInterceptor(), h.gate.unary, h.Server.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(h.denyStream, h.gate.stream, h.Server.StreamInterceptor()))
	wire.RegisterStorageServer(h.grpc, h.Server)
	wire.RegisterPeerServer(h.grpc, h.Server.PeerService())
	go h.grpc.Serve(h.listener)
	h.onClose(func() error { h.grpc.Stop(); return nil }, nil)
	err = h.Server.Start(ctx)
	reg.done.Store(true)
	if err != nil {
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

// startService is the configuration service as the server sees it while
// it starts: Register, Table and Acquire retry until the host's ConfigWait has
// passed (each try is bounded by the service's RPC timeout), as the
// slice-table read of Start does: right after the config members start,
// they may still be joining each other and lose their quorum for a few
// seconds. After Start, calls are passed through.
type startService struct {
	configsvc.Service
	h     *Host
	until time.Time
	done  atomic.Bool
}

func (r *startService) Register(ctx context.Context, info configsvc.ServerInfo) error {
	return r.retry(ctx, "register", func() error { return r.Service.Register(ctx, info) })
}

func (r *startService) Table(ctx context.Context) (t *configsvc.Table, err error) {
	err = r.retry(ctx, "read the slice table", func() (err error) { t, err = r.Service.Table(ctx); return err })
	return t, err
}

// Acquire retries too: a server that holds no slice takes one as it starts,
// and 250 hosts starting at once on one machine kept the members too busy
// to grant its lease within the RPC timeout (the node exited). Acquire is
// idempotent for its holder: a try that timed out after taking the lock
// finds it its own.
func (r *startService) Acquire(ctx context.Context, sl oid.Slice, holder string, p configsvc.Policy, replicas []string) (l configsvc.Lock, err error) {
	err = r.retry(ctx, "acquire a slice", func() (err error) { l, err = r.Service.Acquire(ctx, sl, holder, p, replicas); return err })
	return l, err
}

func (r *startService) retry(ctx context.Context, op string, f func() error) error {
	for {
		err := f()
		if err == nil || r.done.Load() || ctx.Err() != nil ||
			errors.Is(err, configsvc.ErrClosed) || errors.Is(err, configsvc.ErrLocked) || errors.Is(err, configsvc.ErrDenied) {
			return err
		}
		wait := time.Until(r.until)
		if wait <= 0 {
			return fmt.Errorf("%w (gave up after --config-wait %v)", err, r.h.cfg.ConfigWait)
		}
		r.h.log.Info("configuration service not ready; retrying", "op", op, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(time.Second, wait)):
		}
	}
}
