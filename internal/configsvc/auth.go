package configsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcd roles of nodes' users. Neither may change users, roles or
// members (the administrator's calls).
const (
	// ServerRole: read and write on the service's prefix. Servers are
	// the trusted base (they write slices, locks, logins, the deny list).
	ServerRole = "wheelfs-server"
	// ClientRole: read on the prefix, and write only the client's
	// published coordinate. A client host that could write a login
	// record (logins/<node>/<uid>) would give itself any user's session.
	ClientRole = "wheelfs-client"
)

// rootUser is etcd's administrator. With client-certificate auth, etcd
// takes the user name from the certificate's CommonName, so only a
// certificate named "root" (pki.RootCredentials: the CA key's holder) acts
// as it. The user has no password: nobody logs in with one.
const rootUser = "root"

// Config-service authentication (issue 13). With auth enabled, etcd
// refuses any client whose certificate name has no etcd user, so removing
// a revoked node's user shuts it out of the configuration service itself,
// where the deny list alone only shuts it out of WheelFS's own handshakes.
// Every call below needs the administrator (a client dialed with the root
// credentials), or auth not yet enabled.

// ErrNoUser means etcd, with auth on, refuses the client's certificate
// name: the node has no etcd user (never added, or revoked).
var ErrNoUser = errors.New("configsvc: the configuration service refuses this node (authentication is on and the node has no user there: add it with `wheelfs ca issue --config`, unless it is revoked)")

// authRefused reports whether err is etcd's refusal of the caller.
func authRefused(err error) bool {
	for _, e := range []error{rpctypes.ErrPermissionDenied, rpctypes.ErrUserNotFound, rpctypes.ErrUserEmpty} {
		if errors.Is(err, e) || strings.Contains(err.Error(), e.Error()) {
			return true
		}
	}
	return false
}

// EnableAuth turns etcd auth on: the root user and role, the node roles,
// a server user for each of servers, then auth. It is idempotent, and
// hosts may run it at the same moment (all members of a new deployment
// that hold the CA key do).
func (s *EtcdService) EnableAuth(ctx context.Context, servers ...string) error {
	if err := s.ensureRoles(ctx); err != nil {
		return err
	}
	for _, n := range servers {
		if err := s.AddNodeUser(ctx, n, true); err != nil {
			return err
		}
	}
	if on, err := s.AuthEnabled(ctx); err != nil || on {
		return err
	}
	return s.authCall(ctx, "enable auth", func(ctx context.Context) error {
		_, err := s.cli.AuthEnable(ctx)
		return err
	})
}

// ensureRoles makes the root user and the node roles, if missing.
func (s *EtcdService) ensureRoles(ctx context.Context) error {
	// What exists is read first: etcd logs a warning for every refused
	// change (an existing user or role), and a restart runs this again.
	users, err := s.users(ctx)
	if err != nil {
		return err
	}
	var roles []string
	if err := s.authCall(ctx, "list roles", func(ctx context.Context) error {
		resp, err := s.cli.RoleList(ctx)
		if err == nil {
			roles = resp.Roles
		}
		return err
	}); err != nil {
		return err
	}
	if err := s.authCall(ctx, "add root user", func(ctx context.Context) error {
		if users[rootUser] {
			// Another host may have added it and not yet granted
			// the role (or stopped in between): etcd refuses to turn
			// auth on with a root user without it.
			resp, err := s.cli.UserGet(ctx, rootUser)
			if err != nil || slices.Contains(resp.Roles, rootUser) {
				return err
			}
		} else if _, err := s.cli.UserAddWithOptions(ctx, rootUser, "", &clientv3.UserAddOptions{NoPassword: true}); ignore(err, rpctypes.ErrUserAlreadyExist) != nil {
			return err
		}
		_, err := s.cli.UserGrantRole(ctx, rootUser, rootUser)
		return err
	}); err != nil {
		return err
	}
	end := clientv3.GetPrefixRangeEnd(s.opts.Prefix)
	coords := s.coordsPfx()
	perms := []struct {
		role, key, end string
		typ            clientv3.PermissionType
	}{
		{ServerRole, s.opts.Prefix, end, clientv3.PermissionType(clientv3.PermReadWrite)},
		{ClientRole, s.opts.Prefix, end, clientv3.PermissionType(clientv3.PermRead)},
		{ClientRole, coords, clientv3.GetPrefixRangeEnd(coords), clientv3.PermissionType(clientv3.PermReadWrite)},
	}
	for _, p := range perms {
		if err := s.authCall(ctx, "add role "+p.role, func(ctx context.Context) error {
			if !slices.Contains(roles, p.role) {
				if _, err := s.cli.RoleAdd(ctx, p.role); ignore(err, rpctypes.ErrRoleAlreadyExist) != nil {
					return err
				}
				roles = append(roles, p.role)
			}
			_, err := s.cli.RoleGrantPermission(ctx, p.role, p.key, p.end, p.typ)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// users returns the etcd users.
func (s *EtcdService) users(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	err := s.authCall(ctx, "list users", func(ctx context.Context) error {
		resp, err := s.cli.UserList(ctx)
		if err != nil {
			return err
		}
		for _, u := range resp.Users {
			out[u] = true
		}
		return nil
	})
	return out, err
}

// AuthEnabled reports whether etcd auth is on.
func (s *EtcdService) AuthEnabled(ctx context.Context) (bool, error) {
	var on bool
	err := s.authCall(ctx, "auth status", func(ctx context.Context) error {
		st, err := s.cli.AuthStatus(ctx)
		if err == nil {
			on = st.Enabled
		}
		return err
	})
	return on, err
}

// AddNodeUser lets the node with certificate name name use the
// configuration service: its etcd user, with ServerRole or ClientRole.
// Adding an existing user grants the role (a client made a server keeps
// both). The roles are made if missing, so that a node may be added
// before auth is on.
func (s *EtcdService) AddNodeUser(ctx context.Context, name string, server bool) error {
	role := ClientRole
	if server {
		role = ServerRole
	}
	if err := checkDenialName(name); err != nil || name == rootUser {
		return fmt.Errorf("configsvc: add node user: invalid name %q", name)
	}
	if err := s.ensureRoles(ctx); err != nil {
		return err
	}
	var has []string
	found := true
	if err := s.authCall(ctx, "get user "+name, func(ctx context.Context) error {
		users, err := s.users(ctx)
		if err != nil || !users[name] {
			found = false
			return err
		}
		resp, err := s.cli.UserGet(ctx, name)
		if err == nil {
			has = resp.Roles
		}
		return err
	}); err != nil {
		return err
	}
	if slices.Contains(has, role) {
		return nil
	}
	return s.authCall(ctx, "add node user "+name, func(ctx context.Context) error {
		if !found {
			// Another administrator (a host following the deny list)
			// may add it at the same moment.
			_, err := s.cli.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true})
			if ignore(err, rpctypes.ErrUserAlreadyExist) != nil {
				return err
			}
		}
		_, err := s.cli.UserGrantRole(ctx, name, role)
		return err
	})
}

// DeleteNodeUser removes the node's etcd user: with auth on, etcd refuses
// every further request made with its certificate. A missing user is no
// error (existed is then false).
func (s *EtcdService) DeleteNodeUser(ctx context.Context, name string) (existed bool, err error) {
	if name == rootUser {
		return false, fmt.Errorf("configsvc: delete node user: %q is the administrator", name)
	}
	if existed, err = s.HasNodeUser(ctx, name); err != nil || !existed {
		return false, err
	}
	err = s.authCall(ctx, "delete node user "+name, func(ctx context.Context) error {
		_, err := s.cli.UserDelete(ctx, name)
		if ignore(err, rpctypes.ErrUserNotFound) == nil && err != nil {
			existed = false // another administrator was first
			return nil
		}
		return err
	})
	return existed, err
}

// HasNodeUser reports whether name has an etcd user (from the list of
// users: a lookup of a missing one is logged by etcd as a failure).
func (s *EtcdService) HasNodeUser(ctx context.Context, name string) (bool, error) {
	users, err := s.users(ctx)
	return users[name], err
}

func (s *EtcdService) authCall(ctx context.Context, what string, f func(context.Context) error) error {
	if s.isClosed() {
		return ErrClosed
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	if err := f(cctx); err != nil {
		return fmt.Errorf("configsvc: %s: %w", what, err)
	}
	return nil
}

// ignore returns nil for err matching target, err otherwise.
func ignore(err, target error) error {
	if errors.Is(err, target) || (err != nil && err.Error() == target.Error()) {
		return nil
	}
	return err
}
