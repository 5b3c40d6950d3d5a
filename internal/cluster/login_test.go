package cluster

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/wheelfs/wheelfs/internal/auth"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// loginAs logs uid in as user at fs with signer.
func loginAs(ctx context.Context, fs *client.FS, uid uint32, user string, signer ssh.Signer) error {
	ch, err := fs.LoginChallenge(ctx, uid, user)
	if err != nil {
		return err
	}
	s, err := auth.Pick([]auth.Signer{auth.NewSigner(signer)}, ch.Keys)
	if err != nil {
		return err
	}
	sig, err := s.Sign(auth.Payload(ch.Node, ch.Uid, ch.User, ch.Nonce))
	if err != nil {
		return err
	}
	_, err = fs.Login(ctx, ch, s.PublicKey().Marshal(), ssh.Marshal(sig))
	return err
}

func usersLine(name string, uid uint32, groups string, s ssh.Signer) string {
	return fmt.Sprintf("%s %d %s %s", name, uid, groups, ssh.MarshalAuthorizedKey(s.PublicKey()))
}

// TestLoginActsAsUser: with logins required, a client host acts for a uid
// only once that user logged in there; a forged uid or forged groups get
// nothing; the session is valid at every server; removing the user's key
// from /.wheelfs/users, or logging out, ends it.
func TestLoginActsAsUser(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}, Logins: true, UsersPeriod: 50 * time.Millisecond})
	ctx := opCtx(t)
	admin := c.Node("west-0").Client() // a server's host: trusted
	root := client.User{}
	_, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	alice, _ := ssh.NewSignerFromKey(aliceKey)
	bobKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	bob, _ := ssh.NewSignerFromKey(bobKey)
	const aliceUID, bobUID = 2001, 2002
	aliceU := client.User{Uid: aliceUID, Gid: 2001}
	bobU := client.User{Uid: bobUID, Gid: 2002}

	if _, err := admin.Mkdir(ctx, root, "/.wheelfs", 0o755); err != nil {
		t.Fatal(err)
	}
	users := usersLine("alice", aliceUID, "2001", alice) + usersLine("bob", bobUID, "2002", bob)
	if err := admin.WriteFile(ctx, root, auth.UsersPath, []byte(users), 0o644); err != nil {
		t.Fatal(err)
	}
	// A group-only file of group 0 (forged groups must not reach it) and
	// a home directory per user.
	if err := admin.WriteFile(ctx, root, "/staff", []byte("secret"), 0o070); err != nil {
		t.Fatal(err)
	}
	for _, u := range []client.User{aliceU, bobU} {
		home := fmt.Sprintf("/home%d", u.Uid)
		a, err := admin.Mkdir(ctx, root, home, 0o700)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ChangeAttr(ctx, root, cue.Set{}, oid.ID(a.Id), client.AttrChange{Valid: wire.SetUID | wire.SetGID, Uid: u.Uid, Gid: u.Gid}); err != nil {
			t.Fatal(err)
		}
	}

	east := c.Client("east")
	refused := func(u client.User, path string) error {
		_, err := east.ReadFile(ctx, u, path)
		if !errors.Is(err, fserr.ErrAccess) {
			return fmt.Errorf("read %s as uid %d: %v, want EACCES", path, u.Uid, err)
		}
		return nil
	}
	// Before any login even the root directory is refused.
	if err := refused(aliceU, "/home2001/x"); err != nil {
		t.Fatal(err)
	}
	// The servers read the users file in the background.
	poll.Until(t, 10*time.Second, "alice logs in", func() error { return loginAs(ctx, east, aliceUID, "alice", alice) })
	if err := loginAs(ctx, east, bobUID, "bob", alice); !errors.Is(err, auth.ErrNoKey) {
		t.Fatalf("bob's login with alice's key: %v", err)
	}
	// A signature by a key that is not bob's is refused by the server too.
	ch, err := east.LoginChallenge(ctx, bobUID, "bob")
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := alice.Sign(rand.Reader, auth.Payload(ch.Node, ch.Uid, ch.User, ch.Nonce))
	if _, err := east.Login(ctx, ch, alice.PublicKey().Marshal(), ssh.Marshal(sig)); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("login as bob signed by alice's key: %v, want EACCES", err)
	}

	// Alice acts as alice: a file in her home (the home's primary is a
	// west server, the new file is placed at the client's site, east).
	if err := east.WriteFile(ctx, aliceU, "/home2001/x", []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := east.ReadFile(ctx, aliceU, "/home2001/x"); err != nil || string(got) != "mine" {
		t.Fatalf("alice reads her file: %q, %v", got, err)
	}
	// Forged: bob's uid (no session), alice with group 0 claimed.
	for _, err := range []error{
		refused(bobU, "/home2002/none"),
		refused(client.User{Uid: aliceUID, Gid: 0, Groups: []uint32{0}}, "/staff"),
		refused(root, "/staff"),
	} {
		if err != nil {
			t.Error(err)
		}
	}
	if a, err := east.GetAttr(ctx, aliceU, cue.Set{}, east.Root()); err != nil {
		t.Fatalf("alice stats the root: %v", err)
	} else if a.Id == 0 {
		t.Fatal("no root attributes")
	}

	// Bob logs in, then out: his session is gone at every server.
	if err := loginAs(ctx, east, bobUID, "bob", bob); err != nil {
		t.Fatal(err)
	}
	if err := east.WriteFile(ctx, bobU, "/home2002/y", []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := east.Logout(ctx, bobUID); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "bob refused after logout", func() error { return refused(bobU, "/home2002/y") })

	// Removing alice from the users file ends her session.
	if err := admin.WriteFile(ctx, root, auth.UsersPath, []byte(usersLine("bob", bobUID, "2002", bob)), 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "alice refused after her removal", func() error { return refused(aliceU, "/home2001/x") })
	if err := loginAs(ctx, east, aliceUID, "alice", alice); !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("login of a removed user: %v, want EACCES", err)
	}
}

// TestForgedSessionRefused (issue 13): a client host whose certificate may
// write to the configuration service (its authentication off here, as a
// deployment that opted out) writes itself login records for a uid
// nobody logged in as there — unsigned, signed with its own node key,
// and another node's genuine record moved to its name — and the servers
// refuse that uid from it (EACCES). A real login then works: only a
// server's signature makes a session.
func TestForgedSessionRefused(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}, Logins: true, UsersPeriod: 50 * time.Millisecond})
	ctx := opCtx(t)
	admin := c.Node("west-0").Client()
	root := client.User{}
	_, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	alice, _ := ssh.NewSignerFromKey(aliceKey)
	const aliceUID = 2001
	aliceU := client.User{Uid: aliceUID, Gid: 2001}
	if _, err := admin.Mkdir(ctx, root, "/.wheelfs", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := admin.WriteFile(ctx, root, auth.UsersPath, []byte(usersLine("alice", aliceUID, "2001", alice)), 0o644); err != nil {
		t.Fatal(err)
	}
	// One file whose primary is at each site.
	files := []string{"/at-west", "/.Site=east/at-east"}
	for _, f := range files {
		if err := admin.WriteFile(ctx, root, f, []byte("alice's"), 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := admin.Resolve(ctx, root, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ChangeAttr(ctx, root, cue.Set{}, oid.ID(a.Meta.Id), client.AttrChange{Valid: wire.SetUID | wire.SetGID, Uid: aliceUID, Gid: 2001}); err != nil {
			t.Fatal(err)
		}
	}
	east := c.Client("east")
	eastNode := c.ClientNode("east")
	refused := func(what string) {
		t.Helper()
		// Past the servers' memory of the earlier refusal, so that each
		// reads the record just written and judges its signature.
		time.Sleep(auth.MissTTL + 50*time.Millisecond)
		for _, f := range files {
			if _, err := east.ReadFile(ctx, aliceU, f); !errors.Is(err, fserr.ErrAccess) {
				t.Errorf("%s: alice at east reads %s: %v, want EACCES", what, f, err)
			}
		}
	}
	refused("no record")

	// The client host's own etcd client writes the records.
	store := eastNode.Host().Conf.(configsvc.Logins)
	forged := configsvc.Login{Node: eastNode.ID(), UID: aliceUID, User: "alice",
		Key: ssh.FingerprintSHA256(alice.PublicKey()), Expires: time.Now().Add(time.Hour)}
	if err := store.PutLogin(ctx, forged); err != nil {
		t.Fatalf("the client host writes a record (configuration service auth off): %v", err)
	}
	refused("an unsigned record")

	creds := eastNode.Host().Creds
	sum := sha256.Sum256(auth.SessionPayload(forged))
	sig, err := creds.Current().PrivateKey.(crypto.Signer).Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	ownKey := forged
	ownKey.Cert, ownKey.Sig = creds.Current().Certificate[0], sig
	if err := store.PutLogin(ctx, ownKey); err != nil {
		t.Fatal(err)
	}
	refused("a record signed with the client host's key")

	// Alice really logs in at west's client host; east copies the
	// record, signed by a server, under its own name.
	west := c.Client("west")
	poll.Until(t, 10*time.Second, "alice logs in at west", func() error { return loginAs(ctx, west, aliceUID, "alice", alice) })
	real, ok, err := store.GetLogin(ctx, c.ClientNode("west").ID(), aliceUID)
	if err != nil || !ok || len(real.Sig) == 0 {
		t.Fatalf("west's session record: %+v, %v, %v", real, ok, err)
	}
	moved := real
	moved.Node = eastNode.ID()
	if err := store.PutLogin(ctx, moved); err != nil {
		t.Fatal(err)
	}
	refused("west's signed record moved to east")
	for _, f := range files {
		if _, err := west.ReadFile(ctx, aliceU, f); err != nil {
			t.Errorf("alice at west, logged in there: %s: %v", f, err)
		}
	}

	// A real login at east admits her there.
	if err := loginAs(ctx, east, aliceUID, "alice", alice); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, err := east.ReadFile(ctx, aliceU, f); err != nil {
			t.Errorf("alice at east after her login: %s: %v", f, err)
		}
	}
}
