package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// Exactly-once mutations (issue 16 item 2, server/once.go): the answer to
// a change is lost after the primary applied it, the client retries, and
// the retry must get the original answer — not EEXIST for its own create,
// not ENOENT for its own unlink — at the same server and across a
// failover.

// replyLoss drops the answer of the next request of an armed method at
// the servers (Config.AfterApply), after the change was applied.
type replyLoss struct {
	mu    sync.Mutex
	armed map[string]int
	// then runs when an answer is dropped: in the background (crash the
	// server), or first, before the client hears anything (thenFirst).
	then      func()
	thenFirst bool
	lost      []string
}

func (l *replyLoss) arm(method string, then func(), first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed == nil {
		l.armed = map[string]int{}
	}
	l.armed[method]++
	l.then, l.thenFirst = then, first
}

func (l *replyLoss) hook(method string, _ any) error {
	l.mu.Lock()
	var then func()
	first, hit := l.thenFirst, false
	for m, n := range l.armed {
		if n > 0 && strings.HasSuffix(method, "/"+m) {
			l.armed[m]--
			l.lost = append(l.lost, m)
			then, l.then, hit = l.then, nil, true
			break
		}
	}
	l.mu.Unlock()
	if !hit {
		return nil
	}
	if then != nil && first {
		then()
	} else if then != nil {
		go then()
	}
	return errors.New("reply lost after the change was applied (fault injection)")
}

func (l *replyLoss) dropped() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lost...)
}

func startWithReplyLoss(t *testing.T, o Options) (*Cluster, *replyLoss) {
	loss := &replyLoss{}
	o.Adjust = func(_ *Node, cfg *deploy.Config) { cfg.Server.AfterApply = loss.hook }
	return Start(t, o), loss
}

func TestRetryAfterLostReplyGetsOriginalAnswer(t *testing.T) {
	t.Parallel()
	c, loss := startWithReplyLoss(t, Options{Sites: []string{"west", "east", "eu"}})
	ctx := opCtx(t)
	fs, u := c.Client("west"), Owner()
	if _, err := fs.Mkdir(ctx, u, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	d := resolve(t, ctx, fs, u, "/d").Meta.Id
	dir := oid.ID(d)

	steps := []struct {
		method string
		do     func() error
	}{
		{"Create", func() error { // O_EXCL
			_, err := fs.Create(ctx, u, client.NoCues, dir, "x", client.CreateArgs{Type: client.TypeFile, Mode: 0o644, Exclusive: true})
			return err
		}},
		{"Create", func() error { // mkdir
			_, err := fs.Create(ctx, u, client.NoCues, dir, "sub", client.CreateArgs{Type: client.TypeDir, Mode: 0o755})
			return err
		}},
		{"Link", func() error {
			x := resolve(t, ctx, fs, u, "/d/x").Meta.Id
			_, err := fs.Link(ctx, u, client.NoCues, dir, "y", oid.ID(x))
			return err
		}},
		{"Rename", func() error {
			return fs.Rename(ctx, u, client.NoCues, dir, "y", dir, "z", 0)
		}},
		{"Remove", func() error { // unlink
			return fs.Remove(ctx, u, client.NoCues, dir, "z", false)
		}},
		{"Remove", func() error { // rmdir
			return fs.Remove(ctx, u, client.NoCues, dir, "sub", true)
		}},
		{"SetXattr", func() error { // XATTR_CREATE
			return fs.SetXattr(ctx, u, client.NoCues, dir, "user.k", []byte("v"), 1)
		}},
	}
	for i, st := range steps {
		loss.arm(st.method, nil, false)
		if err := st.do(); err != nil {
			t.Fatalf("step %d (%s) after its answer was lost: %v", i, st.method, err)
		}
	}
	if got := loss.dropped(); len(got) != len(steps) {
		t.Fatalf("answers dropped: %v, want one per step (%d)", got, len(steps))
	}
	// The namespace is what the steps made, once each.
	ents, _, err := fs.ReadDir(ctx, u, client.NoCues, dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	if fmt.Sprint(names) != "[x]" {
		t.Fatalf("/d lists %v, want [x]", names)
	}
	x := resolve(t, ctx, fs, u, "/d/x").Meta
	if x.Nlink != 1 {
		t.Fatalf("/d/x has nlink %d after link, rename and unlink, want 1", x.Nlink)
	}
	if v, err := fs.GetXattr(ctx, u, client.NoCues, dir, "user.k"); err != nil || string(v) != "v" {
		t.Fatalf("user.k = %q, %v", v, err)
	}
	// Answered records go when the session's next change reaches the
	// object: at most the last one stays.
	p, err := c.Primary(ctx, dir.Slice())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := srv(t, p).Outcomes(dir); err != nil || n > 1 {
		t.Fatalf("%d outcome records left on /d (%v), want at most 1", n, err)
	}
}

// TestRetryAcrossFailoverGetsOriginalAnswer: the primary applies a mkdir,
// replicates it, and crashes before answering; the client's retry reaches
// the new primary, which answers from the replicated record.
func TestRetryAcrossFailoverGetsOriginalAnswer(t *testing.T) {
	t.Parallel()
	c, loss := startWithReplyLoss(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, LockTTL: 2 * time.Second})
	ctx := opCtx(t)
	fs, u := c.Client("east"), Owner()
	if _, err := fs.Mkdir(ctx, u, "/.Site=west/d", 0o755); err != nil {
		t.Fatal(err)
	}
	dir := oid.ID(resolve(t, ctx, fs, u, "/d").Meta.Id)
	c.WaitFor(20*time.Second, "/d on three replicas", func() error {
		in, err := info(ctx, fs, "/d")
		if err == nil && len(in.Replicas) != 3 {
			err = fmt.Errorf("replicas %v", in.Replicas)
		}
		return err
	})
	primary, err := c.Primary(ctx, dir.Slice())
	if err != nil {
		t.Fatal(err)
	}
	loss.arm("Create", func() { c.Crash(primary) }, false)
	began := time.Now()
	if _, err := fs.Create(ctx, u, client.NoCues, dir, "made", client.CreateArgs{Type: client.TypeDir, Mode: 0o755, Exclusive: true}); err != nil {
		t.Fatalf("mkdir whose primary crashed before answering: %v", err)
	}
	t.Logf("mkdir answered %v after its primary %s crashed", time.Since(began).Round(time.Millisecond), primary)
	if got := loss.dropped(); len(got) != 1 {
		t.Fatalf("answers dropped: %v, want 1", got)
	}
	if p, err := c.Primary(ctx, dir.Slice()); err != nil || p == primary {
		t.Fatalf("primary after the crash: %v (%v), want another than %s", p, err, primary)
	}
	c.WaitFor(20*time.Second, "/d/made seen from every site", func() error {
		for _, site := range c.Sites() {
			r, err := c.Client(site).Resolve(ctx, u, "/d/made")
			if err != nil {
				return err
			}
			if r.Meta == nil {
				return fmt.Errorf("%s: /d/made missing", site)
			}
		}
		return nil
	})
}

// TestRetriedUnlinkKeepsALaterPut is the shape of the histories the
// linearizability checker could not place (issue 16 item 1): an unlink
// whose answer is lost, a put of the same name by another client that
// completes in between, and the unlink's retry. Run again, the retry
// removed the new name: a readdir then missed a name whose put had
// finished after the unlink.
func TestRetriedUnlinkKeepsALaterPut(t *testing.T) {
	t.Parallel()
	c, loss := startWithReplyLoss(t, Options{Sites: []string{"west", "east", "eu"}})
	ctx := opCtx(t)
	u := Owner()
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, u, "/d", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := west.WriteFile(ctx, u, "/d/n", []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := oid.ID(resolve(t, ctx, west, u, "/d").Meta.Id)
	putErr := make(chan error, 1)
	loss.arm("Remove", func() {
		// Another client's put of n: a temporary file renamed over it.
		err := east.WriteFile(ctx, u, "/d/tmp", []byte("new"), 0o644)
		if err == nil {
			err = east.Rename(ctx, u, client.NoCues, dir, "tmp", dir, "n", 0)
		}
		putErr <- err
	}, true)
	if err := west.Remove(ctx, u, client.NoCues, dir, "n", false); err != nil {
		t.Fatalf("unlink whose answer was lost: %v", err)
	}
	if err := <-putErr; err != nil {
		t.Fatalf("put between the unlink and its retry: %v", err)
	}
	for _, fs := range []*client.FS{west, east} {
		if err := readIs(ctx, fs, "/d/n", []byte("new")); err != nil {
			t.Fatalf("the put that completed after the unlink: %v", err)
		}
	}
}

// TestRetriedCreateKeepsItsRemoteObject is what the linearizability
// checker found in CI (a put whose rename of its own temporary name
// answered ENOENT): the directory's primary commits a create whose
// object another server stored (write-local), then fails the request
// before its backups answered, as losing the slice while replicating
// does. The client's retry is answered from the record with the new
// name; the first attempt must not drop the object the name now points
// at.
func TestRetriedCreateKeepsItsRemoteObject(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	failNext := false
	o := Options{Sites: []string{"west", "east", "eu"}}
	o.Adjust = func(_ *Node, cfg *deploy.Config) {
		cfg.Server.AfterCommit = func(method string) error {
			mu.Lock()
			defer mu.Unlock()
			if !failNext || !strings.HasSuffix(method, "/Create") {
				return nil
			}
			failNext = false
			return fmt.Errorf("lost the slice while replicating (fault injection): %w", fserr.ErrNotPrimary)
		}
	}
	c := Start(t, o)
	ctx := opCtx(t)
	u := Owner()
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, u, "/.Site=west/d", 0o777); err != nil {
		t.Fatal(err)
	}
	dir := oid.ID(resolve(t, ctx, west, u, "/d").Meta.Id)
	mu.Lock()
	failNext = true
	mu.Unlock()
	m, err := east.Create(ctx, u, client.NoCues, dir, "f", client.CreateArgs{Type: client.TypeFile, Mode: 0o644})
	if err != nil {
		t.Fatalf("create whose first attempt failed after its commit: %v", err)
	}
	mu.Lock()
	fired := !failNext
	mu.Unlock()
	if !fired {
		t.Fatal("no create failed after its commit")
	}
	dp, err := c.Primary(ctx, dir.Slice())
	if err != nil {
		t.Fatal(err)
	}
	op, err := c.Primary(ctx, oid.ID(m.Id).Slice())
	if err != nil {
		t.Fatal(err)
	}
	if op == dp {
		t.Fatalf("the object is at the directory's primary %s: want it placed at east", dp)
	}
	// A drop by the first attempt went out before the retry was sent
	// and takes one round trip; this covers it many times over.
	hold := time.Now().Add(2 * time.Second)
	for time.Now().Before(hold) {
		if _, err := east.RevalidateAttr(ctx, u, client.NoCues, oid.ID(m.Id)); err != nil {
			t.Fatalf("the object the create's name points at: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := east.WriteFile(ctx, u, "/d/f", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, west, "/d/f", []byte("kept")); err != nil {
		t.Fatal(err)
	}
}
