package deploy

import (
	"context"
	"path/filepath"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/every"
	"github.com/wheelfs/wheelfs/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// followDenied keeps the host's deny list (h.Creds.Deny) equal to the
// configuration service's: new handshakes with a revoked node fail, and
// its open connections are closed. Start waits, within ConfigWait, for the
// first list, so a restarted host never serves a revoked node.
func (h *Host) followDenied(ctx context.Context) {
	ds, ok := h.Conf.(configsvc.Denials)
	if !ok {
		return
	}
	wctx, cancel := context.WithCancel(context.Background())
	first, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		seen := false
		var prev []string
		for list := range ds.WatchDenied(wctx) {
			names := make([]string, len(list))
			for i, d := range list {
				names[i] = d.Name
			}
			h.followRevokedUsers(wctx, prev, names)
			prev = names
			for _, n := range h.Creds.Deny.Set(names) {
				if n == h.id.Server {
					h.log.Error("this node is revoked: every other node refuses it", "revoked", n)
				} else {
					h.log.Warn("node revoked: refusing its connections", "revoked", n)
				}
			}
			if !seen {
				seen = true
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-done:
	case <-ctx.Done():
	case <-time.After(h.cfg.ConfigWait):
		h.log.Warn("deny list not read yet; following it in the background")
	}
	stop := func() error { cancel(); <-done; return nil }
	h.onClose(stop, stop)
}

// denyUnary and denyStream refuse calls whose peer is revoked: connections
// are closed when the revocation arrives, so this only covers a call that
// raced with it.
func (h *Host) denyUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := h.checkDenied(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (h *Host) denyStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := h.checkDenied(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (h *Host) checkDenied(ctx context.Context) error {
	name, err := pki.PeerName(ctx)
	if err == nil && h.Creds.Deny.Denied(name) {
		return status.Errorf(codes.PermissionDenied, "wheelfs: node %q is revoked", name)
	}
	return nil
}

// renewCerts checks the node certificate now and every CertCheckPeriod:
// a host that holds the CA key renews it when a third of its life is
// left (pki.Renew) and presents the new one on new connections; a host
// without loads one re-issued into its node directory (`wheelfs ca issue
// --renew`), or warns that it needs one.
func (h *Host) renewCerts() {
	caDir := ""
	for _, d := range []string{h.cfg.CADir, h.caDir()} {
		if d != "" && exists(filepath.Join(d, pki.CAKeyFile)) {
			caDir = d
			break
		}
	}
	nd := h.nodeDir()
	// remote: a host without the CA key may ask a server that holds it
	// (not during Start: servers may be far or down, and the certificate
	// is still valid for a third of its life).
	check := func(ctx context.Context, remote bool) {
		if caDir != "" {
			did, err := pki.Renew(caDir, nd, h.serverRole(), h.cfg.CertValidity, time.Now())
			if err != nil {
				h.log.Warn("node certificate renewal failed", "err", err)
			} else if did {
				if err := h.Creds.Reload(nd); err != nil {
					h.log.Warn("renewed node certificate not loaded", "err", err)
				} else {
					h.log.Info("node certificate renewed", "node", h.id.Server)
				}
				return
			}
		}
		leaf := h.Creds.Current().Leaf
		// `wheelfs ca issue --renew` may have replaced the files.
		if _, onDisk, err := pki.Expiry(nd); err == nil && leaf != nil && onDisk.After(leaf.NotAfter) {
			if err := h.Creds.Reload(nd); err != nil {
				h.log.Warn("re-issued node certificate not loaded", "err", err)
			} else {
				h.log.Info("re-issued node certificate loaded", "node", h.id.Server, "expires", onDisk)
				return
			}
		}
		if leaf == nil || !pki.RenewDue(leaf, time.Now()) {
			return
		}
		if !remote && caDir == "" {
			return // the background check, at once, asks a server first
		}
		if caDir == "" {
			err := h.renewRemote(ctx)
			if err == nil {
				return
			}
			h.log.Warn("node certificate renewal by a server failed", "err", err)
		}
		h.log.Warn("node certificate expires soon; re-issue it with `wheelfs ca issue` and restart",
			"node", h.id.Server, "expires", leaf.NotAfter, "dir", nd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	check(ctx, false)
	period := h.cfg.CertCheckPeriod
	if period <= 0 {
		period = time.Hour
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(ctx, true)
		every.Do(ctx, period, nil, func() { check(ctx, true) })
	}()
	stop := func() error { cancel(); <-done; return nil }
	h.onClose(stop, stop)
}
