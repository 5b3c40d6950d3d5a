package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// keys returns one private key of each accepted type.
func keys(t *testing.T) map[string]any {
	t.Helper()
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rs, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"ed25519": ed, "ecdsa": ec, "rsa": rs}
}

func signer(t *testing.T, k any) ssh.Signer {
	t.Helper()
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func line(name string, uid uint32, groups string, s ssh.Signer) string {
	return fmt.Sprintf("%s %d %s %s", name, uid, groups, ssh.MarshalAuthorizedKey(s.PublicKey()))
}

func TestParseUsers(t *testing.T) {
	ks := keys(t)
	a, b := signer(t, ks["ed25519"]), signer(t, ks["rsa"])
	good := "# comment\n\n" + line("alice", 1001, "1001,27", a) + line("alice", 1001, "1001,27", b) +
		strings.TrimSuffix(line("u1001", 1002, "1001", b), "\n") + " bob@laptop\n"
	us, err := ParseUsers([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	al := us.Lookup("alice")
	if us.Len() != 2 || al == nil || al.UID != 1001 || len(al.Keys) != 2 || len(al.Groups) != 2 || al.Groups[1] != 27 {
		t.Fatalf("parsed %+v", al)
	}
	if !al.HasKey(ssh.FingerprintSHA256(b.PublicKey())) || us.Lookup("u1001").UID != 1002 {
		t.Fatal("keys or names lost")
	}
	for name, bad := range map[string]string{
		"short":         "alice 1001 1001\n",
		"uid":           strings.Replace(line("alice", 1, "1", a), " 1 ", " x ", 1),
		"gid":           line("alice", 1, "1,y", a),
		"key":           "alice 1 1 ssh-ed25519 AAAAnotakey\n",
		"uid conflict":  line("alice", 1, "1", a) + line("bob", 1, "1", b),
		"uid mismatch":  line("alice", 1, "1", a) + line("alice", 2, "1", b),
		"group differs": line("alice", 1, "1", a) + line("alice", 1, "1,2", b),
	} {
		if _, err := ParseUsers([]byte(bad)); err == nil {
			t.Errorf("%s: parsed %q", name, bad)
		}
	}
}

func FuzzParseUsers(f *testing.F) {
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	s, _ := ssh.NewSignerFromKey(ed)
	f.Add([]byte(line("alice", 1001, "1001,27", s)))
	f.Add([]byte("# x\nbob 2 2 ssh-rsa AAAA\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		us, err := ParseUsers(data)
		if err == nil && us.Len() > 0 {
			for _, u := range us.byName {
				if len(u.Keys) == 0 || len(u.Groups) == 0 {
					t.Fatalf("user %s without keys or groups", u.Name)
				}
			}
		}
	})
}

// TestSignVerify: every key type signs a payload that verifies for its
// owner only; a changed payload, another user's key and a SHA-1 RSA
// signature are refused.
func TestSignVerify(t *testing.T) {
	for typ, k := range keys(t) {
		t.Run(typ, func(t *testing.T) {
			s := signer(t, k)
			other := signer(t, keys(t)["ed25519"])
			us, err := ParseUsers([]byte(line("alice", 1, "1", s) + line("bob", 2, "2", other)))
			if err != nil {
				t.Fatal(err)
			}
			p := Payload("cli-1", 1, "alice", []byte("nonce"))
			sig, err := NewSigner(s).Sign(p)
			if err != nil {
				t.Fatal(err)
			}
			if typ == "rsa" && sig.Format != ssh.KeyAlgoRSASHA256 {
				t.Fatalf("RSA signed with %s", sig.Format)
			}
			pub, raw := s.PublicKey().Marshal(), ssh.Marshal(sig)
			if _, err := Verify(us.Lookup("alice"), pub, raw, p); err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(us.Lookup("alice"), pub, raw, Payload("cli-2", 1, "alice", []byte("nonce"))); err == nil {
				t.Fatal("signature verified for another node")
			}
			if _, err := Verify(us.Lookup("bob"), pub, raw, p); err == nil {
				t.Fatal("alice's key accepted for bob")
			}
			if typ == "rsa" {
				sha1, err := s.Sign(rand.Reader, p) // ssh-rsa: SHA-1
				if err != nil {
					t.Fatal(err)
				}
				if _, err := Verify(us.Lookup("alice"), pub, ssh.Marshal(sha1), p); err == nil {
					t.Fatal("SHA-1 signature accepted")
				}
			}
		})
	}
}

// serveAgent serves an in-memory keyring over a unix socket with the SSH
// agent protocol and returns the socket's path.
func serveAgent(t *testing.T, ring agent.Agent) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { agent.ServeAgent(ring, c); c.Close() }()
		}
	}()
	return sock
}

// agentLogin signs a payload with the agent's key that belongs to alice
// and verifies it as the server would.
func agentLogin(t *testing.T, sock string, us *Users) {
	t.Helper()
	a, err := DialAgent(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ss, err := a.Signers()
	if err != nil {
		t.Fatal(err)
	}
	al := us.Lookup("alice")
	s, err := Pick(ss, al.Fingerprints())
	if err != nil {
		t.Fatalf("%d agent keys: %v", len(ss), err)
	}
	p := Payload("cli-1", al.UID, "alice", []byte("n"))
	sig, err := s.Sign(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(al, s.PublicKey().Marshal(), ssh.Marshal(sig), p); err != nil {
		t.Fatal(err)
	}
}

// TestAgent signs through the SSH agent protocol for each key type: an
// in-memory keyring served on a unix socket, and the ssh-agent binary
// when installed.
func TestAgent(t *testing.T) {
	for typ, k := range keys(t) {
		t.Run(typ, func(t *testing.T) {
			ring := agent.NewKeyring()
			decoy := keys(t)["ed25519"]
			for _, key := range []any{decoy, k} {
				if err := ring.Add(agent.AddedKey{PrivateKey: key}); err != nil {
					t.Fatal(err)
				}
			}
			us, err := ParseUsers([]byte(line("alice", 1, "1", signer(t, k))))
			if err != nil {
				t.Fatal(err)
			}
			agentLogin(t, serveAgent(t, ring), us)
		})
	}
	t.Run("ssh-agent", func(t *testing.T) {
		bin, err := exec.LookPath("ssh-agent")
		if err != nil {
			t.Skip("no ssh-agent binary")
		}
		sock := filepath.Join(t.TempDir(), "a.sock")
		cmd := exec.Command(bin, "-D", "-a", sock)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		poll.Until(t, 5*time.Second, "ssh-agent listens", func() error { _, err := os.Stat(sock); return err })
		k := keys(t)["ed25519"]
		a, err := DialAgent(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if err := a.a.Add(agent.AddedKey{PrivateKey: k}); err != nil {
			t.Fatal(err)
		}
		us, _ := ParseUsers([]byte(line("alice", 1, "1", signer(t, k))))
		agentLogin(t, sock, us)
	})
}

// TestGuardSessions: login, check with the user's groups, expiry,
// renewal, logout, and removal from the users file.
func TestGuardSessions(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1_000_000, 0)
	store := configsvc.NewMemory().Client(configsvc.Options{}).(configsvc.Logins)
	ca := newCA(t)
	g := NewGuard(GuardConfig{Store: store, SessionTTL: time.Hour, Now: func() time.Time { return now }, Keys: nodeCreds(t, ca, "srv-1", true)})
	s := signer(t, keys(t)["ed25519"])
	us, _ := ParseUsers([]byte(line("alice", 1001, "1001,27", s)))
	g.SetUsers(us)

	login := func(node string, uid uint32) error {
		ch, err := g.Challenge(node, uid, "alice")
		if err != nil {
			return err
		}
		sig, _ := NewSigner(s).Sign(Payload(node, uid, "alice", ch.Nonce))
		_, err = g.Login(ctx, node, &wire.LoginRequest{Uid: uid, User: "alice", Nonce: ch.Nonce,
			PublicKey: s.PublicKey().Marshal(), Signature: ssh.Marshal(sig)})
		return err
	}
	check := func(node string, c *wire.Caller) error { return g.Check(ctx, node, c) }
	if err := login("cli-1", 1002); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("uid 1002 logs in as alice: %v", err)
	}
	if err := login("cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	c := &wire.Caller{Uid: 1001, Gid: 0, Groups: []uint32{0}}
	if err := check("cli-1", c); err != nil {
		t.Fatal(err)
	}
	if c.Gid != 1001 || len(c.Groups) != 2 || c.Groups[1] != 27 {
		t.Fatalf("caller not given the user's groups: %+v", c)
	}
	if err := check("cli-2", &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("session valid at another node: %v", err)
	}
	// A challenge answers once.
	ch, _ := g.Challenge("cli-1", 1001, "alice")
	sig, _ := NewSigner(s).Sign(Payload("cli-1", 1001, "alice", ch.Nonce))
	req := &wire.LoginRequest{Uid: 1001, User: "alice", Nonce: ch.Nonce, PublicKey: s.PublicKey().Marshal(), Signature: ssh.Marshal(sig)}
	if _, err := g.Login(ctx, "cli-1", req); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Login(ctx, "cli-1", req); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("replayed login: %v", err)
	}

	// Renewal moves the expiry; without it the session ends.
	now = now.Add(50 * time.Minute)
	if _, err := g.Renew(ctx, "cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	now = now.Add(50 * time.Minute)
	if err := check("cli-1", &wire.Caller{Uid: 1001}); err != nil {
		t.Fatalf("renewed session: %v", err)
	}
	now = now.Add(11 * time.Minute)
	if err := check("cli-1", &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("expired session: %v", err)
	}
	if _, err := g.Renew(ctx, "cli-1", 1001); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("renewal of an expired session: %v", err)
	}

	// Logout is seen by another server's guard through the store.
	if err := login("cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	other := NewGuard(GuardConfig{Store: store, Now: func() time.Time { return now }, Keys: nodeCreds(t, ca, "srv-2", true)})
	other.SetUsers(us)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go other.Run(rctx)
	if err := other.Check(ctx, "cli-1", &wire.Caller{Uid: 1001}); err != nil {
		t.Fatalf("other server: %v", err)
	}
	if err := g.Logout(ctx, "cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "logout reaches the other server", func() error {
		if err := other.Check(ctx, "cli-1", &wire.Caller{Uid: 1001}); err == nil {
			return errors.New("still admitted")
		}
		return nil
	})

	// A user removed from the users file loses its session at once.
	if err := login("cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	g.SetUsers(&Users{})
	if err := check("cli-1", &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("removed user: %v", err)
	}
}
