package every

import (
	"context"
	"testing"
	"time"
)

func TestDoTicksWakesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	wake := make(chan struct{})
	calls := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		Do(ctx, time.Hour, wake, func() { calls <- struct{}{} })
		close(done)
	}()
	wake <- struct{}{}
	<-calls // a wake-up runs fn without waiting for the period
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not return after ctx ended")
	}
	calls2 := make(chan struct{}, 10)
	ctx2, cancel2 := context.WithTimeout(t.Context(), time.Second)
	defer cancel2()
	go Do(ctx2, 10*time.Millisecond, nil, func() { calls2 <- struct{}{} })
	select {
	case <-calls2:
	case <-ctx2.Done():
		t.Fatal("no tick within a second at a 10 ms period")
	}
}
