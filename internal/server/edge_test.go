package server

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func TestInterceptorMapsHandlerErrors(t *testing.T) {
	edge := (&Server{}).UnaryInterceptor()
	for _, tt := range []struct {
		err   error
		code  codes.Code
		errno syscall.Errno
	}{
		{fmt.Errorf("lookup %q: %w", "x", fserr.ErrNotExist), codes.FailedPrecondition, syscall.ENOENT},
		{fmt.Errorf("object 7: %w", fserr.ErrNotPrimary), codes.Unavailable, fserr.Errno(fserr.ErrNotPrimary)},
		{fmt.Errorf("peer: %w", context.DeadlineExceeded), codes.DeadlineExceeded, 0},
		{status.Error(codes.Aborted, "as is"), codes.Aborted, 0},
	} {
		for _, method := range []string{wire.Storage_Lookup_FullMethodName, wire.Peer_Stat_FullMethodName} {
			info := &grpc.UnaryServerInfo{FullMethod: method}
			resp, err := edge(context.Background(), nil, info, func(context.Context, any) (any, error) {
				return &wire.LookupResponse{}, tt.err
			})
			if resp != nil {
				t.Errorf("%s: %v: got a response with the error", method, tt.err)
			}
			if got := status.Code(err); got != tt.code {
				t.Errorf("%s: %v: code %v, want %v", method, tt.err, got, tt.code)
			}
			if tt.errno != 0 && fserr.Errno(fserr.FromStatus(err)) != tt.errno {
				t.Errorf("%s: %v: errno %v, want %v", method, tt.err, fserr.Errno(fserr.FromStatus(err)), tt.errno)
			}
			if want := fserr.ToStatus(tt.err); err.Error() != want.Error() {
				t.Errorf("%s: %q, want %q as ToStatus maps it", method, err, want)
			}
		}
	}
}

func TestInterceptorPassesResponses(t *testing.T) {
	edge := (&Server{}).UnaryInterceptor()
	want := &wire.LookupResponse{}
	got, err := callUnary(context.Background(), edge, nil, wire.Storage_Lookup_FullMethodName, &wire.LookupRequest{Name: "x"},
		func(context.Context, *wire.LookupRequest) (*wire.LookupResponse, error) { return want, nil })
	if err != nil || got != want {
		t.Fatalf("callUnary = %v, %v; want the handler's response", got, err)
	}
	_, err = callUnary(context.Background(), edge, nil, wire.Storage_Lookup_FullMethodName, &wire.LookupRequest{Name: "x"},
		func(context.Context, *wire.LookupRequest) (*wire.LookupResponse, error) { return nil, fserr.ErrExist })
	if !errors.Is(fserr.FromStatus(err), fserr.ErrExist) {
		t.Fatalf("callUnary error %v does not map back to EEXIST", err)
	}
}
