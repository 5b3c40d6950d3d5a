package server

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

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

// Callbacks connects an in-process client's lease back channel through a
// pair of channels.
func (l localClient) Callbacks(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[wire.CallbackAck, wire.Revoke], error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &pipe{ctx: ctx, cancel: cancel, up: make(chan *wire.CallbackAck, 16),
		down: make(chan *wire.Revoke, 16), done: make(chan struct{})}
	go func() {
		p.err = l.s.Callbacks(pipeServer{p})
		close(p.done)
		cancel()
	}()
	return pipeClient{p}, nil
}

// pipe is an in-process bidirectional stream: acknowledgements up,
// revocations down.
type pipe struct {
	ctx    context.Context
	cancel context.CancelFunc
	up     chan *wire.CallbackAck
	down   chan *wire.Revoke
	done   chan struct{} // the server side returned (err)
	err    error
}

type pipeClient struct{ p *pipe }

func (c pipeClient) Send(a *wire.CallbackAck) error {
	select {
	case c.p.up <- a:
		return nil
	case <-c.p.done:
		return io.EOF
	case <-c.p.ctx.Done():
		return c.p.ctx.Err()
	}
}

func (c pipeClient) Recv() (*wire.Revoke, error) {
	select {
	case r := <-c.p.down:
		return r, nil
	case <-c.p.done:
		if c.p.err != nil {
			return nil, c.p.err
		}
		return nil, io.EOF
	case <-c.p.ctx.Done():
		return nil, status.FromContextError(c.p.ctx.Err()).Err()
	}
}

func (c pipeClient) Header() (metadata.MD, error) { return nil, nil }
func (c pipeClient) Trailer() metadata.MD         { return nil }
func (c pipeClient) CloseSend() error             { c.p.cancel(); return nil }
func (c pipeClient) Context() context.Context     { return c.p.ctx }
func (c pipeClient) SendMsg(m any) error          { return c.Send(m.(*wire.CallbackAck)) }
func (c pipeClient) RecvMsg(m any) error {
	r, err := c.Recv()
	if err == nil {
		proto.Merge(m.(*wire.Revoke), r)
	}
	return err
}

type pipeServer struct{ p *pipe }

func (s pipeServer) Send(r *wire.Revoke) error {
	select {
	case s.p.down <- r:
		return nil
	case <-s.p.ctx.Done():
		return s.p.ctx.Err()
	}
}

func (s pipeServer) Recv() (*wire.CallbackAck, error) {
	select {
	case a := <-s.p.up:
		return a, nil
	case <-s.p.ctx.Done():
		return nil, io.EOF
	}
}

func (s pipeServer) SetHeader(metadata.MD) error  { return nil }
func (s pipeServer) SendHeader(metadata.MD) error { return nil }
func (s pipeServer) SetTrailer(metadata.MD)       {}
func (s pipeServer) Context() context.Context     { return s.p.ctx }
func (s pipeServer) SendMsg(m any) error          { return s.Send(m.(*wire.Revoke)) }
func (s pipeServer) RecvMsg(m any) error {
	a, err := s.Recv()
	if err == nil {
		proto.Merge(m.(*wire.CallbackAck), a)
	}
	return err
}
