package configsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Denial puts one node, by its certificate name, on the deny list (issue
// 13, node revocation): every node refuses its connections, and a denied
// server leaves the slice table's registrations and loses its slice locks,
// so maintenance re-replicates its slices as if it had died.
type Denial struct {
	Name   string    `json:"name"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// ErrDenied means the node is on the deny list.
var ErrDenied = errors.New("configsvc: node is revoked")

// Denials is the part of the configuration service that keeps the deny
// list. EtcdService and Memory clients implement it.
type Denials interface {
	// Deny puts d.Name on the deny list, removes its server registration
	// and deletes the slice locks it holds (their next holder gets a
	// higher epoch, so backups refuse the denied primary). Denying again
	// replaces the reason.
	Deny(ctx context.Context, d Denial) error
	// Undeny takes name off the deny list (it may register again).
	Undeny(ctx context.Context, name string) error
	// WatchDenied delivers the whole deny list, sorted by name, after each
	// change (first value immediately), coalesced like Watch, until ctx
	// ends or Close.
	WatchDenied(ctx context.Context) <-chan []Denial
}

func deniedKey(prefix, name string) string { return prefix + "denied/" + name }

func checkDenialName(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("configsvc: deny: invalid node name %q", name)
	}
	return nil
}

var _ Denials = (*EtcdService)(nil)

// Deny implements Denials. The denial and the registration's removal are
// one transaction; the locks follow, each deleted only if the denied node
// still holds it (a lock taken by another server in between stays).
// Acquire refuses a denied holder in the same transaction that would
// create its lock, so no lock of the node can appear afterwards.
func (s *EtcdService) Deny(ctx context.Context, d Denial) error {
	if err := checkDenialName(d.Name); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if d.At.IsZero() {
		d.At = time.Now()
	}
	val, err := json.Marshal(d)
	if err != nil {
		return err
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	if _, err := s.cli.Txn(ctx).Then(
		clientv3.OpPut(deniedKey(s.opts.Prefix, d.Name), string(val)),
		clientv3.OpDelete(s.serversPfx+d.Name),
	).Commit(); err != nil {
		return fmt.Errorf("configsvc: deny %q: %w", d.Name, err)
	}
	resp, err := s.cli.Get(ctx, s.locksPfx, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("configsvc: deny %q: read locks: %w", d.Name, err)
	}
	for _, kv := range resp.Kvs {
		if h, err := parseHolder(kv.Value); err != nil || h != d.Name {
			continue
		}
		k := string(kv.Key)
		if _, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(k)).Commit(); err != nil {
			return fmt.Errorf("configsvc: deny %q: drop lock %s: %w", d.Name, k, err)
		}
	}
	return nil
}

// Undeny implements Denials.
func (s *EtcdService) Undeny(ctx context.Context, name string) error {
	if err := checkDenialName(name); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	if _, err := s.cli.Delete(ctx, deniedKey(s.opts.Prefix, name)); err != nil {
		return fmt.Errorf("configsvc: undeny %q: %w", name, err)
	}
	return nil
}

func (s *EtcdService) readDenied(ctx context.Context) ([]Denial, error) {
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, deniedKey(s.opts.Prefix, ""), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]Denial, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		d := Denial{Name: strings.TrimPrefix(string(kv.Key), deniedKey(s.opts.Prefix, ""))}
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			// A corrupt record still denies: refusing is the safe side.
			s.log.Warn("corrupt denial record", "key", string(kv.Key), "err", err)
		}
		d.Name = strings.TrimPrefix(string(kv.Key), deniedKey(s.opts.Prefix, ""))
		out = append(out, d)
	}
	return out, nil
}

// WatchDenied implements Denials: read the list, then watch its prefix
// and read it again after each burst of changes; restart with backoff
// when the watch fails.
func (s *EtcdService) WatchDenied(ctx context.Context) <-chan []Denial {
	ch := make(chan []Denial, 1)
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
			err := s.followDenied(ctx, ch)
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("deny-list watch restarting", "err", err)
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

func (s *EtcdService) followDenied(ctx context.Context, ch chan []Denial) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// Watch first, then read: a change between the two shows up as an
	// event, and reading again is harmless.
	wch := s.cli.Watch(wctx, deniedKey(s.opts.Prefix, ""), clientv3.WithPrefix())
	ds, err := s.readDenied(ctx)
	if err != nil {
		return err
	}
	sendLatest(ch, ds)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return errors.New("deny-list watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
		}
	drain:
		for {
			select {
			case more, ok := <-wch:
				if !ok {
					return errors.New("deny-list watch closed")
				}
				if err := more.Err(); err != nil {
					return err
				}
			default:
				break drain
			}
		}
		ds, err := s.readDenied(ctx)
		if err != nil {
			return err
		}
		sendLatest(ch, ds)
	}
}

var _ Denials = (*memClient)(nil)

// Deny implements Denials.
func (c *memClient) Deny(ctx context.Context, d Denial) error {
	if err := checkDenialName(d.Name); err != nil {
		return err
	}
	if c.closed() {
		return ErrClosed
	}
	if d.At.IsZero() {
		d.At = time.Now()
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.denied == nil {
		sp.denied = map[string]Denial{}
	}
	sp.denied[d.Name] = d
	delete(sp.servers, d.Name)
	for _, sl := range sp.slices {
		if sl.Holder == d.Name {
			sl.Holder, sl.Epoch = "", 0
		}
	}
	sp.changedLocked()
	return nil
}

// Undeny implements Denials.
func (c *memClient) Undeny(ctx context.Context, name string) error {
	if err := checkDenialName(name); err != nil {
		return err
	}
	if c.closed() {
		return ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	delete(c.sp.denied, name)
	c.sp.changedLocked()
	return nil
}

// WatchDenied implements Denials; it sends the list after every change of
// the space.
func (c *memClient) WatchDenied(ctx context.Context) <-chan []Denial {
	return watchMemory(ctx, c, func(sp *memSpace) []Denial {
		ds := make([]Denial, 0, len(sp.denied))
		for _, d := range sp.denied {
			ds = append(ds, d)
		}
		slices.SortFunc(ds, func(a, b Denial) int { return strings.Compare(a.Name, b.Name) })
		return ds
	})
}
