package configsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Login is a user's session at one client node (issue 13): requests from
// Node for UID act as User until Expires. Every server follows the set
// (WatchLogins), so a session made at one server is valid at all of them,
// and deleting it (logout) reaches all of them. The server that verified
// the login signs the record (auth.SessionPayload), so that writing to
// the configuration service does not make a session.
type Login struct {
	Node    string    `json:"node"`
	UID     uint32    `json:"uid"`
	User    string    `json:"user"`
	Key     string    `json:"key"` // SHA256 fingerprint of the key that logged in
	Expires time.Time `json:"expires"`
	// Cert is the signing server's certificate (DER), Sig its signature;
	// both empty in records written before sessions were signed.
	Cert []byte `json:"cert,omitempty"`
	Sig  []byte `json:"sig,omitempty"`
}

// Logins is the part of the configuration service that keeps sessions.
// EtcdService and Memory clients implement it.
type Logins interface {
	// PutLogin creates or replaces the session of (l.Node, l.UID).
	PutLogin(ctx context.Context, l Login) error
	// DeleteLogin removes the session of (node, uid), if any.
	DeleteLogin(ctx context.Context, node string, uid uint32) error
	// GetLogin reads the session of (node, uid) (linearizable).
	GetLogin(ctx context.Context, node string, uid uint32) (Login, bool, error)
	// WatchLogins delivers every session after each change (first value
	// immediately), coalesced like Watch, until ctx ends or Close.
	WatchLogins(ctx context.Context) <-chan []Login
}

func loginKey(prefix, node string, uid uint32) string {
	return fmt.Sprintf("%slogins/%s/%d", prefix, node, uid)
}

var _ Logins = (*EtcdService)(nil)

// PutLogin implements Logins. The key carries an etcd lease that ends a
// little after Expires, so forgotten sessions do not accumulate; servers
// check Expires themselves.
func (s *EtcdService) PutLogin(ctx context.Context, l Login) error {
	if s.isClosed() {
		return ErrClosed
	}
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	lease, err := s.cli.Grant(ctx, ttlSeconds(time.Until(l.Expires)+time.Minute))
	if err != nil {
		return fmt.Errorf("configsvc: session lease: %w", err)
	}
	if _, err := s.cli.Put(ctx, loginKey(s.opts.Prefix, l.Node, l.UID), string(val), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("configsvc: put session: %w", err)
	}
	return nil
}

// DeleteLogin implements Logins.
func (s *EtcdService) DeleteLogin(ctx context.Context, node string, uid uint32) error {
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	if _, err := s.cli.Delete(ctx, loginKey(s.opts.Prefix, node, uid)); err != nil {
		return fmt.Errorf("configsvc: delete session: %w", err)
	}
	return nil
}

// GetLogin implements Logins.
func (s *EtcdService) GetLogin(ctx context.Context, node string, uid uint32) (Login, bool, error) {
	if s.isClosed() {
		return Login{}, false, ErrClosed
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, loginKey(s.opts.Prefix, node, uid))
	if err != nil {
		return Login{}, false, fmt.Errorf("configsvc: get session: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Login{}, false, nil
	}
	var l Login
	if err := json.Unmarshal(resp.Kvs[0].Value, &l); err != nil {
		return Login{}, false, fmt.Errorf("configsvc: session record: %w", err)
	}
	return l, true, nil
}

// readLogins returns every session and the revision it was read at.
func (s *EtcdService) readLogins(ctx context.Context) ([]Login, int64, error) {
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.opts.Prefix+"logins/", clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	out := make([]Login, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var l Login
		if err := json.Unmarshal(kv.Value, &l); err != nil {
			s.log.Warn("corrupt session record skipped", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, l)
	}
	return out, resp.Header.Revision, nil
}

// WatchLogins implements Logins: read everything, then watch from the
// next revision and read again after each burst of changes.
func (s *EtcdService) WatchLogins(ctx context.Context) <-chan []Login {
	ch := make(chan []Login, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(ch)
		return ch
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel)
		defer stop()
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			err := s.followLogins(ctx, ch)
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			s.log.Debug("session watch restarting", "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}()
	return ch
}

func (s *EtcdService) followLogins(ctx context.Context, ch chan []Login) error {
	ls, rev, err := s.readLogins(ctx)
	if err != nil {
		return err
	}
	sendLatest(ch, ls)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.opts.Prefix+"logins/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return errors.New("session watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			// Drain a burst before reading once.
		drain:
			for {
				select {
				case more, ok := <-wch:
					if !ok {
						return errors.New("session watch closed")
					}
					if err := more.Err(); err != nil {
						return err
					}
				default:
					break drain
				}
			}
			ls, _, err := s.readLogins(ctx)
			if err != nil {
				return err
			}
			sendLatest(ch, ls)
		}
	}
}

var _ Logins = (*memClient)(nil)

// PutLogin implements Logins.
func (c *memClient) PutLogin(ctx context.Context, l Login) error {
	if c.closed() {
		return ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	if c.sp.logins == nil {
		c.sp.logins = map[string]Login{}
	}
	c.sp.logins[loginKey("", l.Node, l.UID)] = l
	c.sp.changedLocked()
	return nil
}

// DeleteLogin implements Logins.
func (c *memClient) DeleteLogin(ctx context.Context, node string, uid uint32) error {
	if c.closed() {
		return ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	delete(c.sp.logins, loginKey("", node, uid))
	c.sp.changedLocked()
	return nil
}

// GetLogin implements Logins.
func (c *memClient) GetLogin(ctx context.Context, node string, uid uint32) (Login, bool, error) {
	if c.closed() {
		return Login{}, false, ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	l, ok := c.sp.logins[loginKey("", node, uid)]
	return l, ok, nil
}

// WatchLogins implements Logins; it sends the whole set after every change
// of the space (cheap at test sizes).
func (c *memClient) WatchLogins(ctx context.Context) <-chan []Login {
	return watchMemory(ctx, c, func(sp *memSpace) []Login {
		ls := make([]Login, 0, len(sp.logins))
		for _, l := range sp.logins {
			ls = append(ls, l)
		}
		return ls
	})
}
