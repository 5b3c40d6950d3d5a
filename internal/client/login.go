package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Challenge is a server's login challenge for one uid and user; the
// answer must go to the same server (the nonce lives there).
type Challenge struct {
	Node  string // this client node as the servers know it
	Uid   uint32
	User  string
	Nonce []byte
	Keys  []string // SHA256 fingerprints of the user's keys
	conn  Conn
}

// Session is a login of this client: requests for Uid act as User until
// Expires, which the client core pushes forward while it runs.
type Session struct {
	Uid     uint32
	User    string
	Expires time.Time
}

// logins are this client's sessions, renewed in the background.
type logins struct {
	mu       sync.Mutex
	sessions map[uint32]Session
	admitted map[uint32]bool // uids a server acted for (mayServe)
	kick     chan struct{}
	once     sync.Once // starts renewLoop
	stopOnce sync.Once
	stop     chan struct{}
}

func newLogins() *logins {
	return &logins{sessions: map[uint32]Session{}, admitted: map[uint32]bool{}, kick: make(chan struct{}, 1),
		stop: make(chan struct{})}
}

// close stops the renewals (Close may run twice: close and crash).
func (l *logins) close() { l.stopOnce.Do(func() { close(l.stop) }) }

// LoginChallenge asks the root directory's primary for a challenge for
// uid (the local uid asking) to log in as user.
func (f *FS) LoginChallenge(ctx context.Context, uid uint32, user string) (*Challenge, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	c, err := f.server(ctx, oid.Root)
	if err != nil {
		return nil, fmt.Errorf("login: %w", err)
	}
	resp, err := c.LoginChallenge(ctx, &wire.LoginChallengeRequest{Uid: uid, User: user})
	if err != nil {
		return nil, fmt.Errorf("login challenge from %s: %w", c.ID, fserr.FromStatus(err))
	}
	return &Challenge{Node: resp.Node, Uid: uid, User: resp.User, Nonce: resp.Nonce, Keys: resp.Keys, conn: c}, nil
}

// Login answers ch with an SSH signature (wire format) by pub (wire
// format) and records the session, which the client core then renews
// until Logout or Close.
func (f *FS) Login(ctx context.Context, ch *Challenge, pub, sig []byte) (Session, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	resp, err := ch.conn.Login(ctx, &wire.LoginRequest{Uid: ch.Uid, User: ch.User, Nonce: ch.Nonce, PublicKey: pub, Signature: sig})
	if err != nil {
		return Session{}, fmt.Errorf("login at %s: %w", ch.conn.ID, fserr.FromStatus(err))
	}
	s := Session{Uid: resp.Uid, User: resp.User, Expires: time.UnixMilli(resp.ExpiresUnixMs)}
	f.logins.mu.Lock()
	f.logins.sessions[s.Uid] = s
	f.logins.mu.Unlock()
	f.logins.once.Do(func() { go f.renewLoop() })
	select {
	case f.logins.kick <- struct{}{}:
	default:
	}
	f.log.Info("logged in", "uid", s.Uid, "user", s.User, "expires", s.Expires)
	return s, nil
}

// mayServe reports whether cached answers may go to u. Servers act for a
// uid of a client host that runs no server only while the uid has a
// session there (wheelfs login, Config.LoginRequired), unless they trust
// client uids: the cache answers for a uid that has a session, or that a
// server has acted for since its last session ended (a trusting server).
func (f *FS) mayServe(u User) bool {
	if !f.cfg.LoginRequired {
		return true
	}
	f.logins.mu.Lock()
	defer f.logins.mu.Unlock()
	_, ok := f.logins.sessions[u.Uid]
	return ok || f.logins.admitted[u.Uid]
}

// noteAdmitted records that a server acted for the uid of req (see
// mayServe). Reading the root directory's attributes does not count: any
// uid may (server.rootAttrs).
func (f *FS) noteAdmitted(req request) {
	if !f.cfg.LoginRequired {
		return
	}
	if g, ok := req.(*wire.GetAttrRequest); ok && oid.ID(g.Id) == oid.Root {
		return
	}
	uid := req.GetCaller().GetUid()
	f.logins.mu.Lock()
	f.logins.admitted[uid] = true
	f.logins.mu.Unlock()
}

// Sessions lists this client's sessions.
func (f *FS) Sessions() []Session {
	f.logins.mu.Lock()
	defer f.logins.mu.Unlock()
	out := make([]Session, 0, len(f.logins.sessions))
	for _, s := range f.logins.sessions {
		out = append(out, s)
	}
	return out
}

// Logout ends uid's session at every server.
func (f *FS) Logout(ctx context.Context, uid uint32) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	f.logins.mu.Lock()
	delete(f.logins.sessions, uid)
	delete(f.logins.admitted, uid)
	f.logins.mu.Unlock()
	if _, err := call(ctx, f, oid.Root, wire.StorageClient.Logout, &wire.SessionRequest{Uid: uid}); err != nil {
		return fmt.Errorf("logout of uid %d: %w", uid, err)
	}
	return nil
}

// renewAt is when a session is renewed: with a third of its life left.
func renewAt(s Session, now time.Time) time.Time {
	return now.Add(s.Expires.Sub(now) * 2 / 3)
}

// renewLoop renews each session when a third of its life is left, so a
// mount keeps its users' sessions while it runs.
func (f *FS) renewLoop() {
	next := map[uint32]time.Time{}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now := time.Now()
		f.logins.mu.Lock()
		due := []Session{}
		wake := now.Add(time.Hour)
		for uid, s := range f.logins.sessions {
			at, ok := next[uid]
			if !ok {
				at = renewAt(s, now)
				next[uid] = at
			}
			if !at.After(now) {
				due = append(due, s)
				continue
			}
			if at.Before(wake) {
				wake = at
			}
		}
		for uid := range next {
			if _, ok := f.logins.sessions[uid]; !ok {
				delete(next, uid)
			}
		}
		f.logins.mu.Unlock()
		for _, s := range due {
			at := f.renew(s)
			next[s.Uid] = at
			if at.Before(wake) {
				wake = at
			}
		}
		t.Reset(time.Until(wake))
		select {
		case <-f.logins.stop:
			return
		case <-f.logins.kick:
			clear(next) // a new login: recompute from the sessions
		case <-t.C:
		}
	}
}

// renew renews s once and returns when to try next.
func (f *FS) renew(s Session) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
	defer cancel()
	resp, err := call(ctx, f, oid.Root, wire.StorageClient.RenewSession, &wire.SessionRequest{Uid: s.Uid})
	now := time.Now()
	if err != nil {
		if errors.Is(err, fserr.ErrAccess) {
			// Logged out elsewhere, or the user or key was removed.
			f.log.Warn("session ended", "uid", s.Uid, "user", s.User, "err", err)
			f.logins.mu.Lock()
			if cur, ok := f.logins.sessions[s.Uid]; ok && cur == s {
				delete(f.logins.sessions, s.Uid)
				delete(f.logins.admitted, s.Uid)
			}
			f.logins.mu.Unlock()
			return now.Add(time.Hour)
		}
		f.log.Warn("session renewal failed; retrying", "uid", s.Uid, "user", s.User, "err", err)
		return now.Add(max(s.Expires.Sub(now)/10, time.Second))
	}
	ns := Session{Uid: resp.Uid, User: resp.User, Expires: time.UnixMilli(resp.ExpiresUnixMs)}
	f.logins.mu.Lock()
	if _, ok := f.logins.sessions[s.Uid]; ok {
		f.logins.sessions[s.Uid] = ns
	}
	f.logins.mu.Unlock()
	return renewAt(ns, now)
}
