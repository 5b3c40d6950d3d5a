package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// coherenceRounds is how many times each check repeats.
const coherenceRounds = 100

// twoSites starts a deployment of separate processes: one configuration
// member and two nodes (server + mount) at sites west and east.
func twoSites(t *testing.T) (a, b *upProc) {
	t.Helper()
	tmp := t.TempDir()
	ca := filepath.Join(tmp, "ca")
	mustRun(t, tmp, 30*time.Second, wheelfsBin, "ca", "init", ca)
	cfg := filepath.Join(tmp, "cfg")
	member := freePort(t)
	startWheelfs(t, cfg, "", "config", "--data", cfg, "--listen", member, "--peer-listen", freePort(t), "--ca", ca)
	node := func(site string) *upProc {
		data, mnt := filepath.Join(tmp, "node-"+site), t.TempDir()
		return startWheelfs(t, data, mnt, "node", "--config", member, "--site", site, "--listen", "127.0.0.1:0",
			"--data", data, "--ca", ca, mnt)
	}
	return node("west"), node("east")
}

// staleness collects what one mount failed to see of the other's changes.
type staleness struct {
	t      *testing.T
	counts map[string]int
}

func (s *staleness) report(kind, format string, args ...any) {
	s.t.Helper()
	s.counts[kind]++
	if s.counts[kind] <= 3 {
		s.t.Errorf(kind+": "+format, args...)
	}
}

func (s *staleness) summary() {
	if len(s.counts) == 0 {
		return
	}
	var kinds []string
	for k, n := range s.counts {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, n))
	}
	slices.Sort(kinds)
	s.t.Errorf("stale views in %d rounds of each check: %s", coherenceRounds, strings.Join(kinds, ", "))
}

func listNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// TestCrossMountCoherence checks close-to-open through the kernel: two
// real FUSE mounts at two sites; what one mount changes and closes, the
// other sees at once — new contents of growing and shrinking files (a
// stale cached size or page would show), created, unlinked and renamed
// names in stat, ls and open — also when the second mount had the file or
// the name cached just before (it read or stat'ed it).
//
// The kernel keeps no names and only lease-bounded attributes, which a
// revoked lease invalidates (internal/fusefs/notify.go); without that the
// "cached" rounds saw stale sizes, names and contents.
func TestCrossMountCoherence(t *testing.T) {
	a, b := twoSites(t)
	da, db := filepath.Join(a.Mnt, "co"), filepath.Join(b.Mnt, "co")
	if err := os.Mkdir(da, 0o755); err != nil {
		t.Fatal(err)
	}

	t.Run("contents", func(t *testing.T) {
		s := &staleness{t: t, counts: map[string]int{}}
		defer s.summary()
		for i := range coherenceRounds {
			// Sizes grow and shrink across block boundaries (64 KiB).
			size := 1 + (i*7919)%200_000
			if i%2 == 1 {
				size = 1 + (i*31)%1000
			}
			want := bytes.Repeat([]byte{byte('a' + i%26)}, size)
			// Cached rounds rewrite one file that B reads before every
			// write; the others write a fresh file twice (B never saw it).
			cached := i%4 < 2
			fa, fb := filepath.Join(da, "f"), filepath.Join(db, "f")
			if !cached {
				fa, fb = filepath.Join(da, fmt.Sprintf("f%d", i)), filepath.Join(db, fmt.Sprintf("f%d", i))
				if err := os.WriteFile(fa, bytes.Repeat([]byte{'z'}, 1+(i*104729)%150_000), 0o644); err != nil {
					t.Fatalf("round %d: first write on A: %v", i, err)
				}
			}
			if cached && i > 0 {
				// B reads and stats the file first: its page cache and
				// attributes hold the previous version.
				if _, err := os.ReadFile(fb); err != nil {
					t.Fatalf("round %d: read on B before the write: %v", i, err)
				}
				if _, err := os.Stat(fb); err != nil {
					t.Fatalf("round %d: stat on B before the write: %v", i, err)
				}
			}
			if err := os.WriteFile(fa, want, 0o644); err != nil {
				t.Fatalf("round %d: write on A: %v", i, err)
			}
			got, err := os.ReadFile(fb)
			switch {
			case err != nil:
				s.report("read on B", "round %d: %v", i, err)
			case !bytes.Equal(got, want):
				s.report("stale contents on B", "round %d (B cached: %v): %d bytes of %q, want %d of %q", i, cached,
					len(got), got[:min(len(got), 1)], size, want[:1])
			}
			if st, err := os.Stat(fb); err != nil || st.Size() != int64(size) {
				s.report("stale size on B", "round %d (B cached: %v): stat %v, %v; want size %d", i, cached, st, err, size)
			}
		}
	})

	t.Run("xattrs", func(t *testing.T) {
		// B reads an attribute (from its lease, once it has one) before
		// every change on A; A's setxattr or removexattr must revoke it.
		s := &staleness{t: t, counts: map[string]int{}}
		defer s.summary()
		fa, fb := filepath.Join(da, "xf"), filepath.Join(db, "xf")
		if err := os.WriteFile(fa, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		get := func(p, name string) (string, error) {
			buf := make([]byte, 256)
			n, err := syscall.Getxattr(p, name, buf)
			if err != nil {
				return "", err
			}
			return string(buf[:n]), nil
		}
		list := func(p string) ([]string, error) {
			buf := make([]byte, 1024)
			n, err := syscall.Listxattr(p, buf)
			if err != nil {
				return nil, err
			}
			return strings.FieldsFunc(string(buf[:n]), func(r rune) bool { return r == 0 }), nil
		}
		for i := range coherenceRounds {
			if _, err := get(fb, "security.selinux"); !errors.Is(err, syscall.ENODATA) {
				s.report("absent attribute on B", "round %d: %v, want ENODATA", i, err)
			}
			get(fb, "user.k")
			want := fmt.Sprintf("value %d", i)
			var err error
			if i%3 == 2 {
				want = ""
				err = syscall.Removexattr(fa, "user.k")
			} else {
				err = syscall.Setxattr(fa, "user.k", []byte(want), 0)
			}
			if err != nil {
				t.Fatalf("round %d: change on A: %v", i, err)
			}
			got, err := get(fb, "user.k")
			names, lerr := list(fb)
			switch {
			case want == "" && !errors.Is(err, syscall.ENODATA):
				s.report("removed attribute on B", "round %d: %q, %v; want ENODATA", i, got, err)
			case want != "" && (err != nil || got != want):
				s.report("stale attribute on B", "round %d: %q, %v; want %q", i, got, err, want)
			case lerr != nil || slices.Contains(names, "user.k") != (want != ""):
				s.report("stale attribute list on B", "round %d: %q, %v (attribute set: %v)", i, names, lerr, want != "")
			}
		}
	})

	t.Run("attributes", func(t *testing.T) {
		// The kernel keeps attributes for up to the lease (10 s): B
		// stats the file before every change on A, and a stat taken on
		// A in the middle of its own write must not outlive the commit
		// at close (which sets size and times at the server).
		s := &staleness{t: t, counts: map[string]int{}}
		defer s.summary()
		fa, fb := filepath.Join(da, "af"), filepath.Join(db, "af")
		if err := os.WriteFile(fa, []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i := range coherenceRounds {
			if _, err := os.Stat(fb); err != nil {
				t.Fatalf("round %d: stat on B: %v", i, err)
			}
			mode := os.FileMode(0o600 | (i%2)*0o044)
			mtime := time.Unix(1_700_000_000+int64(i)*3600, 0)
			if err := os.Chmod(fa, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(fa, mtime, mtime); err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(fb); err != nil || st.Mode().Perm() != mode || !st.ModTime().Equal(mtime) {
				s.report("stale mode or mtime on B", "round %d: %v, %v; want %v, %v", i, st.Mode(), st.ModTime(), mode, mtime)
			}
			// A writes, stats its open file, closes: its next stat shows
			// what B (which had no attributes since the change) sees.
			f, err := os.OpenFile(fa, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(bytes.Repeat([]byte{'w'}, 100+i)); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Stat(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			sa, erra := os.Stat(fa)
			sb, errb := os.Stat(fb)
			if erra != nil || errb != nil {
				t.Fatalf("round %d: stat after close: %v, %v", i, erra, errb)
			}
			ca, cb := sa.Sys().(*syscall.Stat_t).Ctim, sb.Sys().(*syscall.Stat_t).Ctim
			if sa.Size() != int64(100+i) || sb.Size() != sa.Size() || !sa.ModTime().Equal(sb.ModTime()) || ca != cb {
				s.report("attributes after close differ", "round %d: A size %d mtime %v ctime %v; B size %d mtime %v ctime %v; want size %d",
					i, sa.Size(), sa.ModTime(), ca, sb.Size(), sb.ModTime(), cb, 100+i)
			}
		}
	})

	t.Run("names", func(t *testing.T) {
		s := &staleness{t: t, counts: map[string]int{}}
		defer s.summary()
		sees := func(round int, cached bool, name string, want []byte) {
			t.Helper()
			p := filepath.Join(db, name)
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, want) {
				s.report("open on B", "round %d (B cached: %v): %s: %q, %v; want %q", round, cached, name, got, err, want)
			}
			if _, err := os.Stat(p); err != nil {
				s.report("stat on B", "round %d (B cached: %v): %s: %v", round, cached, name, err)
			}
			if names, err := listNames(db); err != nil || !slices.Contains(names, name) {
				s.report("ls on B", "round %d (B cached: %v): %s missing from %v (%v)", round, cached, name, names, err)
			}
		}
		gone := func(round int, cached bool, name string) {
			t.Helper()
			p := filepath.Join(db, name)
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				s.report("stat on B after removal", "round %d (B cached: %v): %s: %v, want ENOENT", round, cached, name, err)
			}
			if _, err := os.ReadFile(p); !errors.Is(err, fs.ErrNotExist) {
				s.report("open on B after removal", "round %d (B cached: %v): %s: %v, want ENOENT", round, cached, name, err)
			}
			if names, err := listNames(db); err != nil || slices.Contains(names, name) {
				s.report("ls on B after removal", "round %d (B cached: %v): %s still in %v (%v)", round, cached, name, names, err)
			}
		}
		warm := func(names ...string) { // B looks at the names first
			for _, n := range names {
				os.Stat(filepath.Join(db, n))
				os.ReadFile(filepath.Join(db, n))
			}
			listNames(db)
		}
		// Each round does one change on A and checks B's view right
		// after; in cached rounds B looked at the names just before.
		for i := range coherenceRounds {
			cached := i%2 == 0
			x, y := fmt.Sprintf("x%d", i), fmt.Sprintf("y%d", i)
			px, py := filepath.Join(da, x), filepath.Join(da, y)
			body := []byte(fmt.Sprintf("round %d\n", i))
			body2 := []byte(fmt.Sprintf("round %d, replacing\n", i))
			write := func(p string, data []byte) {
				t.Helper()
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatalf("round %d: write %s on A: %v", i, p, err)
				}
			}
			change := func(what string, f func() error) {
				t.Helper()
				if err := f(); err != nil {
					t.Fatalf("round %d: %s on A: %v", i, what, err)
				}
			}
			switch op := (i / 2) % 5; op {
			case 0: // create
				if cached {
					warm(x) // a negative lookup
				}
				write(px, body)
				sees(i, cached, x, body)
			case 1: // rename x → y
				write(px, body)
				if cached {
					warm(x, y)
				}
				change("rename", func() error { return os.Rename(px, py) })
				gone(i, cached, x)
				sees(i, cached, y, body)
			case 2: // rename x over an existing y
				write(py, body)
				write(px, body2)
				if cached {
					warm(x, y)
				}
				change("rename over", func() error { return os.Rename(px, py) })
				gone(i, cached, x)
				sees(i, cached, y, body2)
			case 3: // unlink
				write(px, body)
				if cached {
					warm(x)
				}
				change("unlink", func() error { return os.Remove(px) })
				gone(i, cached, x)
			case 4: // mkdir, then rmdir (of the same directory when B has
				// it cached, of one B never looked at otherwise)
				if cached {
					warm(x)
				}
				change("mkdir", func() error { return os.Mkdir(px, 0o755) })
				if st, err := os.Stat(filepath.Join(db, x)); err != nil || !st.IsDir() {
					s.report("stat on B after mkdir", "round %d (B cached: %v): %v", i, cached, err)
				}
				gonedir := x
				if !cached {
					gonedir = y
					change("mkdir", func() error { return os.Mkdir(py, 0o755) })
				}
				change("rmdir", func() error { return syscall.Rmdir(filepath.Join(da, gonedir)) })
				if _, err := os.Stat(filepath.Join(db, gonedir)); !errors.Is(err, fs.ErrNotExist) {
					s.report("stat on B after rmdir", "round %d (B cached: %v): %v, want ENOENT", i, cached, err)
				}
				if !cached {
					change("rmdir", func() error { return syscall.Rmdir(px) })
				}
			}
			os.Remove(py) // leave the directory small
		}
	})

	t.Run("attributes", func(t *testing.T) {
		// B holds the file open and, before every chmod on A, looks it up
		// through its other name, which hands B's kernel the attributes
		// of the one inode both names share; fstat on B's descriptor,
		// answered from what the kernel holds, must show A's new mode at
		// once. The pause lets what earlier requests handed out expire,
		// so that only the lookup's attributes are held (the revocation
		// must reach the inode they went to).
		s := &staleness{t: t, counts: map[string]int{}}
		defer s.summary()
		fa := filepath.Join(da, "af")
		if err := os.WriteFile(fa, []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(fa, filepath.Join(da, "ag")); err != nil {
			t.Fatal(err)
		}
		fd, err := os.Open(filepath.Join(db, "af"))
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		for i := range 16 {
			if i%8 == 4 {
				time.Sleep(7 * time.Second) // past the mount's timeout and slack
			}
			os.Stat(filepath.Join(db, "ag"))
			mode := os.FileMode(0o600 | (i%2)<<5) // 0600, 0640
			if err := os.Chmod(fa, mode); err != nil {
				t.Fatalf("round %d: chmod on A: %v", i, err)
			}
			st, err := fd.Stat()
			if err != nil {
				s.report("fstat on B", "round %d: %v", i, err)
			} else if st.Mode().Perm() != mode {
				s.report("stale mode on B", "round %d: fstat %v; want %v", i, st.Mode().Perm(), mode)
			}
		}
	})
}
