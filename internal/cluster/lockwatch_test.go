package cluster

import (
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/server"
)

func TestLockWatchFindsEarlyTakeovers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const L = 2 * time.Second
	ev := func(k server.LockEventKind, holder string, epoch int64, at time.Duration, until time.Duration) server.LockEvent {
		e := server.LockEvent{Kind: k, Slice: 1, Holder: holder, Epoch: epoch, At: t0.Add(at)}
		if k != server.LockReleased {
			e.Until = t0.Add(until)
		}
		return e
	}
	for _, tc := range []struct {
		name   string
		events []server.LockEvent
		bad    bool
	}{
		{"after expiry", []server.LockEvent{
			ev(server.LockTaken, "a", 1, 0, L),
			ev(server.LockRenewed, "a", 1, time.Second, time.Second+L),
			ev(server.LockTaken, "b", 5, 3*time.Second+time.Millisecond, 5*time.Second),
		}, false},
		{"before the last renewal ran out", []server.LockEvent{
			ev(server.LockTaken, "a", 1, 0, L),
			ev(server.LockRenewed, "a", 1, time.Second, time.Second+L),
			ev(server.LockTaken, "b", 5, 2500*time.Millisecond, 5*time.Second),
		}, true},
		{"after a release", []server.LockEvent{
			ev(server.LockTaken, "a", 1, 0, L),
			ev(server.LockReleased, "a", 1, 500*time.Millisecond, 0),
			ev(server.LockTaken, "b", 5, 600*time.Millisecond, 5*time.Second),
		}, false},
		{"own lock again", []server.LockEvent{
			ev(server.LockTaken, "a", 1, 0, L),
			ev(server.LockTaken, "a", 1, 500*time.Millisecond, L+500*time.Millisecond),
		}, false},
	} {
		w := newLockWatch()
		for _, e := range tc.events {
			w.record(e)
		}
		if v := w.violations(); (len(v) > 0) != tc.bad {
			t.Errorf("%s: violations %q, want some: %v", tc.name, v, tc.bad)
		}
	}
	w := newLockWatch()
	w.record(ev(server.LockTaken, "a", 1, 0, L))
	w.record(ev(server.LockTaken, "b", 5, time.Second, 5*time.Second))
	w.deny("a")
	if v := w.violations(); len(v) > 0 {
		t.Errorf("a denied holder's locks are deleted at once: %q", v)
	}
}
