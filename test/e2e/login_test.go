package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// TestLoginThroughMount: a deployment whose servers require logins (no
// --trust-client-uids). At a client-only mount, alice's uid is refused
// until `wheelfs login --key` as alice, then acts as alice; bob's uid,
// never logged in, stays refused; after `wheelfs logout` alice is refused
// again. The node's own mount (a server host) is trusted throughout.
func TestLoginThroughMount(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for FUSE mounts and setpriv")
	}
	const alice, bob = 1001, 1002
	tmp := t.TempDir()
	// Alice's key and the mount points live where other uids can reach
	// them (t.TempDir's parent is 0700).
	open, err := os.MkdirTemp("", "wheelfs-login-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	mountPoint := func(name string) string {
		p := filepath.Join(open, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, members := startConfigService(t, tmp)
	data, mnt := filepath.Join(tmp, "node-west"), mountPoint("west")
	west := startWheelfs(t, data, mnt, "node", "--config", strings.Join(members, ","), "--site", "west",
		"--listen", "127.0.0.1:0", "--data", data, "--ca", ca, mnt)

	// Alice's key, on disk as a service's would be.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "alice")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(open, "alice_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(keyFile, alice, alice); err != nil {
		t.Fatal(err)
	}
	// The users file, written as root at the server host.
	if err := os.Mkdir(filepath.Join(west.Mnt, ".wheelfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	users := fmt.Sprintf("alice %d %d %s", alice, alice, ssh.MarshalAuthorizedKey(sshPub))
	if err := os.WriteFile(filepath.Join(west.Mnt, ".wheelfs", "users"), []byte(users), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(west.Mnt, "shared"), []byte("for everyone\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	issued := filepath.Join(tmp, "issued-east")
	mustRun(t, tmp, 30*time.Second, wheelfsBin, "ca", "issue", "--ca", ca, "--name", "cli-east", "--out", issued,
		"--config", strings.Join(members, ","))
	mdata, mmnt := filepath.Join(tmp, "mount-east"), mountPoint("east")
	startWheelfs(t, mdata, mmnt, "mount", "--config", members[0], "--site", "east", "--data", mdata,
		"--node-dir", issued, mmnt)
	shared := filepath.Join(mmnt, "shared")

	expect(t, alice, alice, syscall.EACCES, "read", shared)
	// Servers follow the users file once a second: the first login may
	// come before they have read it.
	began := time.Now()
	for {
		r := runAs(t, alice, alice, wheelfsBin, "login", "--key", keyFile, "--mount", mmnt)
		if r.err == nil {
			t.Logf("login after %v", time.Since(began))
			break
		}
		if time.Since(began) > 20*time.Second {
			t.Fatalf("wheelfs login as alice: %v\n%s", r.err, r.out)
		}
		time.Sleep(time.Second)
	}
	expect(t, alice, alice, 0, "read", shared)
	expect(t, alice, alice, 0, "create", filepath.Join(mmnt, "by-alice"))
	st, err := os.Stat(filepath.Join(west.Mnt, "by-alice"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != alice {
		t.Errorf("alice's file is owned by uid %d, want %d", uid, alice)
	}
	// Bob has no session at this client, and cannot borrow alice's key.
	expect(t, bob, bob, syscall.EACCES, "read", shared)
	if r := runAs(t, bob, bob, wheelfsBin, "login", "--key", keyFile, "--mount", mmnt, "--user", "alice"); r.err == nil {
		t.Errorf("bob logged in with alice's key file (unreadable to him): %s", r.out)
	}
	expect(t, bob, bob, syscall.EACCES, "read", shared)

	if r := runAs(t, alice, alice, wheelfsBin, "logout", "--mount", mmnt); r.err != nil {
		t.Fatalf("wheelfs logout as alice: %v\n%s", r.err, r.out)
	}
	expect(t, alice, alice, syscall.EACCES, "read", shared)
	// The server host's own mount trusts its kernel's uids.
	expect(t, bob, bob, 0, "read", filepath.Join(west.Mnt, "shared"))
}
