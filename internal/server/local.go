package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// localClient calls a server in the same process directly, skipping
// serialization and TLS: the one-host default and a node's own server.
type localClient struct{ s *Server }

// LocalClient returns a wire.StorageClient that calls s in-process.
func LocalClient(s *Server) wire.StorageClient { return localClient{s} }

func (l localClient) Lookup(ctx context.Context, in *wire.LookupRequest, _ ...grpc.CallOption) (*wire.LookupResponse, error) {
	return l.s.Lookup(ctx, in)
}

func (l localClient) GetAttr(ctx context.Context, in *wire.GetAttrRequest, _ ...grpc.CallOption) (*wire.GetAttrResponse, error) {
	return l.s.GetAttr(ctx, in)
}

func (l localClient) Create(ctx context.Context, in *wire.CreateRequest, _ ...grpc.CallOption) (*wire.CreateResponse, error) {
	return l.s.Create(ctx, in)
}

func (l localClient) Link(ctx context.Context, in *wire.LinkRequest, _ ...grpc.CallOption) (*wire.LinkResponse, error) {
	return l.s.Link(ctx, in)
}

func (l localClient) Remove(ctx context.Context, in *wire.RemoveRequest, _ ...grpc.CallOption) (*wire.RemoveResponse, error) {
	return l.s.Remove(ctx, in)
}

func (l localClient) Rename(ctx context.Context, in *wire.RenameRequest, _ ...grpc.CallOption) (*wire.RenameResponse, error) {
	return l.s.Rename(ctx, in)
}

func (l localClient) SetAttr(ctx context.Context, in *wire.SetAttrRequest, _ ...grpc.CallOption) (*wire.SetAttrResponse, error) {
	return l.s.SetAttr(ctx, in)
}

func (l localClient) ReadDir(ctx context.Context, in *wire.ReadDirRequest, _ ...grpc.CallOption) (*wire.ReadDirResponse, error) {
	return l.s.ReadDir(ctx, in)
}

func (l localClient) GetBlocks(ctx context.Context, in *wire.GetBlocksRequest, _ ...grpc.CallOption) (*wire.GetBlocksResponse, error) {
	return l.s.GetBlocks(ctx, in)
}

func (l localClient) ReadBlocks(ctx context.Context, in *wire.ReadBlocksRequest, _ ...grpc.CallOption) (*wire.ReadBlocksResponse, error) {
	return l.s.ReadBlocks(ctx, in)
}

func (l localClient) PutBlocks(ctx context.Context, in *wire.PutBlocksRequest, _ ...grpc.CallOption) (*wire.PutBlocksResponse, error) {
	return l.s.PutBlocks(ctx, in)
}

func (l localClient) Commit(ctx context.Context, in *wire.CommitRequest, _ ...grpc.CallOption) (*wire.CommitResponse, error) {
	return l.s.Commit(ctx, in)
}

func (l localClient) GetXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return l.s.GetXattr(ctx, in)
}

func (l localClient) ListXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return l.s.ListXattr(ctx, in)
}

func (l localClient) SetXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return l.s.SetXattr(ctx, in)
}

func (l localClient) RemoveXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return l.s.RemoveXattr(ctx, in)
}

func (l localClient) StatFS(ctx context.Context, in *wire.StatFSRequest, _ ...grpc.CallOption) (*wire.StatFSResponse, error) {
	return l.s.StatFS(ctx, in)
}

func (l localClient) Open(ctx context.Context, in *wire.OpenRequest, _ ...grpc.CallOption) (*wire.OpenResponse, error) {
	return l.s.Open(ctx, in)
}

func (l localClient) Release(ctx context.Context, in *wire.ReleaseRequest, _ ...grpc.CallOption) (*wire.ReleaseResponse, error) {
	return l.s.Release(ctx, in)
}

func (l localClient) Callbacks(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[wire.CallbackAck, wire.Revoke], error) {
	return nil, status.Error(codes.Unimplemented, "lease callbacks in-process: not yet")
}
