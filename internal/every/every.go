// Package every runs periodic work: the one ticker loop of the servers'
// background tasks.
package every

import (
	"context"
	"time"
)

// Do calls fn every period, and also whenever wake delivers (nil: never),
// until ctx ends. The first call is one period (or a wake-up) away.
func Do(ctx context.Context, period time.Duration, wake <-chan struct{}, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		fn()
	}
}
