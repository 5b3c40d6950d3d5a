package route

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// cutOff is a configuration service this host cannot reach once cut is
// set: Table waits for the caller's deadline, as across a dark link.
type cutOff struct {
	configsvc.Service
	cut bool
}

func (c *cutOff) Table(ctx context.Context) (*configsvc.Table, error) {
	if c.cut {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c.Service.Table(ctx)
}

// TestUnknownSliceWhileCutOff: a slice missing from the table while the
// configuration service is out of reach is asked of this host's server
// within the call's time, not after it.
func TestUnknownSliceWhileCutOff(t *testing.T) {
	for _, local := range []bool{true, false} {
		conf := &cutOff{Service: configsvc.NewMemory().Client(configsvc.Options{})}
		o := Options{}
		if local {
			o.LocalID, o.Local = "srv-here", wire.NewStorageClient(nil)
		}
		ctx := context.Background()
		r, err := New(ctx, conf, o)
		if err != nil {
			t.Fatal(err)
		}
		conf.cut = true
		cctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
		start := time.Now()
		c, err := r.Primary(cctx, 7)
		took := time.Since(start)
		cancel()
		switch {
		case local && (err != nil || c.ID != "srv-here"):
			t.Errorf("with a local server: %v, %v; want this host's server", c.ID, err)
		case local && took > 300*time.Millisecond:
			t.Errorf("with a local server: answered after %s; want about half of the 400 ms", took)
		case !local && err == nil:
			t.Errorf("without a local server: got %v, want an error", c.ID)
		case !local && !errors.Is(err, context.DeadlineExceeded):
			t.Errorf("without a local server: %v", err)
		}
		r.Close()
	}
}
