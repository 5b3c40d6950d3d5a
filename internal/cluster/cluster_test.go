package cluster

import (
	"bytes"
	"context"
	"testing"
	"time"
)

func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestWriteHereReadThere(t *testing.T) {
	began := time.Now()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, ConfigMembers: 3})
	t.Logf("started in %v", time.Since(began))
	ctx := opCtx(t)
	data := []byte("hello from the west")
	if err := c.Client("west").WriteFile(ctx, Owner(), "/greeting", data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, site := range c.Sites() {
		got, err := c.Client(site).ReadFile(ctx, Owner(), "/greeting")
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("read at %s: %q, %v; want %q", site, got, err, data)
		}
	}
}
