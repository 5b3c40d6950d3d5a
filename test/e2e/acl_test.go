package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two named users of the ACL tests, neither the owner nor in its group.
const (
	aclUserA = 1001
	aclUserB = 1002
	aclOther = 1003
)

// TestACL sets and reads POSIX ACLs with setfacl and getfacl through the
// mount and checks that two named users and a named group get what their
// entries (limited by the mask) give, that chmod moves the mask, and that a directory's
// default ACL is inherited by what is created in it, without the umask.
func TestACL(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"setfacl", "getfacl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (Debian package acl; scripts/test.sh installs it): %v", tool, err)
		}
	}
	up := startUp(t, t.TempDir())
	mnt := up.Mnt
	if err := os.Chmod(filepath.Dir(mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	tool := func(name string, args ...string) string {
		t.Helper()
		r := run(t, "/", 30*time.Second, nil, name, args...)
		if r.err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, r.err, r.out)
		}
		return r.stdout
	}
	// getfacl's entries, without the comment header.
	getfacl := func(args ...string) []string {
		t.Helper()
		return strings.Fields(tool("getfacl", append([]string{"--omit-header", "--numeric"}, args...)...))
	}
	has := func(what string, got []string, want ...string) {
		t.Helper()
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				t.Errorf("%s: %q lacks %q", what, got, w)
			}
		}
	}
	mode := func(p string) uint32 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 0o7777
	}

	f := filepath.Join(mnt, "shared")
	if err := os.WriteFile(f, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o640); err != nil {
		t.Fatal(err)
	}
	t.Run("Access", func(t *testing.T) {
		expect(t, aclUserA, aclUserA, syscall.EACCES, "read", f)
		tool("setfacl", "-m", "u:1001:rw,u:1002:r", f)
		has("getfacl", getfacl(f), "user:1001:rw-", "user:1002:r--", "group::r--", "mask::rw-", "other::---")
		if m := mode(f); m != 0o660 {
			t.Errorf("mode after setfacl = %o, want 660 (group bits are the mask)", m)
		}
		expect(t, aclUserA, aclUserA, 0, "read", f)
		expect(t, aclUserA, aclUserA, 0, "append", f, "a")
		expect(t, aclUserB, aclUserB, 0, "read", f)
		expect(t, aclUserB, aclUserB, syscall.EACCES, "append", f, "b")
		expect(t, aclOther, aclOther, syscall.EACCES, "read", f)
		// Only the owner may change an ACL.
		r := runAs(t, aclUserA, aclUserA, "setfacl", "-m", "u:1003:rw", f)
		if r.err == nil || !strings.Contains(r.out, "not permitted") {
			t.Errorf("setfacl by a named user: %v\n%s", r.err, r.out)
		}
	})
	t.Run("ChmodMovesMask", func(t *testing.T) {
		if err := os.Chmod(f, 0o640); err != nil {
			t.Fatal(err)
		}
		has("getfacl after chmod 640", getfacl(f), "user:1001:rw-", "mask::r--", "#effective:r--")
		expect(t, aclUserA, aclUserA, 0, "read", f)
		expect(t, aclUserA, aclUserA, syscall.EACCES, "append", f, "a")
		if err := os.Chmod(f, 0o660); err != nil {
			t.Fatal(err)
		}
		expect(t, aclUserA, aclUserA, 0, "append", f, "a")
	})
	t.Run("NamedGroup", func(t *testing.T) {
		g := filepath.Join(mnt, "group-shared")
		if err := os.WriteFile(g, []byte("g"), 0o600); err != nil {
			t.Fatal(err)
		}
		tool("setfacl", "-m", "g:3000:r", g)
		// uid 1003 with supplementary group 3000 reads; without it not.
		r := run(t, "/", 30*time.Second, []string{helperEnv + "=1"}, "setpriv", "--reuid=1003", "--regid=1003",
			"--groups=3000", "--", helperBin, "read", g)
		if r.err != nil || strings.TrimSpace(r.stdout) != "errno=0" {
			t.Errorf("uid 1003 in group 3000 reading: %v %q", r.err, r.out)
		}
		expect(t, aclOther, aclOther, syscall.EACCES, "read", g)
	})
	t.Run("Remove", func(t *testing.T) {
		g := filepath.Join(mnt, "removed")
		if err := os.WriteFile(g, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		tool("setfacl", "-m", "u:1001:r", g)
		expect(t, aclUserA, aclUserA, 0, "read", g)
		tool("setfacl", "-b", g)
		if got := getfacl(g); len(got) != 3 {
			t.Errorf("getfacl after setfacl -b = %q, want the three mode entries", got)
		}
		expect(t, aclUserA, aclUserA, syscall.EACCES, "read", g)
	})
	t.Run("Default", func(t *testing.T) {
		d := filepath.Join(mnt, "project")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		tool("setfacl", "-m", "u:1001:rwx,u:1002:rx", d)
		tool("setfacl", "-d", "-m", "u:1001:rwx,u:1002:rx,o::-", d)
		has("getfacl -d", getfacl("-d", d), "user::rwx", "user:1001:rwx", "user:1002:r-x", "group::r-x", "mask::rwx", "other::---")

		// Created by the owner under umask 077: the default ACL replaces
		// the umask, so the mask is what the create mode allows (rw-).
		byRoot := filepath.Join(d, "by-root")
		expect(t, 0, 0, 0, "createmode", byRoot, "666", "077")
		has("inherited by a file", getfacl(byRoot), "user:1001:rwx", "#effective:rw-", "user:1002:r-x", "#effective:r--", "mask::rw-", "other::---")
		if m := mode(byRoot); m != 0o660 {
			t.Errorf("inherited file mode = %o, want 660", m)
		}
		if got := getfacl("-d", byRoot); len(got) != 0 {
			t.Errorf("a file has a default ACL: %q", got)
		}
		expect(t, aclUserA, aclUserA, 0, "append", byRoot, "a")
		expect(t, aclUserB, aclUserB, 0, "read", byRoot)
		expect(t, aclUserB, aclUserB, syscall.EACCES, "append", byRoot, "b")
		expect(t, aclOther, aclOther, syscall.EACCES, "read", byRoot)

		// A named user creates a directory: it inherits the default ACL
		// both as its access ACL and as its own default ACL.
		sub := filepath.Join(d, "sub-of-1001")
		expect(t, aclUserA, aclUserA, 0, "mkdirmode", sub, "777", "022")
		has("inherited by a directory", getfacl(sub), "user::rwx", "user:1001:rwx", "user:1002:r-x", "mask::rwx", "other::---")
		has("default of the new directory", getfacl("-d", sub), "user:1001:rwx", "user:1002:r-x")
		deep := filepath.Join(sub, "by-1002")
		expect(t, aclUserB, aclUserB, syscall.EACCES, "createmode", deep, "644", "022")
		expect(t, aclUserA, aclUserA, 0, "createmode", filepath.Join(sub, "by-1001"), "644", "022")
		expect(t, aclUserB, aclUserB, 0, "read", filepath.Join(sub, "by-1001"))

		// Without a default ACL the umask still applies.
		plain := filepath.Join(mnt, "plain")
		expect(t, 0, 0, 0, "createmode", plain, "666", "027")
		if m := mode(plain); m != 0o640 {
			t.Errorf("mode of a file created under umask 027 = %o, want 640", m)
		}
	})
}

// TestACLAcrossMounts changes an ACL at one site and checks that the other
// site's kernel, which caches the ACLs it enforces, follows at once: the
// change revokes the other client's lease, which drops the kernel's copy.
func TestACLAcrossMounts(t *testing.T) {
	t.Parallel()
	west, east := twoSites(t)
	for _, m := range []string{west.Mnt, east.Mnt} {
		if err := os.Chmod(filepath.Dir(m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(west.Mnt, "f")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	fEast := filepath.Join(east.Mnt, "f")
	for round := range 5 {
		expect(t, aclUserA, aclUserA, syscall.EACCES, "read", f) // the kernel now caches "no ACL"
		mustRun(t, "/", 30*time.Second, "setfacl", "-m", "u:1001:r", fEast)
		expect(t, aclUserA, aclUserA, 0, "read", f)
		mustRun(t, "/", 30*time.Second, "setfacl", "-x", "u:1001", fEast)
		if t.Failed() {
			t.Fatalf("round %d", round)
		}
	}
}
