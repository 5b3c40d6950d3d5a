package deploy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/route"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var root = client.User{Uid: 0, Gid: 0}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func startHost(t *testing.T, dir string) *Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := NewConfig(dir)
	cfg.Logger = testLogger(t)
	cfg.LockTTL = 5 * time.Second
	h, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start host: %v", err)
	}
	return h
}

func errno(err error) syscall.Errno { return fserr.Errno(err) }

func TestOneHostFileLifecycle(t *testing.T) {
	dir := t.TempDir()
	h := startHost(t, dir)
	ctx := context.Background()
	fs := h.Client

	if _, err := fs.Mkdir(ctx, root, "/docs", 0o755); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("wheelfs!"), 3*client.BlockSize/8+123) // several blocks, short tail
	if err := fs.WriteFile(ctx, root, "/docs/big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := fs.ReadFile(ctx, root, "/docs/big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes (err %v), want %d", len(got), err, len(big))
	}
	// A cue in the path: same object, persistent cues recorded on new ones.
	if err := fs.WriteFile(ctx, root, "/.RepLevel=2/docs/.Site=west/small", []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := fs.Resolve(ctx, root, "/docs/small")
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve: %v", err)
	}
	info, err := fs.Info(ctx, root, r.Cues, oid.ID(r.Meta.Id))
	if err != nil {
		t.Fatal(err)
	}
	if info.Cues["RepLevel"] != int32(2) || info.Cues["Site"] != "west" {
		t.Fatalf("persistent cues = %v, want RepLevel 2 and Site west", info.Cues)
	}
	if info.Primary.Server != h.ServerID() || len(info.Replicas) == 0 {
		t.Fatalf("info placement = %+v", info)
	}
	// Malformed cues are EINVAL.
	for _, p := range []string{"/.MaxTime=abc/x", "/.RepLevel=0/x", "/.RepLevel=2/.SyncLevel=3/x"} {
		if _, err := fs.Resolve(ctx, root, p); errno(err) != syscall.EINVAL {
			t.Errorf("resolve %s: err %v, want EINVAL", p, err)
		}
	}
	// Ordinary dot names are names.
	if err := fs.WriteFile(ctx, root, "/docs/.git", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	entries, _, err := fs.ReadDir(ctx, root, client.NoCues, oid.ID(mustResolve(t, fs, "/docs").Id))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if want := []string{".git", "big", "small"}; !equal(names, want) {
		t.Fatalf("readdir = %v, want %v", names, want)
	}

	// Rename over an existing file, then unlink.
	docs := oid.ID(mustResolve(t, fs, "/docs").Id)
	if err := fs.Rename(ctx, root, client.NoCues, docs, "small", docs, "big", 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := fs.ReadFile(ctx, root, "/docs/big"); string(got) != "hi" {
		t.Fatalf("after rename big = %q", got)
	}
	if err := fs.Remove(ctx, root, client.NoCues, oid.Root, "docs", true); errno(err) != syscall.ENOTEMPTY {
		t.Fatalf("rmdir non-empty: %v", err)
	}
	for _, n := range []string{"big", ".git"} {
		if err := fs.Remove(ctx, root, client.NoCues, docs, n, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Remove(ctx, root, client.NoCues, oid.Root, "docs", true); err != nil {
		t.Fatal(err)
	}

	// Everything survives a restart.
	if err := fs.WriteFile(ctx, root, "/keep", big[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h = startHost(t, dir)
	defer h.Close()
	if got, err := h.Client.ReadFile(ctx, root, "/keep"); err != nil || !bytes.Equal(got, big[:1000]) {
		t.Fatalf("after restart: %d bytes, %v", len(got), err)
	}
}

func TestPermissionsEnforcedAtServer(t *testing.T) {
	h := startHost(t, t.TempDir())
	defer h.Close()
	ctx := context.Background()
	fs := h.Client
	alice := client.User{Uid: 1000, Gid: 1000}
	bob := client.User{Uid: 1001, Gid: 1001}
	if err := fs.WriteFile(ctx, alice, "/private", []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.ReadFile(ctx, bob, "/private"); errno(err) != syscall.EACCES {
		t.Fatalf("bob reads alice's 0600 file: %v, want EACCES", err)
	}
	// The root directory is sticky: bob cannot remove alice's file.
	if err := fs.Remove(ctx, bob, client.NoCues, oid.Root, "private", false); !errors.Is(err, fserr.ErrPerm) && errno(err) != syscall.EACCES {
		t.Fatalf("bob unlinks alice's file in sticky root: %v", err)
	}
	m := mustResolve(t, fs, "/private")
	if _, err := fs.SetAttr(ctx, bob, client.NoCues, oid.ID(m.Id), &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o666}); errno(err) != syscall.EPERM {
		t.Fatalf("bob chmods alice's file: %v, want EPERM", err)
	}
}

func mustResolve(t *testing.T, fs *client.FS, path string) *wire.Meta {
	t.Helper()
	r, err := fs.Resolve(context.Background(), root, path)
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	return r.Meta
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAttrsDeferredIntoCommit checks that chmod/chown/utimens on a file
// with buffered writes are checked at once, visible at once, and durable
// with the data after close.
func TestAttrsDeferredIntoCommit(t *testing.T) {
	h := startHost(t, t.TempDir())
	defer h.Close()
	ctx := context.Background()
	fs := h.Client
	alice := client.User{Uid: 1000, Gid: 1000}
	bob := client.User{Uid: 1001, Gid: 1001}
	m, err := fs.Create(ctx, alice, client.NoCues, oid.Root, "f", client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	id := oid.ID(m.Id)
	fh, _, err := fs.Open(ctx, alice, client.NoCues, id, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(ctx, []byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	// Refused at once, as the server would.
	if _, err := fs.SetAttr(ctx, bob, client.NoCues, id, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o777}); errno(err) != syscall.EPERM {
		t.Fatalf("bob chmod: %v, want EPERM", err)
	}
	const mtime = int64(1_600_000_000_000_000_000)
	got, err := fs.SetAttr(ctx, alice, client.NoCues, id, &wire.SetAttrRequest{Valid: wire.SetMode | wire.SetMtime, Mode: 0o600, MtimeNs: mtime})
	if err != nil || got.Mode != 0o600 || got.MtimeNs != mtime || got.Size != 4 {
		t.Fatalf("deferred setattr: %+v, %v", got, err)
	}
	if err := fh.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fh.Release(ctx)
	// The server committed data and attributes together.
	after, err := fs.GetAttr(ctx, alice, client.NoCues, id)
	if err != nil || after.Mode != 0o600 || after.MtimeNs != mtime || after.Size != 4 {
		t.Fatalf("committed meta: %+v, %v", after, err)
	}
}

// TestRenameAcrossSlicesOnOneServer checks that directories in different
// slices (different persistent cues) still rename atomically when one
// server is primary for both.
func TestRenameAcrossSlicesOnOneServer(t *testing.T) {
	h := startHost(t, t.TempDir())
	defer h.Close()
	ctx := context.Background()
	fs := h.Client
	d, err := fs.Mkdir(ctx, root, "/.RepLevel=2/two", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if oid.ID(d.Id).Slice() == oid.Root.Slice() {
		t.Fatal("a directory with other persistent cues should be in another slice")
	}
	if err := fs.WriteFile(ctx, root, "/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(ctx, root, client.NoCues, oid.Root, "f", oid.ID(d.Id), "f", 0); err != nil {
		t.Fatalf("rename into another slice: %v", err)
	}
	if got, err := fs.ReadFile(ctx, root, "/two/f"); err != nil || string(got) != "x" {
		t.Fatalf("after rename: %q, %v", got, err)
	}
}

// TestRemoteClientOverTLS drives the server through gRPC with mutual TLS,
// as a client on another host does, and checks that a client without a
// certificate from the deployment's CA is refused.
func TestRemoteClientOverTLS(t *testing.T) {
	h := startHost(t, t.TempDir())
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := route.New(ctx, h.Conf, route.Options{Logger: testLogger(t), TLS: h.Creds.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	remote := client.New(client.Config{Logger: testLogger(t)}, r)
	data := bytes.Repeat([]byte("remote "), 40000) // several blocks
	if err := remote.WriteFile(ctx, root, "/over-the-wire", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := h.Client.ReadFile(ctx, root, "/over-the-wire"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("local read of a remote write: %d bytes, %v", len(got), err)
	}
	if got, err := remote.ReadFile(ctx, root, "/over-the-wire"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("remote read: %d bytes, %v", len(got), err)
	}
	if _, err := remote.Resolve(ctx, root, "/nope/x"); errno(err) != syscall.ENOENT {
		t.Fatalf("remote error mapping: %v, want ENOENT", err)
	}

	// A client whose certificate comes from another CA gets nowhere.
	other, err := pki.InitCA(filepath.Join(t.TempDir(), "ca"), "intruder")
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := filepath.Join(t.TempDir(), "node")
	if err := other.IssueNodeDir(nodeDir, "intruder", nil, nil); err != nil {
		t.Fatal(err)
	}
	bad, err := pki.LoadCredentials(nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	br, err := route.New(ctx, h.Conf, route.Options{Logger: testLogger(t), TLS: bad.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if _, err := client.New(client.Config{Logger: testLogger(t)}, br).Resolve(sctx, root, "/over-the-wire"); err == nil {
		t.Fatal("a client with a foreign certificate was served")
	}
}

// TestForeignDataDirectory checks that a data directory of one deployment
// pointed at another deployment's configuration service is refused with a
// clear error, not a hang or a silent mix.
func TestForeignDataDirectory(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startHost(t, dirA)
	a.Close()
	b := startHost(t, dirB)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := NewConfig(dirA)
	cfg.Logger = testLogger(t)
	cfg.Etcd = b.ConfigEndpoints()
	start := time.Now()
	h, err := Start(ctx, cfg)
	if err == nil {
		h.Close()
		t.Fatal("a foreign data directory was accepted")
	}
	if !strings.Contains(err.Error(), "another deployment") {
		t.Fatalf("unclear error: %v", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("took %v to refuse", time.Since(start))
	}
}

// TestDataDirectoryInUse checks that a second host on a data directory in
// use fails at once instead of blocking on etcd's lock.
func TestDataDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	h := startHost(t, dir)
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := NewConfig(dir)
	cfg.Logger = testLogger(t)
	if _, err := Start(ctx, cfg); !errors.Is(err, fserr.ErrBusy) {
		t.Fatalf("second host on %s: %v, want a busy error", dir, err)
	}
}

// TestWrongCARecovers checks that a start with another deployment's --ca
// does not poison the data directory: a new directory is removed, an
// existing one keeps credentials that were never accepted only until a
// start with the right --ca re-issues them, and a --ca that disagrees with
// accepted credentials is named in the error.
func TestWrongCARecovers(t *testing.T) {
	a := startHost(t, t.TempDir())
	defer a.Close()
	other := filepath.Join(t.TempDir(), "other-ca")
	if _, err := pki.InitCA(other, "other"); err != nil {
		t.Fatal(err)
	}
	right := filepath.Join(filepath.Dir(a.cfg.DataDir), filepath.Base(a.cfg.DataDir), "ca")
	start := func(dir, ca string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg := NewConfig(dir)
		cfg.Logger, cfg.Roles, cfg.InitCA = testLogger(t), RoleClient, false
		cfg.Etcd, cfg.CADir = a.ConfigEndpoints(), ca
		h, err := Start(ctx, cfg)
		if err == nil {
			h.Close()
		}
		return err
	}

	fresh := filepath.Join(t.TempDir(), "fresh")
	if err := start(fresh, other); !errors.Is(err, ErrForeignData) {
		t.Fatalf("wrong --ca on a new directory: %v", err)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Fatalf("a failed first start left %s behind (%v)", fresh, err)
	}
	if err := start(fresh, right); err != nil {
		t.Fatalf("right --ca after a wrong one: %v", err)
	}

	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := start(used, other); !errors.Is(err, ErrForeignData) {
		t.Fatalf("wrong --ca: %v", err)
	}
	if err := start(used, right); err != nil {
		t.Fatalf("right --ca after a wrong one on a used directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(used, "keep")); err != nil {
		t.Fatalf("a start removed a file it did not create: %v", err)
	}
	err := start(used, other)
	if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), "--ca "+other) ||
		!strings.Contains(err.Error(), `"WheelFS CA other"`) || !strings.Contains(err.Error(), "drop --ca") {
		t.Fatalf("wrong --ca on accepted credentials: %v", err)
	}
}

// TestLeaseUnderCallBound: a lease must be shorter than the clients' call
// bound, because a write may wait one out inside its call (issue 16 item
// 13). The default is a third of the bound; a longer one is refused.
func TestLeaseUnderCallBound(t *testing.T) {
	for _, tc := range []struct {
		name           string
		timeout, lease time.Duration
		want           time.Duration // 0: refused
	}{
		{"defaults", 0, 0, server.DefaultLeaseTTL},
		{"default fits the default bound", client.DefaultTimeout, 0, server.DefaultLeaseTTL},
		{"default under a short bound", 3 * time.Second, 0, time.Second},
		{"set, under the bound", 0, 20 * time.Second, 20 * time.Second},
		{"set, equal to the bound", 0, client.DefaultTimeout, 0},
		{"set, the paper's minute", 0, time.Minute, 0},
		{"no leases", 0, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NewConfig(t.TempDir())
			cfg.Client.Timeout, cfg.Server.LeaseTTL = tc.timeout, tc.lease
			cfg.withDefaults()
			err := cfg.Validate()
			switch {
			case tc.want == 0 && err == nil:
				t.Errorf("lease %v with bound %v accepted", cfg.Server.LeaseTTL, cfg.Client.Timeout)
			case tc.want != 0 && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != 0 && cfg.Server.LeaseTTL != tc.want:
				t.Errorf("lease %v, want %v", cfg.Server.LeaseTTL, tc.want)
			}
			if tc.want == 0 {
				t.Log(err)
			}
		})
	}
	if 3*server.DefaultLeaseTTL > client.DefaultTimeout {
		t.Errorf("the default lease %v is more than a third of the default bound %v", server.DefaultLeaseTTL, client.DefaultTimeout)
	}
}
