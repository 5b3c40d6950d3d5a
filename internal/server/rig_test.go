package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// rig is a one-host deployment reached over real gRPC with TLS, as
// another node would reach it.
type rig struct {
	h       *deploy.Host
	dataDir string
}

// startRig starts a host; adjust may change its configuration.
func startRig(t testing.TB, adjust func(*deploy.Config)) *rig {
	t.Helper()
	r := &rig{}
	r.h = deploytest.Start(t, func(c *deploy.Config) {
		r.dataDir = c.DataDir
		if adjust != nil {
			adjust(c)
		}
	})
	return r
}

// caDir is the deployment CA the host made on its first start.
func (r *rig) caDir() string { return filepath.Join(r.dataDir, "ca") }

// dial connects to the host's server as node name, with a certificate
// issued by the deployment's CA (a client node unless name is a
// registered server's). The connection closes when the test ends.
func (r *rig) dial(t testing.TB, name string) *grpc.ClientConn {
	t.Helper()
	ca, err := pki.LoadCA(r.caDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.IssueNodeDir(dir, name, nil, nil); err != nil {
		t.Fatal(err)
	}
	creds, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r.dialWith(t, creds)
}

// dialWith connects with the given credentials.
func (r *rig) dialWith(t testing.TB, creds *pki.Credentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(r.h.Addr(),
		grpc.WithTransportCredentials(credentials.NewTLS(creds.ClientTLS(r.h.ServerID()))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize), grpc.MaxCallSendMsgSize(wire.MaxMessageSize)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// alive checks that the server still answers a normal request.
func (r *rig) alive(t testing.TB, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := wire.NewStorageClient(conn).GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{}, Id: uint64(oid.Root)}); err != nil {
		t.Fatalf("the server no longer answers a getattr of the root: %v", err)
	}
	if n := r.h.Server.Panics(); n != 0 {
		t.Fatalf("%d handler panics recovered (see the log)", n)
	}
}

// rawCodec sends a request's bytes as they are: a hostile client's
// message, which need not parse.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*rawMsg), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*rawMsg) = append(rawMsg(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }
