package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
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
)

// MissTTL is how long an unknown (node, uid) is refused from memory
// before the configuration service is asked again: a session made a
// moment ago at another server counts at once, yet a client hammering
// with forged uids costs at most one read per key and period.
const MissTTL = 200 * time.Millisecond

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
	// Keys sign the session records this server writes and check the
	// ones it reads: a record counts only when signed by a server's
	// certificate (pki.Credentials). Without Keys no record counts
	// unless Unsigned.
	Keys SessionKeys
	// Unsigned also admits records without a signature, and lets a server
	// whose certificate lacks the server role write them: the behaviour
	// before records were signed, in which any node that can write to the
	// configuration service can give itself a session (`--unsigned-sessions`,
	// an explicit opt-out for a rolling upgrade; docs/SECURITY.md). A
	// signed record must still verify.
	Unsigned bool
}

// SessionKeys sign and check session records; *pki.Credentials
// implements it.
type SessionKeys interface {
	// SignAsServer signs payload with this server's key, returning its
	// certificate (DER) and the signature; it fails without the server
	// role.
	SignAsServer(payload []byte) (cert, sig []byte, err error)
	// VerifyServerSignature checks sig over payload by cert, which must
	// chain to the deployment's CA and carry the server role, and returns
	// the signer's name.
	VerifyServerSignature(cert, payload, sig []byte) (string, error)
	// Revoked reports whether the node is on the deny list: its
	// signatures stop counting.
	Revoked(node string) bool
}

// SessionPayload is what a server signs for a session record: a domain
// tag, then node, uid, user, key fingerprint and expiry (Unix ns), each
// length-prefixed.
func SessionPayload(l configsvc.Login) []byte {
	var b bytes.Buffer
	b.WriteString("wheelfs-session-v1\x00")
	for _, f := range [][]byte{[]byte(l.Node), binary.BigEndian.AppendUint32(nil, l.UID), []byte(l.User), []byte(l.Key),
		binary.BigEndian.AppendUint64(nil, uint64(l.Expires.UnixNano()))} {
		b.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		b.Write(f)
	}
	return b.Bytes()
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
	sessions   map[nodeUID]session // checked records only
	misses     map[nodeUID]time.Time
	challenges map[string]challenge // by hex nonce
	// checked remembers the records whose signature was verified (by
	// their digest, with the signer), refused those that were not, so
	// that a watch update checks only new records.
	checked map[[32]byte]string
	refused map[[32]byte]bool
}

// session is a record that passed checkRecord, with its signer ("" if
// unsigned).
type session struct {
	configsvc.Login
	signer string
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
		sessions: map[nodeUID]session{}, misses: map[nodeUID]time.Time{},
		challenges: map[string]challenge{}, checked: map[[32]byte]string{}, refused: map[[32]byte]bool{}}
}

// SetUsers replaces the users. Sessions whose user or key is gone stop
// counting at once (Check looks the user up on every request).
func (g *Guard) SetUsers(us *Users) {
	g.mu.Lock()
	g.users = us
	g.mu.Unlock()
	g.log.Info("users file loaded", "users", us.Len())
}

// Run follows the sessions in the store until ctx ends. Records that do
// not pass checkRecord are left out, with a warning the first time.
func (g *Guard) Run(ctx context.Context) {
	for ls := range g.cfg.Store.WatchLogins(ctx) {
		m := make(map[nodeUID]session, len(ls))
		checked := make(map[[32]byte]string, len(ls))
		refused := map[[32]byte]bool{}
		for _, l := range ls {
			d := recordDigest(l)
			g.mu.Lock()
			signer, ok := g.checked[d]
			wasRefused := g.refused[d]
			g.mu.Unlock()
			if !ok && !wasRefused {
				var err error
				if signer, err = g.checkRecord(l); err != nil {
					g.log.Warn("session record refused", "node", l.Node, "uid", l.UID, "user", l.User, "err", err)
					wasRefused = true
				}
			}
			if wasRefused {
				refused[d] = true
				continue
			}
			checked[d] = signer
			m[nodeUID{l.Node, l.UID}] = session{l, signer}
		}
		g.mu.Lock()
		g.sessions, g.checked, g.refused = m, checked, refused
		g.mu.Unlock()
	}
}

// recordDigest identifies a record's contents, signature included.
func recordDigest(l configsvc.Login) [32]byte {
	h := sha256.New()
	for _, f := range [][]byte{SessionPayload(l), l.Cert, l.Sig} {
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		h.Write(f)
	}
	return [32]byte(h.Sum(nil))
}

// errUnsigned refuses a record without a signature.
var errUnsigned = errors.New("auth: session record not signed by a server (written by a node that is not one, or before sessions were signed; --unsigned-sessions admits it)")

// checkRecord checks a session record's signature and returns the
// signer: without it, any node that can write to the configuration
// service could give itself a session.
func (g *Guard) checkRecord(l configsvc.Login) (string, error) {
	if len(l.Sig) == 0 {
		if g.cfg.Unsigned {
			return "", nil
		}
		return "", errUnsigned
	}
	if g.cfg.Keys == nil {
		return "", errors.New("auth: this server cannot check session signatures")
	}
	return g.cfg.Keys.VerifyServerSignature(l.Cert, SessionPayload(l), l.Sig)
}

// sign signs l for other servers; a server that cannot (its certificate
// lacks the server role) writes it unsigned only with Unsigned.
func (g *Guard) sign(l *configsvc.Login) error {
	l.Cert, l.Sig = nil, nil
	var err error
	if g.cfg.Keys == nil {
		err = errors.New("no server key")
	} else if l.Cert, l.Sig, err = g.cfg.Keys.SignAsServer(SessionPayload(*l)); err == nil {
		return nil
	}
	l.Cert, l.Sig = nil, nil
	if g.cfg.Unsigned {
		return nil
	}
	g.log.Warn("login refused: this server cannot sign sessions (re-issue its certificate with `wheelfs ca issue --renew --server`)", "err", err)
	return fmt.Errorf("this server cannot sign sessions (%v): %w", err, fserr.ErrNotSupported)
}

// valid returns the user of a live, checked session whose user and key
// are still in the users file and whose signer is not revoked. g.mu is
// held.
func (g *Guard) validLocked(l session, ok bool) *User {
	if !ok || !g.cfg.Now().Before(l.Expires) {
		return nil
	}
	if l.signer != "" && g.cfg.Keys.Revoked(l.signer) {
		return nil
	}
	u := g.users.Lookup(l.User)
	if u == nil || u.UID != l.UID || !u.HasKey(l.Key) {
		return nil
	}
	return u
}

// session returns the valid session of k, asking the store once per
// MissTTL when this server has not seen it.
func (g *Guard) session(ctx context.Context, k nodeUID) (configsvc.Login, *User) {
	g.mu.Lock()
	s, ok := g.sessions[k]
	u := g.validLocked(s, ok)
	miss, recent := g.misses[k]
	g.mu.Unlock()
	if u != nil || (recent && g.cfg.Now().Sub(miss) < MissTTL) {
		return s.Login, u
	}
	l, ok, err := g.cfg.Store.GetLogin(ctx, k.node, k.uid)
	var signer string
	if err == nil && ok {
		if signer, err = g.checkRecord(l); err != nil {
			g.log.Warn("session record refused", "node", l.Node, "uid", l.UID, "user", l.User, "err", err)
		} else if l.Node != k.node || l.UID != k.uid {
			err = fmt.Errorf("auth: record of (%s, %d) stored as (%s, %d)", l.Node, l.UID, k.node, k.uid)
		}
	}
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
	s = session{l, signer}
	if cur, seen := g.sessions[k]; !seen || cur.Expires.Before(l.Expires) {
		g.sessions[k] = s
	}
	return l, g.validLocked(s, true)
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
	if err := g.sign(&l); err != nil {
		return err
	}
	signer := ""
	if len(l.Sig) > 0 {
		var err error
		if signer, err = g.checkRecord(l); err != nil {
			return fmt.Errorf("session signed by this server does not verify: %w", err)
		}
	}
	if err := g.cfg.Store.PutLogin(ctx, l); err != nil {
		return fmt.Errorf("store session: %w", err)
	}
	// Valid here at once, before the watch brings it back.
	g.mu.Lock()
	g.sessions[nodeUID{l.Node, l.UID}] = session{l, signer}
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
