package deploy

import (
	"context"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/auth"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// newGuard makes the server's gate for users: sessions live in the
// configuration service, which every server follows, signed with the
// server's node key (a certificate with the server role).
func (h *Host) newGuard() {
	h.guard = auth.NewGuard(auth.GuardConfig{Logger: h.cfg.Logger, Store: h.Conf.(configsvc.Logins), SessionTTL: h.cfg.SessionTTL,
		Keys: h.Creds, Unsigned: h.cfg.UnsignedSessions})
	if !h.Creds.IsServer() {
		h.log.Warn("this server's certificate lacks the server role: logins here are refused (re-issue it with `wheelfs ca issue --renew --server`, or give the host the CA key)",
			"node", h.Creds.Name, "unsigned_sessions", h.cfg.UnsignedSessions)
	}
	if h.cfg.UnsignedSessions {
		h.log.Warn("unsigned session records admitted (--unsigned-sessions): any node that can write to the configuration service can give itself a session")
	}
}

// followUsers runs the guard's session watch and reads the users file
// through a client core as root. The server's own requests are trusted
// (in-process, or from a registered server's certificate), so reading the
// file needs no session; its lease keeps the once-a-period version check
// local until the file changes. A host without a client role gets a
// small private client core for it.
func (h *Host) followUsers() {
	fs := h.Client
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if fs == nil {
		ccfg := h.cfg.Client
		ccfg.Logger, ccfg.Site, ccfg.CacheDir, ccfg.CacheBytes = h.cfg.Logger, h.cfg.Site, "", 1<<20
		fs = client.New(ccfg, h.Router)
	}
	own := fs != h.Client
	period := h.cfg.UsersPeriod
	if period <= 0 {
		period = time.Second
	}
	wg.Add(2)
	go func() { defer wg.Done(); h.guard.Run(ctx) }()
	go func() { defer wg.Done(); auth.FollowUsers(ctx, h.guard, readUsers(fs), period) }()
	stop := func() error {
		cancel()
		wg.Wait()
		if own {
			return fs.Close()
		}
		return nil
	}
	// Runs before the client core and router close (closers run in reverse).
	h.onClose(stop, stop)
}

// readUsers reads auth.UsersPath as root if its version is not since. The
// file and its directory must be root's and not writable by group or
// others, or anyone could give themselves a key.
func readUsers(fs *client.FS) auth.ReadUsersFunc {
	root := client.User{}
	trusted := func(ctx context.Context, p string) (*wire.Meta, error) {
		r, err := fs.Resolve(ctx, root, p)
		switch {
		case err != nil:
			return nil, err
		case r.Meta == nil:
			return nil, fmt.Errorf("%s: %w", p, fserr.ErrNotExist)
		case r.Meta.Uid != 0 || r.Meta.Mode&0o022 != 0:
			return nil, fmt.Errorf("%s (uid %d, mode %#o): %w", p, r.Meta.Uid, r.Meta.Mode, auth.ErrUntrusted)
		}
		return r.Meta, nil
	}
	return func(ctx context.Context, since uint64) ([]byte, uint64, error) {
		if _, err := trusted(ctx, path.Dir(auth.UsersPath)); err != nil {
			return nil, 0, err
		}
		m, err := trusted(ctx, auth.UsersPath)
		switch {
		case err != nil:
			return nil, 0, err
		case m.Type != wire.Type_TYPE_FILE:
			return nil, 0, fmt.Errorf("%s is not a file: %w", auth.UsersPath, auth.ErrUntrusted)
		case m.Version == since:
			return nil, since, nil
		}
		data, err := fs.ReadFile(ctx, root, auth.UsersPath)
		return data, m.Version, err
	}
}
