package client

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Stats counts what this client sent to storage servers: every request
// (in-process ones to a server on the same host included), by method, as
// the gRPC method's short name ("Lookup", "GetXattr", ...; "Callbacks"
// counts back channels opened). Two snapshots' difference is the round
// trips of the operations in between.
type Stats struct {
	Calls map[string]uint64 `json:"calls"`
}

// Total is the number of requests of every method.
func (s Stats) Total() uint64 {
	var n uint64
	for _, v := range s.Calls {
		n += v
	}
	return n
}

// String lists the counts by method ("Lookup 3, Open 1"), sorted.
func (s Stats) String() string {
	keys := slices.Sorted(maps.Keys(s.Calls))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, s.Calls[k])
	}
	return strings.Join(parts, ", ")
}

// Sub returns the requests sent since the earlier snapshot was taken.
func (s Stats) Sub(earlier Stats) Stats {
	out := Stats{Calls: map[string]uint64{}}
	for k, v := range s.Calls {
		if d := v - earlier.Calls[k]; d > 0 {
			out.Calls[k] = d
		}
	}
	return out
}

// Stats returns the counts of requests sent so far.
func (f *FS) Stats() Stats {
	out := Stats{Calls: map[string]uint64{}}
	for k, v := range f.rpcs.by {
		if n := v.Load(); n > 0 {
			out.Calls[k] = n
		}
	}
	return out
}

// rpcCounts has one counter per Storage method; the map is filled once
// and only read afterwards. (A pointer, so that connections holding it
// stay comparable.)
type rpcCounts struct {
	by map[string]*atomic.Uint64
}

func newRPCCounts() *rpcCounts {
	c := &rpcCounts{by: map[string]*atomic.Uint64{}}
	for _, m := range wire.Storage_ServiceDesc.Methods {
		c.by[m.MethodName] = new(atomic.Uint64)
	}
	for _, s := range wire.Storage_ServiceDesc.Streams {
		c.by[s.StreamName] = new(atomic.Uint64)
	}
	return c
}

func (c *rpcCounts) add(method string) {
	if n := c.by[method]; n != nil {
		n.Add(1)
	}
}

// countingRouter hands out connections whose requests are counted.
type countingRouter struct {
	Router
	counts *rpcCounts
}

func (r countingRouter) Primary(ctx context.Context, s oid.Slice) (Conn, error) {
	c, err := r.Router.Primary(ctx, s)
	return r.wrap(c), err
}

func (r countingRouter) Replicas(ctx context.Context, s oid.Slice) ([]Conn, error) {
	cs, err := r.Router.Replicas(ctx, s)
	for i := range cs {
		cs[i] = r.wrap(cs[i])
	}
	return cs, err
}

func (r countingRouter) wrap(c Conn) Conn {
	if c.StorageClient != nil {
		c.StorageClient = countingClient{c.StorageClient, r.counts}
	}
	return c
}

// countingClient counts each request before sending it.
type countingClient struct {
	c      wire.StorageClient
	counts *rpcCounts
}

var _ wire.StorageClient = countingClient{}

func (c countingClient) LoginChallenge(ctx context.Context, in *wire.LoginChallengeRequest, opts ...grpc.CallOption) (*wire.LoginChallengeResponse, error) {
	c.counts.add("LoginChallenge")
	return c.c.LoginChallenge(ctx, in, opts...)
}

func (c countingClient) Login(ctx context.Context, in *wire.LoginRequest, opts ...grpc.CallOption) (*wire.LoginResponse, error) {
	c.counts.add("Login")
	return c.c.Login(ctx, in, opts...)
}

func (c countingClient) RenewSession(ctx context.Context, in *wire.SessionRequest, opts ...grpc.CallOption) (*wire.LoginResponse, error) {
	c.counts.add("RenewSession")
	return c.c.RenewSession(ctx, in, opts...)
}

func (c countingClient) Logout(ctx context.Context, in *wire.SessionRequest, opts ...grpc.CallOption) (*wire.LogoutResponse, error) {
	c.counts.add("Logout")
	return c.c.Logout(ctx, in, opts...)
}

func (c countingClient) RenewCertificate(ctx context.Context, in *wire.RenewCertificateRequest, opts ...grpc.CallOption) (*wire.RenewCertificateResponse, error) {
	c.counts.add("RenewCertificate")
	return c.c.RenewCertificate(ctx, in, opts...)
}

func (c countingClient) Lookup(ctx context.Context, in *wire.LookupRequest, opts ...grpc.CallOption) (*wire.LookupResponse, error) {
	c.counts.add("Lookup")
	return c.c.Lookup(ctx, in, opts...)
}

func (c countingClient) GetAttr(ctx context.Context, in *wire.GetAttrRequest, opts ...grpc.CallOption) (*wire.GetAttrResponse, error) {
	c.counts.add("GetAttr")
	return c.c.GetAttr(ctx, in, opts...)
}

func (c countingClient) Create(ctx context.Context, in *wire.CreateRequest, opts ...grpc.CallOption) (*wire.CreateResponse, error) {
	c.counts.add("Create")
	return c.c.Create(ctx, in, opts...)
}

func (c countingClient) Link(ctx context.Context, in *wire.LinkRequest, opts ...grpc.CallOption) (*wire.LinkResponse, error) {
	c.counts.add("Link")
	return c.c.Link(ctx, in, opts...)
}

func (c countingClient) Remove(ctx context.Context, in *wire.RemoveRequest, opts ...grpc.CallOption) (*wire.RemoveResponse, error) {
	c.counts.add("Remove")
	return c.c.Remove(ctx, in, opts...)
}

func (c countingClient) Rename(ctx context.Context, in *wire.RenameRequest, opts ...grpc.CallOption) (*wire.RenameResponse, error) {
	c.counts.add("Rename")
	return c.c.Rename(ctx, in, opts...)
}

func (c countingClient) SetAttr(ctx context.Context, in *wire.SetAttrRequest, opts ...grpc.CallOption) (*wire.SetAttrResponse, error) {
	c.counts.add("SetAttr")
	return c.c.SetAttr(ctx, in, opts...)
}

func (c countingClient) ReadDir(ctx context.Context, in *wire.ReadDirRequest, opts ...grpc.CallOption) (*wire.ReadDirResponse, error) {
	c.counts.add("ReadDir")
	return c.c.ReadDir(ctx, in, opts...)
}

func (c countingClient) GetBlocks(ctx context.Context, in *wire.GetBlocksRequest, opts ...grpc.CallOption) (*wire.GetBlocksResponse, error) {
	c.counts.add("GetBlocks")
	return c.c.GetBlocks(ctx, in, opts...)
}

func (c countingClient) ReadBlocks(ctx context.Context, in *wire.ReadBlocksRequest, opts ...grpc.CallOption) (*wire.ReadBlocksResponse, error) {
	c.counts.add("ReadBlocks")
	return c.c.ReadBlocks(ctx, in, opts...)
}

// ReadBlocksInto counts as a ReadBlocks; it is there when c's client has it.
func (c countingClient) ReadBlocksInto(ctx context.Context, in *wire.ReadBlocksRequest, dst []byte) error {
	into, ok := c.c.(BlocksInto)
	if !ok {
		return errNotInProcess
	}
	c.counts.add("ReadBlocks")
	return into.ReadBlocksInto(ctx, in, dst)
}

func (c countingClient) PutBlocks(ctx context.Context, in *wire.PutBlocksRequest, opts ...grpc.CallOption) (*wire.PutBlocksResponse, error) {
	c.counts.add("PutBlocks")
	return c.c.PutBlocks(ctx, in, opts...)
}

func (c countingClient) Commit(ctx context.Context, in *wire.CommitRequest, opts ...grpc.CallOption) (*wire.CommitResponse, error) {
	c.counts.add("Commit")
	return c.c.Commit(ctx, in, opts...)
}

func (c countingClient) GetXattr(ctx context.Context, in *wire.XattrRequest, opts ...grpc.CallOption) (*wire.XattrResponse, error) {
	c.counts.add("GetXattr")
	return c.c.GetXattr(ctx, in, opts...)
}

func (c countingClient) ListXattr(ctx context.Context, in *wire.XattrRequest, opts ...grpc.CallOption) (*wire.XattrResponse, error) {
	c.counts.add("ListXattr")
	return c.c.ListXattr(ctx, in, opts...)
}

func (c countingClient) SetXattr(ctx context.Context, in *wire.XattrRequest, opts ...grpc.CallOption) (*wire.XattrResponse, error) {
	c.counts.add("SetXattr")
	return c.c.SetXattr(ctx, in, opts...)
}

func (c countingClient) RemoveXattr(ctx context.Context, in *wire.XattrRequest, opts ...grpc.CallOption) (*wire.XattrResponse, error) {
	c.counts.add("RemoveXattr")
	return c.c.RemoveXattr(ctx, in, opts...)
}

func (c countingClient) StatFS(ctx context.Context, in *wire.StatFSRequest, opts ...grpc.CallOption) (*wire.StatFSResponse, error) {
	c.counts.add("StatFS")
	return c.c.StatFS(ctx, in, opts...)
}

func (c countingClient) Open(ctx context.Context, in *wire.OpenRequest, opts ...grpc.CallOption) (*wire.OpenResponse, error) {
	c.counts.add("Open")
	return c.c.Open(ctx, in, opts...)
}

func (c countingClient) Sync(ctx context.Context, in *wire.SyncRequest, opts ...grpc.CallOption) (*wire.SyncResponse, error) {
	c.counts.add("Sync")
	return c.c.Sync(ctx, in, opts...)
}

func (c countingClient) Release(ctx context.Context, in *wire.ReleaseRequest, opts ...grpc.CallOption) (*wire.ReleaseResponse, error) {
	c.counts.add("Release")
	return c.c.Release(ctx, in, opts...)
}

func (c countingClient) Callbacks(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[wire.CallbackAck, wire.Revoke], error) {
	c.counts.add("Callbacks")
	return c.c.Callbacks(ctx, opts...)
}

func (c countingClient) Probe(ctx context.Context, in *wire.ProbeRequest, opts ...grpc.CallOption) (*wire.ProbeResponse, error) {
	c.counts.add("Probe")
	return c.c.Probe(ctx, in, opts...)
}

func (c countingClient) ReportHolding(ctx context.Context, in *wire.ReportHoldingRequest, opts ...grpc.CallOption) (*wire.ReportHoldingResponse, error) {
	c.counts.add("ReportHolding")
	return c.c.ReportHolding(ctx, in, opts...)
}

func (c countingClient) Holders(ctx context.Context, in *wire.HoldersRequest, opts ...grpc.CallOption) (*wire.HoldersResponse, error) {
	c.counts.add("Holders")
	return c.c.Holders(ctx, in, opts...)
}
