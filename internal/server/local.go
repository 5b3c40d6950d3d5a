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
type localClient struct {
	s    *Server
	edge grpc.UnaryServerInterceptor
}

// LocalStorage is a wire.StorageClient that calls a server in this
// process, with the one call only such a client can offer: a read into
// the caller's buffer.
type LocalStorage interface {
	wire.StorageClient
	ReadBlocksInto(ctx context.Context, in *wire.ReadBlocksRequest, dst []byte) error
}

// LocalClient returns a client that calls s in-process.
func LocalClient(s *Server) LocalStorage { return localClient{s, s.UnaryInterceptor()} }

func (l localClient) Lookup(ctx context.Context, in *wire.LookupRequest, _ ...grpc.CallOption) (*wire.LookupResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Lookup_FullMethodName, in, l.s.Lookup)
}

func (l localClient) GetAttr(ctx context.Context, in *wire.GetAttrRequest, _ ...grpc.CallOption) (*wire.GetAttrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_GetAttr_FullMethodName, in, l.s.GetAttr)
}

func (l localClient) Create(ctx context.Context, in *wire.CreateRequest, _ ...grpc.CallOption) (*wire.CreateResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Create_FullMethodName, in, l.s.Create)
}

func (l localClient) Link(ctx context.Context, in *wire.LinkRequest, _ ...grpc.CallOption) (*wire.LinkResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Link_FullMethodName, in, l.s.Link)
}

func (l localClient) Remove(ctx context.Context, in *wire.RemoveRequest, _ ...grpc.CallOption) (*wire.RemoveResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Remove_FullMethodName, in, l.s.Remove)
}

func (l localClient) Rename(ctx context.Context, in *wire.RenameRequest, _ ...grpc.CallOption) (*wire.RenameResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Rename_FullMethodName, in, l.s.Rename)
}

func (l localClient) SetAttr(ctx context.Context, in *wire.SetAttrRequest, _ ...grpc.CallOption) (*wire.SetAttrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_SetAttr_FullMethodName, in, l.s.SetAttr)
}

func (l localClient) ReadDir(ctx context.Context, in *wire.ReadDirRequest, _ ...grpc.CallOption) (*wire.ReadDirResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_ReadDir_FullMethodName, in, l.s.ReadDir)
}

func (l localClient) GetBlocks(ctx context.Context, in *wire.GetBlocksRequest, _ ...grpc.CallOption) (*wire.GetBlocksResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_GetBlocks_FullMethodName, in, l.s.GetBlocks)
}

func (l localClient) ReadBlocks(ctx context.Context, in *wire.ReadBlocksRequest, _ ...grpc.CallOption) (*wire.ReadBlocksResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_ReadBlocks_FullMethodName, in, l.s.ReadBlocks)
}

// ReadBlocksInto is ReadBlocks into dst, back to back (the blocks' total
// length): the in-process client's read, with no copy. It passes the edge
// as ReadBlocks does.
func (l localClient) ReadBlocksInto(ctx context.Context, in *wire.ReadBlocksRequest, dst []byte) error {
	_, err := callUnary(ctx, l.edge, l.s, wire.Storage_ReadBlocks_FullMethodName, in, func(ctx context.Context, req *wire.ReadBlocksRequest) (*wire.ReadBlocksResponse, error) {
		return &wire.ReadBlocksResponse{}, l.s.readBlocksInto(ctx, req, dst)
	})
	return err
}

func (l localClient) PutBlocks(ctx context.Context, in *wire.PutBlocksRequest, _ ...grpc.CallOption) (*wire.PutBlocksResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_PutBlocks_FullMethodName, in, l.s.PutBlocks)
}

func (l localClient) Commit(ctx context.Context, in *wire.CommitRequest, _ ...grpc.CallOption) (*wire.CommitResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Commit_FullMethodName, in, l.s.Commit)
}

func (l localClient) GetXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_GetXattr_FullMethodName, in, l.s.GetXattr)
}

func (l localClient) ListXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_ListXattr_FullMethodName, in, l.s.ListXattr)
}

func (l localClient) SetXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_SetXattr_FullMethodName, in, l.s.SetXattr)
}

func (l localClient) RemoveXattr(ctx context.Context, in *wire.XattrRequest, _ ...grpc.CallOption) (*wire.XattrResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_RemoveXattr_FullMethodName, in, l.s.RemoveXattr)
}

func (l localClient) StatFS(ctx context.Context, in *wire.StatFSRequest, _ ...grpc.CallOption) (*wire.StatFSResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_StatFS_FullMethodName, in, l.s.StatFS)
}

func (l localClient) Open(ctx context.Context, in *wire.OpenRequest, _ ...grpc.CallOption) (*wire.OpenResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Open_FullMethodName, in, l.s.Open)
}

func (l localClient) Sync(ctx context.Context, in *wire.SyncRequest, _ ...grpc.CallOption) (*wire.SyncResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Sync_FullMethodName, in, l.s.Sync)
}

func (l localClient) Release(ctx context.Context, in *wire.ReleaseRequest, _ ...grpc.CallOption) (*wire.ReleaseResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Release_FullMethodName, in, l.s.Release)
}

func (l localClient) LoginChallenge(ctx context.Context, in *wire.LoginChallengeRequest, _ ...grpc.CallOption) (*wire.LoginChallengeResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_LoginChallenge_FullMethodName, in, l.s.LoginChallenge)
}

func (l localClient) Login(ctx context.Context, in *wire.LoginRequest, _ ...grpc.CallOption) (*wire.LoginResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Login_FullMethodName, in, l.s.Login)
}

func (l localClient) RenewSession(ctx context.Context, in *wire.SessionRequest, _ ...grpc.CallOption) (*wire.LoginResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_RenewSession_FullMethodName, in, l.s.RenewSession)
}

func (l localClient) Logout(ctx context.Context, in *wire.SessionRequest, _ ...grpc.CallOption) (*wire.LogoutResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Logout_FullMethodName, in, l.s.Logout)
}

func (l localClient) RenewCertificate(ctx context.Context, in *wire.RenewCertificateRequest, _ ...grpc.CallOption) (*wire.RenewCertificateResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_RenewCertificate_FullMethodName, in, l.s.RenewCertificate)
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

func (l localClient) Probe(ctx context.Context, in *wire.ProbeRequest, _ ...grpc.CallOption) (*wire.ProbeResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Probe_FullMethodName, in, l.s.Probe)
}

func (l localClient) ReportHolding(ctx context.Context, in *wire.ReportHoldingRequest, _ ...grpc.CallOption) (*wire.ReportHoldingResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_ReportHolding_FullMethodName, in, l.s.ReportHolding)
}

func (l localClient) Holders(ctx context.Context, in *wire.HoldersRequest, _ ...grpc.CallOption) (*wire.HoldersResponse, error) {
	return callUnary(ctx, l.edge, l.s, wire.Storage_Holders_FullMethodName, in, l.s.Holders)
}
