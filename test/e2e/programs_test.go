package e2e

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPrograms runs unmodified programs on one mount, in parallel.
func TestPrograms(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	dir := func(t *testing.T) string {
		d := filepath.Join(up.Mnt, strings.ReplaceAll(t.Name(), "/", "_"))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("Git", func(t *testing.T) { t.Parallel(); testGit(t, dir(t)) })
	t.Run("TarGoroot", func(t *testing.T) { t.Parallel(); testTar(t, dir(t)) })
	t.Run("SQLite", func(t *testing.T) { t.Parallel(); testSQLite(t, dir(t)) })
	t.Run("Rsync", func(t *testing.T) { t.Parallel(); testCopyTree(t, dir(t), "rsync") })
	t.Run("CpA", func(t *testing.T) { t.Parallel(); testCopyTree(t, dir(t), "cp") })
	t.Run("Make", func(t *testing.T) { t.Parallel(); testMake(t, dir(t)) })
}

func testGit(t *testing.T, repo string) {
	git := func(args ...string) string {
		t.Helper()
		return mustRun(t, repo, 60*time.Second, "git", append([]string{
			"-c", "user.name=E2E Tester", "-c", "user.email=e2e@example.com",
			"-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"}, args...)...)
	}
	git("init")
	files := map[string]string{
		"README.md":        "# e2e\n",
		"src/main.go":      "package main\n\nfunc main() {}\n",
		"src/lib/util.go":  "package lib\n",
		".gitignore":       "*.o\n",
		"docs/guide/a.txt": strings.Repeat("line\n", 2000),
	}
	for name, body := range files {
		p := filepath.Join(repo, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("add", "-A")
	git("commit", "-q", "-m", "first commit")
	if err := os.WriteFile(filepath.Join(repo, "README.md"), []byte("# e2e\nmore\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(repo, "src", "lib", "util.go"), filepath.Join(repo, "src", "lib", "helpers.go")); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("commit", "-q", "-m", "second commit")
	if log := git("log", "--format=%s"); log != "second commit\nfirst commit\n" {
		t.Errorf("git log = %q", log)
	}
	if st := git("status", "--porcelain"); st != "" {
		t.Errorf("git status --porcelain after commit = %q, want clean", st)
	}
	if out := git("fsck", "--strict"); strings.Contains(out, "error") {
		t.Errorf("git fsck: %s", out)
	}
	if show := git("show", "HEAD~1:README.md"); show != "# e2e\n" {
		t.Errorf("git show HEAD~1:README.md = %q", show)
	}
	git("gc", "-q")
	if st := git("status", "--porcelain"); st != "" {
		t.Errorf("git status --porcelain after gc = %q, want clean", st)
	}
	if log := git("log", "--format=%s"); log != "second commit\nfirst commit\n" {
		t.Errorf("git log after gc = %q", log)
	}
}

func goroot(t *testing.T) string {
	t.Helper()
	out := mustRun(t, "/", 30*time.Second, goBin, "env", "GOROOT")
	return strings.TrimSpace(out)
}

func testTar(t *testing.T, dir string) {
	src := goroot(t)
	tmp := t.TempDir()
	in := filepath.Join(tmp, "in.tar")
	mustRun(t, "/", 2*time.Minute, "tar", "-C", src, "-cf", in, "src")
	mustRun(t, dir, 4*time.Minute, "tar", "-xf", in)
	out := filepath.Join(tmp, "out.tar")
	mustRun(t, dir, 4*time.Minute, "tar", "-cf", out, "src")
	re := filepath.Join(tmp, "re")
	if err := os.Mkdir(re, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, re, 2*time.Minute, "tar", "-xf", out)
	if r := run(t, "/", 2*time.Minute, nil, "diff", "-r", "--no-dereference", filepath.Join(src, "src"), filepath.Join(re, "src")); r.err != nil {
		t.Errorf("diff -r GOROOT/src and its round trip through the mount: %v\n%s", r.err, tail(r.out, 4<<10))
	}
	// tar -c recorded modes, owners and mtimes as the mount reported them.
	compareTrees(t, filepath.Join(src, "src"), filepath.Join(re, "src"), secondsMtime)
}

func testSQLite(t *testing.T, dir string) {
	db := filepath.Join(dir, "test.db")
	sql := func(script string) string {
		t.Helper()
		return strings.TrimSpace(mustRun(t, dir, 2*time.Minute, "sqlite3", "-batch", "-bail", db, script))
	}
	sql(`CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER NOT NULL, s TEXT NOT NULL);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10000)
INSERT INTO t(v, s) SELECT x, hex(randomblob(32)) FROM c;
COMMIT;
CREATE INDEX t_v ON t(v);`)
	// A few separate transactions, each its own sqlite3 process.
	for i := 1; i <= 3; i++ {
		sql(fmt.Sprintf("INSERT INTO t(v, s) VALUES (%d, 'extra');", 100000*i))
	}
	sql("BEGIN; UPDATE t SET v = v + 1 WHERE id <= 10; DELETE FROM t WHERE id = 5000; COMMIT;")
	// count: 10000 + 3 - 1; sum: 1..10000 + 600000 + 10 - 5000
	want := fmt.Sprintf("%d|%d", 10002, 50005000+600000+10-5000)
	if got := sql("SELECT count(*), sum(v) FROM t;"); got != want {
		t.Errorf("count, sum = %q, want %q", got, want)
	}
	if got := sql("PRAGMA integrity_check;"); got != "ok" {
		t.Errorf("integrity_check = %q", got)
	}
	if got := sql("SELECT count(*) FROM t WHERE v BETWEEN 100 AND 199;"); got != "100" {
		t.Errorf("indexed range count = %q, want 100", got)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "test.db" {
			t.Errorf("leftover file %q next to the database (journal not removed?)", e.Name())
		}
	}
}

// makeTree writes a tree with files of several sizes, modes, owners, a
// symlink, an empty directory and old mtimes.
func makeTree(t *testing.T, root string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	old := time.Date(2001, 2, 3, 4, 5, 6, 789000000, time.UTC)
	for i := 0; i < 4; i++ {
		for j := 0; j < 3; j++ {
			d := filepath.Join(root, fmt.Sprintf("d%d", i), fmt.Sprintf("e%d", j))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			for k := 0; k < 5; k++ {
				size := []int{0, 1, 4095, 65536, 65537, 200000}[rng.IntN(6)]
				data := make([]byte, size)
				for x := range data {
					data[x] = byte(rng.Uint32())
				}
				p := filepath.Join(d, fmt.Sprintf("f%d.bin", k))
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				mode := []uint32{0o644, 0o600, 0o755, 0o400, 0o664}[k]
				if err := syscall.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
				if k == 2 {
					if err := os.Lchown(p, user1k, user1k); err != nil {
						t.Fatal(err)
					}
				}
				mt := old.Add(time.Duration(rng.IntN(1e6)) * time.Millisecond).Add(time.Duration(k) * time.Nanosecond)
				if err := os.Chtimes(p, mt, mt); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := os.Symlink("../d1/e1/f0.bin", filepath.Join(root, "d0", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Old directory mtimes everywhere (rsync, like cp, then has to set them:
	// it skips a directory whose mtime is within the same second).
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != root {
			err = os.Chtimes(p, old, old)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// mtimeCheck says how compareTrees compares modification times.
type mtimeCheck int

const (
	exactMtime   mtimeCheck = iota // to the nanosecond (cp -a, rsync -a)
	secondsMtime                   // whole seconds (tar's format keeps no more)
)

// compareTrees compares type, permission bits, size, owner, mtime (of all
// but symlinks), symlink target and contents of every entry.
func compareTrees(t *testing.T, a, b string, mc mtimeCheck) {
	t.Helper()
	seen := map[string]bool{}
	errs := 0
	report := func(format string, args ...any) {
		t.Helper()
		if errs++; errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	err := filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		seen[rel] = true
		q := filepath.Join(b, rel)
		var sa, sb syscall.Stat_t
		if err := syscall.Lstat(p, &sa); err != nil {
			return err
		}
		if err := syscall.Lstat(q, &sb); err != nil {
			report("%s: %v", rel, err)
			return nil
		}
		if sa.Mode != sb.Mode {
			report("%s: mode %o, want %o", rel, sb.Mode, sa.Mode)
		}
		if sa.Mode&syscall.S_IFMT != syscall.S_IFDIR && sa.Size != sb.Size {
			report("%s: size %d, want %d", rel, sb.Size, sa.Size)
		}
		if sa.Uid != sb.Uid || sa.Gid != sb.Gid {
			report("%s: owner %d:%d, want %d:%d", rel, sb.Uid, sb.Gid, sa.Uid, sa.Gid)
		}
		same := sa.Mtim == sb.Mtim
		if mc == secondsMtime {
			same = sa.Mtim.Sec == sb.Mtim.Sec
		}
		if !same && sa.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			report("%s: mtime %v, want %v", rel, time.Unix(sb.Mtim.Unix()), time.Unix(sa.Mtim.Unix()))
		}
		switch sa.Mode & syscall.S_IFMT {
		case syscall.S_IFLNK:
			ta, _ := os.Readlink(p)
			tb, err := os.Readlink(q)
			if err != nil || ta != tb {
				report("%s: link target %q (%v), want %q", rel, tb, err, ta)
			}
		case syscall.S_IFREG:
			da, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			db, err := os.ReadFile(q)
			if err != nil || !bytes.Equal(da, db) {
				report("%s: contents differ (%v)", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", a, err)
	}
	filepath.WalkDir(b, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(b, p); !seen[rel] {
			report("%s: extra entry in copy", rel)
		}
		return nil
	})
	if errs > 20 {
		t.Errorf("... and %d more differences", errs-20)
	}
}

func testCopyTree(t *testing.T, dir, prog string) {
	src := filepath.Join(t.TempDir(), "tree")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	makeTree(t, src)
	if err := os.Chtimes(src, time.Unix(1e9, 5), time.Unix(1e9, 5)); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "tree")
	switch prog {
	case "rsync":
		mustRun(t, "/", 2*time.Minute, "rsync", "-a", src+"/", dst+"/")
	case "cp":
		mustRun(t, "/", 2*time.Minute, "cp", "-a", src, dst)
	}
	if r := run(t, "/", 2*time.Minute, nil, "diff", "-r", "--no-dereference", src, dst); r.err != nil {
		t.Errorf("diff -r after %s: %v\n%s", prog, r.err, tail(r.out, 4<<10))
	}
	compareTrees(t, src, dst, exactMtime)
	// A second rsync finds nothing to transfer.
	if prog == "rsync" {
		out := mustRun(t, "/", 2*time.Minute, "rsync", "-a", "--itemize-changes", src+"/", dst+"/")
		if strings.TrimSpace(out) != "" {
			t.Errorf("second rsync -a transferred again:\n%s", tail(out, 2<<10))
		}
	}
}

const (
	makefile = `CC ?= cc
CFLAGS = -O1 -Wall -Werror

prog: main.o util.o
	$(CC) $(CFLAGS) -o $@ main.o util.o

%.o: %.c util.h
	$(CC) $(CFLAGS) -c -o $@ $<

clean:
	rm -f prog *.o
`
	utilH = `#ifndef UTIL_H
#define UTIL_H
int triangle(int n);
#endif
`
	utilC = `#include "util.h"
int triangle(int n) { return n * (n + 1) / 2; }
`
	mainC = `#include <stdio.h>
#include "util.h"
int main(void) {
	printf("triangle(100) = %d\n", triangle(100));
	return 0;
}
`
)

func testMake(t *testing.T, dir string) {
	for name, body := range map[string]string{"Makefile": makefile, "util.h": utilH, "util.c": utilC, "main.c": mainC} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk := func() string {
		t.Helper()
		return mustRun(t, dir, 2*time.Minute, "make", "--no-print-directory")
	}
	out := mk()
	if !strings.Contains(out, "-o prog") {
		t.Errorf("first make did not link prog:\n%s", out)
	}
	if got := mustRun(t, dir, 30*time.Second, "./prog"); got != "triangle(100) = 5050\n" {
		t.Errorf("./prog printed %q", got)
	}
	if out := mk(); !strings.Contains(out, "up to date") && !strings.Contains(out, "Nothing to be done") {
		t.Errorf("second make rebuilt something:\n%s", out)
	}
	if r := run(t, dir, 30*time.Second, nil, "make", "-q", "prog"); r.code != 0 {
		t.Errorf("make -q prog: exit %d, want 0 (up to date)\n%s", r.code, r.out)
	}
	// Touching one source rebuilds exactly it and the link.
	later := time.Now().Add(2 * time.Second)
	if err := os.Chtimes(filepath.Join(dir, "util.c"), later, later); err != nil {
		t.Fatal(err)
	}
	out = mk()
	if !strings.Contains(out, "util.o util.c") || strings.Contains(out, "main.o main.c") || !strings.Contains(out, "-o prog") {
		t.Errorf("make after touching util.c:\n%s\nwant util.o and prog rebuilt, main.o not", out)
	}
	if got := mustRun(t, dir, 30*time.Second, "./prog"); got != "triangle(100) = 5050\n" {
		t.Errorf("./prog printed %q after rebuild", got)
	}
}
