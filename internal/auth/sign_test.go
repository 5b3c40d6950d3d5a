package auth

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.InitCA(filepath.Join(t.TempDir(), "ca"), "auth-test")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// nodeCreds issues credentials for name from ca, with the server role if
// server.
func nodeCreds(t *testing.T, ca *pki.CA, name string, server bool) *pki.Credentials {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	c := *ca
	c.Server = server
	if err := c.IssueNodeDir(dir, name, nil, nil); err != nil {
		t.Fatal(err)
	}
	creds, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// TestGuardSignedSessions (issue 13): a session record counts only when a
// server of the deployment signed it. Records written straight into the
// store — unsigned, signed by a client host's certificate, by a server of
// another CA, altered after signing, or signed by a server revoked since —
// admit nobody, whether they arrive through the watch or are read on a
// miss. --unsigned-sessions (Unsigned) admits unsigned ones only.
func TestGuardSignedSessions(t *testing.T) {
	ctx := t.Context()
	store := configsvc.NewMemory().Client(configsvc.Options{}).(configsvc.Logins)
	ca := newCA(t)
	srv := nodeCreds(t, ca, "srv-1", true)
	s := signer(t, keys(t)["ed25519"])
	us, _ := ParseUsers([]byte(line("alice", 1001, "1001", s)))
	fp := ssh.FingerprintSHA256(s.PublicKey())
	record := func(node string) configsvc.Login {
		return configsvc.Login{Node: node, UID: 1001, User: "alice", Key: fp, Expires: time.Now().Add(time.Hour)}
	}
	signed := func(c *pki.Credentials, l configsvc.Login) configsvc.Login {
		cert, sig, err := c.SignAsServer(SessionPayload(l))
		if err != nil {
			t.Fatal(err)
		}
		l.Cert, l.Sig = cert, sig
		return l
	}
	// A client host's certificate cannot sign at all; forge with its key
	// by hand.
	client := nodeCreds(t, ca, "cli-x", false)
	if _, _, err := client.SignAsServer([]byte("x")); !errors.Is(err, pki.ErrNotServer) {
		t.Fatalf("a client certificate signs: %v", err)
	}
	byClient := record("cli-client")
	byForeign := signed(nodeCreds(t, newCA(t), "srv-foreign", true), record("cli-foreign"))
	altered := signed(srv, record("cli-altered"))
	altered.Expires = altered.Expires.Add(24 * time.Hour) // still a valid record but for the signature
	revoked := nodeCreds(t, ca, "srv-revoked", true)
	byRevoked := signed(revoked, record("cli-revoked"))
	{
		// A valid signature by the client's own key, its certificate
		// attached: only the role is missing.
		sum := sha256.Sum256(SessionPayload(byClient))
		sig, err := client.Current().PrivateKey.(crypto.Signer).Sign(rand.Reader, sum[:], crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		byClient.Cert, byClient.Sig = client.Current().Certificate[0], sig
	}
	forged := map[string]configsvc.Login{
		"unsigned":         record("cli-unsigned"),
		"by a client host": byClient,
		"by another CA":    byForeign,
		"altered":          altered,
		"by a revoked":     byRevoked,
	}
	good := signed(srv, record("cli-good"))
	for _, l := range append([]configsvc.Login{good}, func() (ls []configsvc.Login) {
		for _, l := range forged {
			ls = append(ls, l)
		}
		return
	}()...) {
		if err := store.PutLogin(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	// The verifying server knows srv-revoked is revoked.
	verifier := nodeCreds(t, ca, "srv-2", true)
	verifier.Deny.Set([]string{"srv-revoked"})

	for _, watch := range []bool{false, true} {
		g := NewGuard(GuardConfig{Store: store, Keys: verifier})
		g.SetUsers(us)
		if watch {
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go g.Run(rctx)
		}
		poll.Until(t, 5*time.Second, "the signed session admitted", func() error {
			return g.Check(ctx, "cli-good", &wire.Caller{Uid: 1001})
		})
		for what, l := range forged {
			if err := g.Check(ctx, l.Node, &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
				t.Errorf("watch=%v: a record %s admitted: %v", watch, what, err)
			}
		}
	}

	// Revoking the signer later ends the sessions it signed.
	g := NewGuard(GuardConfig{Store: store, Keys: verifier})
	g.SetUsers(us)
	if err := g.Check(ctx, "cli-good", &wire.Caller{Uid: 1001}); err != nil {
		t.Fatal(err)
	}
	verifier.Deny.Set([]string{"srv-revoked", "srv-1"})
	if err := g.Check(ctx, "cli-good", &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
		t.Errorf("a session signed by a server revoked since: %v", err)
	}

	// The opt-out admits an unsigned record, still not a bad signature.
	lax := NewGuard(GuardConfig{Store: store, Keys: verifier, Unsigned: true})
	lax.SetUsers(us)
	if err := lax.Check(ctx, "cli-unsigned", &wire.Caller{Uid: 1001}); err != nil {
		t.Errorf("Unsigned: an unsigned record refused: %v", err)
	}
	if err := lax.Check(ctx, "cli-client", &wire.Caller{Uid: 1001}); !errors.Is(err, fserr.ErrAccess) {
		t.Errorf("Unsigned: a record with a bad signature admitted: %v", err)
	}

	// A server whose certificate lacks the server role refuses logins
	// instead of writing records nobody accepts.
	plain := NewGuard(GuardConfig{Store: store, Keys: nodeCreds(t, ca, "srv-legacy", false)})
	plain.SetUsers(us)
	ch, err := plain.Challenge("cli-y", 1001, "alice")
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := NewSigner(s).Sign(Payload("cli-y", 1001, "alice", ch.Nonce))
	_, err = plain.Login(ctx, "cli-y", &wire.LoginRequest{Uid: 1001, User: "alice", Nonce: ch.Nonce,
		PublicKey: s.PublicKey().Marshal(), Signature: ssh.Marshal(sig)})
	if !errors.Is(err, fserr.ErrNotSupported) {
		t.Fatalf("login at a server without the server role: %v, want EOPNOTSUPP", err)
	}
}
