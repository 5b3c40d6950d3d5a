package client

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestEveryRequestCounted calls every method of the counting client once
// (on a connection to nowhere, with a cancelled context) and checks that
// each is counted under its gRPC method name.
func TestEveryRequestCounted(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///nowhere", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := &FS{rpcs: newRPCCounts()}
	c := countingClient{wire.NewStorageClient(conn), f.rpcs}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := reflect.ValueOf(c)
	methods := 0
	for i := range v.NumMethod() {
		if v.Type().Method(i).Name == "ReadBlocksInto" {
			continue // not a gRPC method: the in-process read, counted as ReadBlocks
		}
		methods++
		m := v.Method(i)
		args := []reflect.Value{reflect.ValueOf(ctx)}
		if m.Type().NumIn() > 1 && m.Type().In(1).Kind() == reflect.Pointer {
			args = append(args, reflect.New(m.Type().In(1).Elem()))
		}
		m.Call(args)
	}
	got := f.Stats()
	want := len(wire.Storage_ServiceDesc.Methods) + len(wire.Storage_ServiceDesc.Streams)
	if methods != want || len(got.Calls) != want || got.Total() != uint64(want) {
		t.Fatalf("%d methods called, counted %v (total %d); the service has %d", methods, got.Calls, got.Total(), want)
	}
	for name, n := range got.Calls {
		if n != 1 {
			t.Errorf("%s counted %d times, want 1", name, n)
		}
	}
	if err := c.ReadBlocksInto(ctx, &wire.ReadBlocksRequest{}, nil); err != errNotInProcess {
		t.Errorf("ReadBlocksInto over gRPC = %v, want errNotInProcess", err)
	}
	if d := f.Stats().Sub(got); d.Total() != 0 {
		t.Errorf("no request since the snapshot, but Sub says %v", d.Calls)
	}
}
