package auth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Defaults of GuardConfig.
const (
	DefaultSessionTTL = 12 * time.Hour
	challengeTTL      = time.Minute
	maxChallenges     = 4096
	// missTTL is how long an unknown (node, uid) is refused from memory
	// before the configuration service is asked again: a session made a
	// moment ago at another server counts at once, yet a client
	// hammering with forged uids costs at most one read per key and period.
	missTTL = 200 * time.Millisecond
)

// GuardConfig configures a Guard.
type GuardConfig struct {
	Logger *slog.Logger
	// Store keeps the sessions (the configuration service).
	Store configsvc.Logins
	// SessionTTL is how long a session lasts unless renewed (default
	// DefaultSessionTTL).
	SessionTTL time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

type nodeUID struct {
	node string
	uid  uint32
}

type challenge struct {
	nodeUID
	user    string
	expires time.Time
}

// Guard is a storage server's gate for users: it follows the users file
// (SetUsers) and the sessions (Run), answers logins, and admits a
// request's uid only with a valid session at the calling node.
type Guard struct {
	cfg GuardConfig
	log *slog.Logger

	mu         sync.Mutex
	users      *Users
	sessions   map[nodeUID]configsvc.Login
	misses     map[nodeUID]time.Time
	challenges map[string]challenge // by hex nonce
}

// NewGuard returns a Guard with no users (nobody may log in until
// SetUsers).
func NewGuard(cfg GuardConfig) *Guard {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Guard{cfg: cfg, log: cfg.Logger.With("component", "auth"),
		sessions: map[nodeUID]configsvc.Login{}, misses: map[nodeUID]time.Time{},
		challenges: map[string]challenge{}}
}

// SetUsers replaces the users. Sessions whose user or key is gone stop
// counting at once (Check looks the user up on every request).
func (g *Guard) SetUsers(us *Users) {
	g.mu.Lock()
	g.users = us
	g.mu.Unlock()
	g.log.Info("users file loaded", "users", us.Len())
}

// Run follows the sessions in the store until ctx ends.
func (g *Guard) Run(ctx context.Context) {
	for ls := range g.cfg.Store.WatchLogins(ctx) {
		m := make(map[nodeUID]configsvc.Login, len(ls))
		for _, l := range ls {
			m[nodeUID{l.Node, l.UID}] = l
		}
		g.mu.Lock()
		g.sessions = m
		g.mu.Unlock()
	}
}

// valid returns the user of a live session whose user and key are still
// in the users file. g.mu is held.
func (g *Guard) validLocked(l configsvc.Login, ok bool) *User {
	if !ok || !g.cfg.Now().Before(l.Expires) {
		return nil
	}
	u := g.users.Lookup(l.User)
	if u == nil || u.UID != l.UID || !u.HasKey(l.Key) {
		return nil
	}
	return u
}

// session returns the valid session of k, asking the store once per
// missTTL when this server has not seen it.
func (g *Guard) session(ctx context.Context, k nodeUID) (configsvc.Login, *User) {
	g.mu.Lock()
	l, ok := g.sessions[k]
	u := g.validLocked(l, ok)
	miss, recent := g.misses[k]
	g.mu.Unlock()
	if u != nil || (recent && g.cfg.Now().Sub(miss) < missTTL) {
		return l, u
	}
	l, ok, err := g.cfg.Store.GetLogin(ctx, k.node, k.uid)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil || !ok {
		if len(g.misses) > maxChallenges {
			clear(g.misses)
		}
		g.misses[k] = g.cfg.Now()
		return l, nil
	}
	delete(g.misses, k)
	if cur, seen := g.sessions[k]; !seen || cur.Expires.Before(l.Expires) {
		g.sessions[k] = l
	}
	return l, g.validLocked(l, true)
}

// Check admits a request from node made for c's uid: it needs a valid
// session, and then acts with the user's groups from the users file (a
// gid outside them is replaced by the primary group), never with groups
// the client claims. A refusal is EACCES and a log line.
func (g *Guard) Check(ctx context.Context, node string, c *wire.Caller) error {
	if c == nil {
		return fmt.Errorf("request from %s without a caller: %w", node, fserr.ErrAccess)
	}
	_, u := g.session(ctx, nodeUID{node, c.Uid})
	if u == nil {
		g.log.Warn("request refused: no valid session for this uid at this client", "node", node, "uid", c.Uid)
		return fmt.Errorf("uid %d has no valid session at %s (wheelfs login): %w", c.Uid, node, fserr.ErrAccess)
	}
	c.Groups = slices.Clone(u.Groups)
	if len(u.Groups) > 0 && !slices.Contains(u.Groups, c.Gid) {
		c.Gid = u.Groups[0]
	}
	return nil
}

// Challenge starts a login of user for uid at node: a fresh nonce, valid
// for a minute and once, plus the fingerprints of the user's keys.
func (g *Guard) Challenge(node string, uid uint32, user string) (*wire.LoginChallengeResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.users.Lookup(user)
	if user == "" && uid != 0 {
		// None named: the user with the caller's uid (uids are unique).
		if u = g.users.LookupUID(uid); u != nil {
			user = u.Name
		}
	}
	if u == nil {
		return nil, fmt.Errorf("no user %q (uid %d) in %s: %w", user, uid, UsersPath, fserr.ErrAccess)
	}
	if uid != 0 && uid != u.UID {
		return nil, fmt.Errorf("uid %d may not log in as %s (uid %d): %w", uid, user, u.UID, fserr.ErrAccess)
	}
	now := g.cfg.Now()
	for n, ch := range g.challenges {
		if now.After(ch.expires) {
			delete(g.challenges, n)
		}
	}
	if len(g.challenges) >= maxChallenges {
		return nil, fmt.Errorf("too many logins under way: %w", fserr.ErrBusy)
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	g.challenges[hex.EncodeToString(nonce)] = challenge{nodeUID{node, uid}, user, now.Add(challengeTTL)}
	return &wire.LoginChallengeResponse{Nonce: nonce, Node: node, Keys: u.Fingerprints(), User: user}, nil
}

// Login completes a challenge: the signature must be by one of the user's
// keys over Payload(node, uid, user, nonce). The session covers the user's
// uid (a root caller logs in on behalf of that uid).
func (g *Guard) Login(ctx context.Context, node string, req *wire.LoginRequest) (*wire.LoginResponse, error) {
	g.mu.Lock()
	key := hex.EncodeToString(req.Nonce)
	ch, ok := g.challenges[key]
	delete(g.challenges, key)
	u := g.users.Lookup(req.User)
	g.mu.Unlock()
	if !ok || g.cfg.Now().After(ch.expires) || ch.node != node || ch.uid != req.Uid || ch.user != req.User {
		return nil, fmt.Errorf("login of %s at %s: unknown or expired challenge: %w", req.User, node, fserr.ErrAccess)
	}
	if u == nil {
		return nil, fmt.Errorf("no user %q: %w", req.User, fserr.ErrAccess)
	}
	fp, err := Verify(u, req.PublicKey, req.Signature, Payload(node, req.Uid, req.User, req.Nonce))
	if err != nil {
		g.log.Warn("login refused", "node", node, "uid", req.Uid, "user", req.User, "err", err)
		return nil, fmt.Errorf("%v: %w", err, fserr.ErrAccess)
	}
	l := configsvc.Login{Node: node, UID: u.UID, User: u.Name, Key: fp, Expires: g.cfg.Now().Add(g.cfg.SessionTTL)}
	if err := g.put(ctx, l); err != nil {
		return nil, err
	}
	g.log.Info("user logged in", "node", node, "uid", u.UID, "user", u.Name, "key", fp, "expires", l.Expires)
	return &wire.LoginResponse{Uid: l.UID, User: l.User, ExpiresUnixMs: l.Expires.UnixMilli()}, nil
}

func (g *Guard) put(ctx context.Context, l configsvc.Login) error {
	if err := g.cfg.Store.PutLogin(ctx, l); err != nil {
		return fmt.Errorf("store session: %w", err)
	}
	// Valid here at once, before the watch brings it back.
	g.mu.Lock()
	g.sessions[nodeUID{l.Node, l.UID}] = l
	delete(g.misses, nodeUID{l.Node, l.UID})
	g.mu.Unlock()
	return nil
}

// Renew extends the session of uid at node by the session lifetime, if it
// is still valid (its user and key still listed).
func (g *Guard) Renew(ctx context.Context, node string, uid uint32) (*wire.LoginResponse, error) {
	l, u := g.session(ctx, nodeUID{node, uid})
	if u == nil {
		return nil, fmt.Errorf("uid %d has no valid session at %s to renew: %w", uid, node, fserr.ErrAccess)
	}
	l.Expires = g.cfg.Now().Add(g.cfg.SessionTTL)
	if err := g.put(ctx, l); err != nil {
		return nil, err
	}
	return &wire.LoginResponse{Uid: l.UID, User: l.User, ExpiresUnixMs: l.Expires.UnixMilli()}, nil
}

// Logout ends the session of uid at node at every server.
func (g *Guard) Logout(ctx context.Context, node string, uid uint32) error {
	if err := g.cfg.Store.DeleteLogin(ctx, node, uid); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	g.mu.Lock()
	delete(g.sessions, nodeUID{node, uid})
	g.mu.Unlock()
	g.log.Info("user logged out", "node", node, "uid", uid)
	return nil
}
