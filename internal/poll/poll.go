// Package poll is the tests' one way to wait for a condition: poll it
// until it holds or a deadline passes.
package poll

import (
	"testing"
	"time"
)

// Until polls cond every 20 ms (then less often, up to every 500 ms)
// until it returns nil, and fails t with cond's last error if timeout
// passes first.
func Until(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := 20 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(wait)
		wait = min(wait*2, 500*time.Millisecond)
	}
}
