package client

import (
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestMayServe: where servers want a login per uid, the cache answers a
// uid only with a session here or after a server acted for it (a server
// that trusts client uids); reading the root's attributes does not count,
// as any uid may. Elsewhere it answers every uid.
func TestMayServe(t *testing.T) {
	f := &FS{cfg: Config{LoginRequired: true}, logins: newLogins()}
	alice, bob, carol := User{Uid: 1000}, User{Uid: 1001}, User{Uid: 1002}
	if f.mayServe(alice) {
		t.Fatal("the cache answers a uid no server acted for and without a session")
	}
	f.noteAdmitted(&wire.GetAttrRequest{Caller: alice.caller(), Id: uint64(oid.Root)})
	if f.mayServe(alice) {
		t.Fatal("a getattr of the root counted as the server acting for the uid")
	}
	f.noteAdmitted(&wire.LookupRequest{Caller: alice.caller(), Dir: uint64(oid.Root), Name: "f"})
	if !f.mayServe(alice) || f.mayServe(bob) {
		t.Fatalf("after a lookup for alice: alice %v, bob %v; want true, false", f.mayServe(alice), f.mayServe(bob))
	}
	f.logins.mu.Lock()
	f.logins.sessions[carol.Uid] = Session{Uid: carol.Uid}
	f.logins.mu.Unlock()
	if !f.mayServe(carol) {
		t.Fatal("a uid with a session is not served")
	}
	open := &FS{cfg: Config{}, logins: newLogins()}
	if !open.mayServe(bob) {
		t.Fatal("without LoginRequired the cache refused a uid")
	}
}
