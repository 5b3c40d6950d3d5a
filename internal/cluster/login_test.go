package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/wheelfs/wheelfs/internal/auth"
	"github.com/wheelfs/wheelfs/internal/client"
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
