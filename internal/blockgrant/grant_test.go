package blockgrant

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func creds(t *testing.T, ca *pki.CA, name string) *pki.Credentials {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := ca.IssueNodeDir(dir, name, nil, nil); err != nil {
		t.Fatal(err)
	}
	c, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheck(t *testing.T) {
	ca, err := pki.InitCA(filepath.Join(t.TempDir(), "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.InitCA(filepath.Join(t.TempDir(), "other"), "other")
	if err != nil {
		t.Fatal(err)
	}
	primary := creds(t, ca, "s1")
	stranger := creds(t, other, "s1")
	s, err := NewSigner(primary.Cert, primary.Name)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := NewSigner(stranger.Cert, stranger.Name)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	body := func() *wire.GrantBody {
		return &wire.GrantBody{Id: 7, Version: 3, Asker: "c1", Holders: []string{"c2"},
			Hashes: [][]byte{make([]byte, 32)}, ExpiresUnixMs: now.Add(time.Second).UnixMilli()}
	}
	good, err := s.Sign(body())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := bad.Sign(body())
	if err != nil {
		t.Fatal(err)
	}
	tampered := proto.CloneOf(good)
	b := body()
	b.Asker = "c3"
	b.Signer = "s1"
	tampered.Body, _ = proto.Marshal(b)
	v := NewVerifier(primary.CACertPool)
	for _, tc := range []struct {
		name string
		g    *wire.Grant
		at   time.Time
		want error
	}{
		{"valid", good, now, nil},
		{"valid again (cached certificate)", good, now, nil},
		{"expired", good, now.Add(2 * time.Second), ErrExpired},
		{"another CA", foreign, now, ErrInvalid},
		{"tampered body", tampered, now, ErrInvalid},
		{"none", nil, now, ErrInvalid},
	} {
		got, err := v.Check(tc.g, tc.at)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
			continue
		}
		if err == nil && (got.Asker != "c1" || got.Signer != "s1" || !Hashes(got)[[32]byte{}]) {
			t.Errorf("%s: body %v", tc.name, got)
		}
	}
}
