package fserr

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrnoMapping(t *testing.T) {
	tests := []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{ErrNotExist, syscall.ENOENT},
		{fmt.Errorf("lookup %q: %w", "x", ErrAccess), syscall.EACCES},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), syscall.ETIMEDOUT},
		{syscall.EROFS, syscall.EROFS},
		{errors.New("mystery"), syscall.EIO},
	}
	for _, tt := range tests {
		if got := Errno(tt.err); got != tt.want {
			t.Errorf("Errno(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestStatusRoundTrip checks that every sentinel survives the gRPC edge
// with its errno and its context text.
func TestStatusRoundTrip(t *testing.T) {
	for _, e := range append(all, ErrNotPrimary) {
		wrapped := fmt.Errorf("remove %q: %w", "f", e)
		back := FromStatus(ToStatus(wrapped))
		if !errors.Is(back, e) && !(e == ErrNotPrimary && errors.Is(back, ErrNotPrimary)) {
			t.Errorf("%v came back as %v", e, back)
		}
		if Errno(back) != e.Errno() {
			t.Errorf("%v: errno %v, want %v", e, Errno(back), e.Errno())
		}
	}
	if got := FromStatus(status.Error(codes.Unavailable, "connection refused")); Errno(got) != syscall.EIO {
		t.Errorf("transport failure maps to %v", Errno(got))
	}
	if got := FromStatus(status.Error(codes.DeadlineExceeded, "slow")); Errno(got) != syscall.ETIMEDOUT {
		t.Errorf("deadline maps to %v", Errno(got))
	}
}

// FuzzFromStatus decodes arbitrary status messages from the wire: it must
// never panic, and always yield an error with some errno.
func FuzzFromStatus(f *testing.F) {
	f.Add(uint32(codes.FailedPrecondition), "errno=2: no such file")
	f.Add(uint32(codes.Unavailable), "errno=5: not primary")
	f.Add(uint32(codes.FailedPrecondition), "errno=")
	f.Add(uint32(codes.FailedPrecondition), "errno=99999999999999999999: x")
	f.Add(uint32(codes.Internal), "boom")
	f.Fuzz(func(t *testing.T, code uint32, msg string) {
		err := FromStatus(status.Error(codes.Code(code%17), msg))
		if code%17 != 0 && err == nil {
			t.Fatal("nil error for a failed status")
		}
		_ = Errno(err)
	})
}
