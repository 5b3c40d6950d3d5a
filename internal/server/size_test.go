package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// stalledWatch delivers the first table only: a server whose view of the
// configuration service lags (right after start, or cut off from it).
type stalledWatch struct{ configsvc.Service }

func (w stalledWatch) Watch(ctx context.Context) <-chan *configsvc.Table {
	out := make(chan *configsvc.Table, 1)
	in := w.Service.Watch(ctx)
	go func() {
		defer close(out)
		if t, ok := <-in; ok {
			out <- t
		}
		for range in { // drop the rest
		}
	}()
	return out
}

// A server that has not yet seen the other servers register must not take
// its own table's "one server" as the deployment's size and acknowledge a
// write with one copy (issue 16, item 12: a fresh deployment acknowledged
// a close at RepLevel 3 with the other sites cut off).
func TestLaggingTableDoesNotCapReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	mem := configsvc.NewMemory()
	opts := configsvc.Options{LockTTL: 10 * time.Second}
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	conf := stalledWatch{mem.Client(opts)}
	s := New(Config{
		ID: "s1", Site: "site1", Addr: "in-process", LeaseTTL: -1,
		Peers: func(context.Context, string) (wire.PeerClient, error) {
			return nil, errors.New("the other servers are unreachable")
		},
	}, st, conf, 10*time.Second)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		conf.Close()
		st.Close()
	})
	mkdir := func(name string, bound time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		_, err := s.Create(cctx, &wire.CreateRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: name, Type: wire.Type_TYPE_DIR, Mode: 0o755})
		return err
	}
	// Alone in the deployment: one copy is what it has.
	if err := mkdir("alone", 5*time.Second); err != nil {
		t.Fatalf("mkdir with one server in the deployment: %v", err)
	}
	// Two more servers register; s1's table never hears of it.
	others := mem.Client(opts)
	defer others.Close()
	for _, id := range []string{"s2", "s3"} {
		if err := others.Register(ctx, configsvc.ServerInfo{ID: id, Site: "site2", Addr: id}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.deploymentSize(); n != 1 {
		t.Fatalf("the local table counts %d servers; the test needs it to lag (1)", n)
	}
	s.sizeCheck.mu.Lock()
	s.sizeCheck.at = time.Time{} // the first mkdir's confirmation is not older than a second
	s.sizeCheck.mu.Unlock()
	err = mkdir("unreplicated", 2*time.Second)
	if !errors.Is(err, fserr.ErrTimeout) {
		t.Fatalf("mkdir with two unreachable backups to be: %v, want ETIMEDOUT (not acknowledged with one copy)", err)
	}
}
