package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

const (
	nobody = 65534
	user1k = 1000
)

// TestPermissions checks that local users see the permissions of a local
// file system: the kernel (default_permissions) and the server agree.
func TestPermissions(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	mnt := up.Mnt
	// t.TempDir's parent is 0700; let other users reach the mount.
	if err := os.Chmod(filepath.Dir(mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	stat := func(p string) *syscall.Stat_t {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		return &st
	}
	if m := stat(mnt).Mode; m != syscall.S_IFDIR|0o1777 {
		t.Errorf("mount root mode = %o, want %o", m, syscall.S_IFDIR|0o1777)
	}

	rootDir := filepath.Join(mnt, "rootdir")
	if err := os.Mkdir(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(rootDir, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(secret, 0o600); err != nil {
		t.Fatal(err)
	}

	users := []struct {
		name     string
		uid, gid int
	}{{"nobody", nobody, nobody}, {"uid1000", user1k, user1k}}
	for _, u := range users {
		t.Run("AllowOther/"+u.name, func(t *testing.T) {
			expect(t, u.uid, u.gid, 0, "readdir", mnt)
			expect(t, u.uid, u.gid, 0, "readdir", rootDir)
		})
		t.Run("ReadRootOnly/"+u.name, func(t *testing.T) {
			expect(t, u.uid, u.gid, syscall.EACCES, "read", secret)
		})
		t.Run("WriteRootDir/"+u.name, func(t *testing.T) {
			expect(t, u.uid, u.gid, syscall.EACCES, "create", filepath.Join(rootDir, "new-"+u.name))
			expect(t, u.uid, u.gid, syscall.EACCES, "mkdir", filepath.Join(rootDir, "dir-"+u.name))
			expect(t, u.uid, u.gid, syscall.EACCES, "unlink", secret)
			expect(t, u.uid, u.gid, syscall.EACCES, "append", secret, "x")
		})
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "secret" {
		t.Errorf("root reading its 0600 file: %q, %v", b, err)
	}

	t.Run("Sticky", func(t *testing.T) {
		mine := filepath.Join(mnt, "file-of-1000")
		theirs := filepath.Join(mnt, "file-of-nobody")
		expect(t, user1k, user1k, 0, "create", mine)
		expect(t, nobody, nobody, 0, "create", theirs)
		if st := stat(mine); st.Uid != user1k || st.Gid != user1k {
			t.Errorf("file created by 1000 has owner %d:%d", st.Uid, st.Gid)
		}
		// World-writable but sticky: only the owner (or root) may remove.
		expect(t, nobody, nobody, syscall.EPERM, "unlink", mine)
		expect(t, nobody, nobody, syscall.EPERM, "rename", mine, filepath.Join(mnt, "stolen"))
		expect(t, user1k, user1k, syscall.EPERM, "unlink", theirs)
		expect(t, user1k, user1k, syscall.EPERM, "rename", mine, theirs) // would replace nobody's file
		if _, err := os.Stat(mine); err != nil {
			t.Errorf("1000's file after nobody's attempts: %v", err)
		}
		expect(t, user1k, user1k, 0, "unlink", mine)
		expect(t, nobody, nobody, 0, "unlink", theirs)
	})

	t.Run("ChmodOthersFile", func(t *testing.T) {
		f := filepath.Join(mnt, "chmod-of-1000")
		expect(t, user1k, user1k, 0, "create", f)
		expect(t, nobody, nobody, syscall.EPERM, "chmod", f, "777")
		expect(t, nobody, nobody, syscall.EPERM, "chmod", secret, "644")
		expect(t, user1k, user1k, 0, "chmod", f, "600")
		if m := stat(f).Mode & 0o7777; m != 0o600 {
			t.Errorf("mode after owner's chmod 600 = %o", m)
		}
		expect(t, nobody, nobody, syscall.EACCES, "read", f)
	})

	t.Run("SetuidKilledOnWrite", func(t *testing.T) {
		f := filepath.Join(mnt, "suid")
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(f, 0o6777); err != nil {
			t.Fatal(err)
		}
		if m := stat(f).Mode & 0o7777; m != 0o6777 {
			t.Fatalf("mode after chmod 6777 = %o", m)
		}
		// Root (CAP_FSETID) writing keeps the bits, as on a local FS.
		fd, err := os.OpenFile(f, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fd.Write([]byte("# root\n")); err != nil {
			t.Fatal(err)
		}
		if err := fd.Close(); err != nil {
			t.Fatal(err)
		}
		if m := stat(f).Mode & 0o7777; m != 0o6777 {
			t.Errorf("mode after root's write = %o, want 6777", m)
		}
		expect(t, nobody, nobody, 0, "append", f, "# nobody\n")
		st := stat(f)
		if st.Mode&syscall.S_ISUID != 0 {
			t.Errorf("S_ISUID still set after a write by uid %d: mode %o", nobody, st.Mode&0o7777)
		}
		if st.Mode&syscall.S_ISGID != 0 {
			t.Errorf("S_ISGID (with group exec) still set after a write by uid %d: mode %o", nobody, st.Mode&0o7777)
		}
		if st.Mode&0o777 != 0o777 {
			t.Errorf("permission bits changed by the write: mode %o", st.Mode&0o7777)
		}
		if b, err := os.ReadFile(f); err != nil || string(b) != "#!/bin/sh\n# root\n# nobody\n" {
			t.Errorf("contents = %q, %v", b, err)
		}
	})
}
