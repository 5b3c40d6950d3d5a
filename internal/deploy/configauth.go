package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// caKeyDir is the CA directory whose key this host holds (--ca, or the
// DataDir/ca of `wheelfs up`), "" if none.
func (h *Host) caKeyDir() string {
	for _, d := range []string{h.cfg.CADir, h.caDir()} {
		if d != "" && exists(filepath.Join(d, pki.CAKeyFile)) {
			return d
		}
	}
	return ""
}

// serverRole reports whether this host is part of the trusted base: a
// server or a config member writes the tables (a client host only reads
// them and publishes its coordinate), and its certificate carries the
// server role, which login sessions must be signed with.
func (h *Host) serverRole() bool {
	return h.cfg.Roles&(RoleServer|RoleMember) != 0
}

// rootCredentials are the configuration service's administrator
// credentials, made from the CA key this host holds (nil without one).
func (h *Host) rootCredentials() (*pki.Credentials, error) {
	dir := h.caKeyDir()
	if dir == "" {
		return nil, nil
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		return nil, err
	}
	return ca.RootCredentials()
}

// ConfigAuthMode says when a host turns on the configuration service's
// authentication (Config.ConfigAuth).
type ConfigAuthMode int

const (
	// ConfigAuthNew, the default, turns it on when the host holds the CA
	// key and the deployment is new (the configuration service holds no
	// deployment ID yet): new deployments get it, existing ones stay as
	// they are until an operator turns it on (ConfigAuthOn).
	ConfigAuthNew ConfigAuthMode = iota
	// ConfigAuthOn turns it on at start, in an existing deployment too
	// (the migration step, after `wheelfs ca issue --config` has added
	// the users of nodes without the CA key). The host needs the CA key.
	ConfigAuthOn
	// ConfigAuthOff never turns it on (`--config-auth=false`): an explicit
	// opt-out, also for an etcd that is not WheelFS's own (`--etcd`). It
	// does not turn auth off where another host turned it on.
	ConfigAuthOff
)

// ensureConfigUser prepares the configuration service's authentication
// for this host before its own client dials (docs/SECURITY.md): it turns
// etcd auth on as ConfigAuth says; when auth is on, it adds this node's
// etcd user. Both need the CA key; a host without it relies on `wheelfs
// ca issue --config` having added its user. A host holding the key keeps
// its administrator client while auth is on, to follow the deny list
// into etcd's users (followDenied).
func (h *Host) ensureConfigUser(ctx context.Context, endpoints []string, opts configsvc.Options) error {
	root, err := h.rootCredentials()
	if err != nil {
		return fmt.Errorf("deploy: configuration service administrator: %w", err)
	}
	if root == nil {
		if h.cfg.ConfigAuth == ConfigAuthOn {
			return errors.New("deploy: --config-auth needs the CA key (--ca DIR with ca.key, or the CA of `wheelfs up`)")
		}
		return nil
	}
	opts.OneShot = true
	admin, err := configsvc.Dial(ctx, endpoints, root.ClientTLS(""), opts)
	if err != nil {
		return err
	}
	enable := h.cfg.ConfigAuth == ConfigAuthOn
	if h.cfg.ConfigAuth == ConfigAuthNew && h.id.Deployment == "" {
		// A host that was part of a deployment never creates one.
		created, cerr := admin.DeploymentCreated(ctx)
		enable, err = !created, cerr
	}
	on := false
	if err == nil && enable {
		if err = admin.EnableAuth(ctx); err == nil {
			on = true
			h.log.Info("configuration service authentication on", "node", h.Creds.Name)
		}
	} else if err == nil {
		on, err = admin.AuthEnabled(ctx)
	}
	if err == nil && on {
		err = admin.AddNodeUser(ctx, h.Creds.Name, h.serverRole())
	}
	if err != nil || !on {
		admin.Close()
		return err
	}
	h.admin = admin
	h.onClose(admin.Close, admin.Close)
	return nil
}

// followRevokedUsers makes etcd refuse the nodes on the deny list, at a host
// that administers the configuration service (h.admin): a newly denied
// node's etcd user is deleted, and one taken off the list gets a client
// user back (a server's role is not recorded: it gets its own back when
// it starts with the CA key, or from `wheelfs ca issue --config --server`).
// It runs for every list the host receives, so a revocation written with
// a server's credentials (which cannot change users) takes effect in
// etcd as soon as one such host sees it.
func (h *Host) followRevokedUsers(ctx context.Context, prev, now []string) {
	if h.admin == nil {
		return
	}
	for _, n := range now {
		if slices.Contains(prev, n) {
			continue
		}
		if n == h.Creds.Name {
			continue // this host revoked: it must not lock itself out further
		}
		if existed, err := h.admin.DeleteNodeUser(ctx, n); err != nil {
			h.log.Warn("revoked node's configuration service user not deleted", "revoked", n, "err", err)
		} else if existed {
			h.log.Info("revoked node's configuration service user deleted", "revoked", n)
		}
	}
	for _, n := range prev {
		if slices.Contains(now, n) {
			continue
		}
		has, err := h.admin.HasNodeUser(ctx, n)
		if err == nil && !has {
			err = h.admin.AddNodeUser(ctx, n, false)
		}
		if err != nil {
			h.log.Warn("configuration service user of a node taken off the deny list not restored", "node", n, "err", err)
		}
	}
}
