package dirlock

import (
	"errors"
	"strings"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

func TestSecondLockFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	f, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file, so a second open in the same
	// process conflicts just like another process would.
	if _, err := Lock(dir); !errors.Is(err, fserr.ErrBusy) || !strings.Contains(err.Error(), "in use by process") {
		t.Fatalf("second lock: %v", err)
	}
	f.Close()
	g, err := Lock(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	g.Close()
}
