// Package deploytest starts a one-host WheelFS (embedded etcd, store,
// server, client core) for tests of other packages, and stops it when the
// test ends.
package deploytest

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/deploy"
)

// Start brings up a host in a fresh directory; adjust may change the
// configuration first. Logs go to stderr with -v, nowhere otherwise.
func Start(t testing.TB, adjust func(*deploy.Config)) *deploy.Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := deploy.NewConfig(t.TempDir())
	c.Logger = slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if adjust != nil {
		adjust(&c)
	}
	h, err := deploy.Start(ctx, c)
	if err != nil {
		t.Fatalf("start host: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}
