package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// The fuzz targets send random, truncated and hostile messages through
// the real gRPC service of a one-host deployment, over TLS, from another
// node's certificate: each input once as raw bytes (which need not parse)
// and, when the bytes parse as the request type, once decoded and aimed
// at real objects. The server must not panic, must answer with a clear
// status (a wheelfs errno, ResourceExhausted, InvalidArgument, or gRPC's
// own Internal "failed to unmarshal" for bytes that do not parse; a call
// that runs into its 10 s deadline fails), and must answer a normal
// request afterwards. One deployment serves all the inputs of a fuzzing
// process. Seeds are valid requests. Run with -fuzzminimizetime=2s or so:
// the server's background goroutines make coverage noisy, and the default
// minute of minimizing per new input stalls the fuzzer.

// method is one RPC of a family.
type method struct {
	name string
	req  func() proto.Message
	resp func() proto.Message
}

func rpc[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](name string) method {
	return method{name, func() proto.Message { return PReq(new(Req)) }, func() proto.Message { return PResp(new(Resp)) }}
}

var (
	namespaceMethods = []method{
		rpc[wire.LookupRequest, wire.LookupResponse](wire.Storage_Lookup_FullMethodName),
		rpc[wire.GetAttrRequest, wire.GetAttrResponse](wire.Storage_GetAttr_FullMethodName),
		rpc[wire.CreateRequest, wire.CreateResponse](wire.Storage_Create_FullMethodName),
		rpc[wire.LinkRequest, wire.LinkResponse](wire.Storage_Link_FullMethodName),
		rpc[wire.RemoveRequest, wire.RemoveResponse](wire.Storage_Remove_FullMethodName),
		rpc[wire.RenameRequest, wire.RenameResponse](wire.Storage_Rename_FullMethodName),
		rpc[wire.ReadDirRequest, wire.ReadDirResponse](wire.Storage_ReadDir_FullMethodName),
	}
	dataMethods = []method{
		rpc[wire.GetBlocksRequest, wire.GetBlocksResponse](wire.Storage_GetBlocks_FullMethodName),
		rpc[wire.ReadBlocksRequest, wire.ReadBlocksResponse](wire.Storage_ReadBlocks_FullMethodName),
		rpc[wire.PutBlocksRequest, wire.PutBlocksResponse](wire.Storage_PutBlocks_FullMethodName),
		rpc[wire.CommitRequest, wire.CommitResponse](wire.Storage_Commit_FullMethodName),
		rpc[wire.SetAttrRequest, wire.SetAttrResponse](wire.Storage_SetAttr_FullMethodName),
		rpc[wire.OpenRequest, wire.OpenResponse](wire.Storage_Open_FullMethodName),
		rpc[wire.ReleaseRequest, wire.ReleaseResponse](wire.Storage_Release_FullMethodName),
		rpc[wire.StatFSRequest, wire.StatFSResponse](wire.Storage_StatFS_FullMethodName),
	}
	xattrMethods = []method{
		rpc[wire.XattrRequest, wire.XattrResponse](wire.Storage_GetXattr_FullMethodName),
		rpc[wire.XattrRequest, wire.XattrResponse](wire.Storage_ListXattr_FullMethodName),
		rpc[wire.XattrRequest, wire.XattrResponse](wire.Storage_SetXattr_FullMethodName),
		rpc[wire.XattrRequest, wire.XattrResponse](wire.Storage_RemoveXattr_FullMethodName),
	}
	peerMethods = []method{
		rpc[wire.ReplicateRequest, wire.ReplicateResponse](wire.Peer_Replicate_FullMethodName),
		rpc[wire.DigestRequest, wire.DigestResponse](wire.Peer_Digest_FullMethodName),
		rpc[wire.DiffRequest, wire.InstallRequest](wire.Peer_Diff_FullMethodName),
		rpc[wire.InstallRequest, wire.InstallResponse](wire.Peer_Install_FullMethodName),
		rpc[wire.FetchBlocksRequest, wire.FetchBlocksResponse](wire.Peer_FetchBlocks_FullMethodName),
		rpc[wire.PingRequest, wire.PingResponse](wire.Peer_Ping_FullMethodName),
		rpc[wire.CreateObjectRequest, wire.CreateObjectResponse](wire.Peer_CreateObject_FullMethodName),
		rpc[wire.DropLinkRequest, wire.DropLinkResponse](wire.Peer_DropLink_FullMethodName),
		rpc[wire.StatRequest, wire.StatResponse](wire.Peer_Stat_FullMethodName),
		rpc[wire.AddLinkRequest, wire.AddLinkResponse](wire.Peer_AddLink_FullMethodName),
		rpc[wire.ReconcileRequest, wire.ReconcileResponse](wire.Peer_Reconcile_FullMethodName),
	}
	// sessionMethods: leases and their back channel, logins, block holders.
	// Index 0 is the Callbacks stream, sent by fuzzSession itself.
	sessionMethods = []method{
		rpc[wire.CallbackAck, wire.Revoke](wire.Storage_Callbacks_FullMethodName),
		rpc[wire.ProbeRequest, wire.ProbeResponse](wire.Storage_Probe_FullMethodName),
		rpc[wire.ReportHoldingRequest, wire.ReportHoldingResponse](wire.Storage_ReportHolding_FullMethodName),
		rpc[wire.HoldersRequest, wire.HoldersResponse](wire.Storage_Holders_FullMethodName),
		rpc[wire.LoginChallengeRequest, wire.LoginChallengeResponse](wire.Storage_LoginChallenge_FullMethodName),
		rpc[wire.LoginRequest, wire.LoginResponse](wire.Storage_Login_FullMethodName),
		rpc[wire.SessionRequest, wire.LoginResponse](wire.Storage_RenewSession_FullMethodName),
		rpc[wire.SessionRequest, wire.LogoutResponse](wire.Storage_Logout_FullMethodName),
		rpc[wire.RenewCertificateRequest, wire.RenewCertificateResponse](wire.Storage_RenewCertificate_FullMethodName),
	}
)

// fuzzHost is the deployment one fuzzing process sends its inputs to.
type fuzzHost struct {
	r    *rig
	conn *grpc.ClientConn // the sender: a client node, or a registered server for the Peer service
	self *grpc.ClientConn // the server's own certificate: checks that it still answers
	ids  []uint64         // objects to aim at: /, /d, /f, /l
}

// startFuzzHost starts a host with a small tree: a directory, a file of
// three blocks with an attribute, a symlink. asServer sends as the host's
// own server (the Peer service admits only servers); trustUIDs runs the
// handlers for any uid (otherwise every caller needs a session).
func startFuzzHost(t testing.TB, asServer, trustUIDs bool) *fuzzHost {
	t.Helper()
	r := startRig(t, func(c *deploy.Config) {
		c.TrustClientUIDs = trustUIDs
		c.Server.RateLimit.Rate = -1        // inputs come as fast as they can
		c.Server.PeerTimeout = time.Second  // peers named by inputs do not exist
		c.Server.MaintainPeriod = time.Hour // no background work between inputs
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs, u := r.h.Client, client.User{}
	if _, err := fs.Mkdir(ctx, u, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(ctx, u, "/f", bytes.Repeat([]byte("wheelfs "), 3<<13), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Create(ctx, u, client.NoCues, oid.Root, "l", client.CreateArgs{Type: client.TypeSymlink, Target: "f"}); err != nil {
		t.Fatal(err)
	}
	h := &fuzzHost{r: r, ids: []uint64{uint64(oid.Root)}}
	for _, name := range []string{"d", "f", "l"} {
		a, err := fs.Lookup(ctx, u, client.NoCues, oid.Root, name)
		if err != nil {
			t.Fatal(err)
		}
		h.ids = append(h.ids, a.Id)
	}
	if err := fs.SetXattr(ctx, u, client.NoCues, oid.ID(h.ids[2]), "user.a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	h.self = r.dialWith(t, r.h.Creds)
	if asServer {
		h.conn = h.self
	} else {
		h.conn = r.dial(t, "fuzz-client")
	}
	return h
}

// aim points a decoded request at the host's objects: sel's low bits
// choose whether and which, its high bit makes the caller root.
func (h *fuzzHost) aim(msg proto.Message, sel uint8) {
	m := msg.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		switch {
		case sel&3 != 0 && f.Kind() == protoreflect.Uint64Kind && f.Cardinality() != protoreflect.Repeated &&
			(f.Name() == "id" || f.Name() == "dir" || f.Name() == "src_dir" || f.Name() == "dst_dir"):
			pick := (int(sel>>2) + i) % len(h.ids)
			m.Set(f, protoreflect.ValueOfUint64(h.ids[pick]))
		case sel&0x80 != 0 && f.Name() == "caller" && f.Kind() == protoreflect.MessageKind:
			c := m.Mutable(f).Message()
			cf := c.Descriptor().Fields()
			c.Set(cf.ByName("uid"), protoreflect.ValueOfUint32(0))
			c.Set(cf.ByName("gid"), protoreflect.ValueOfUint32(0))
		}
	}
}

// send sends data to m raw and, when it parses, decoded and aimed.
func (h *fuzzHost) send(t *testing.T, m method, sel uint8, data []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, out := rawMsg(data), rawMsg(nil)
	err := h.conn.Invoke(ctx, m.name, &raw, &out, grpc.ForceCodec(rawCodec{}))
	checkStatus(t, m.name, err, true)
	req := m.req()
	if proto.Unmarshal(data, req) != nil {
		return
	}
	h.aim(req, sel)
	err = h.conn.Invoke(ctx, m.name, req, m.resp())
	checkStatus(t, m.name, err, false)
}

// checkStatus fails the test on an error that is not a clear refusal.
func checkStatus(t *testing.T, method string, err error, raw bool) {
	t.Helper()
	if err == nil {
		return
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%s: not a status: %v", method, err)
	}
	switch st.Code() {
	case codes.FailedPrecondition, codes.Unavailable:
		if !strings.HasPrefix(st.Message(), "errno=") {
			t.Fatalf("%s: %v without an errno", method, err)
		}
	case codes.ResourceExhausted, codes.InvalidArgument:
	case codes.Internal:
		// gRPC's own refusal of bytes that do not parse, before any
		// handler runs; never for a message that parsed.
		if !raw || !strings.Contains(st.Message(), "unmarshal") {
			t.Fatalf("%s: %v", method, err)
		}
	default:
		t.Fatalf("%s: unexpected %v", method, err)
	}
}

// fuzzFamily runs the inputs of one family of methods.
func fuzzFamily(f *testing.F, methods []method, asServer, trustUIDs bool, seeds []proto.Message) {
	for _, s := range seeds {
		for i, m := range methods {
			if m.req().ProtoReflect().Descriptor() == s.ProtoReflect().Descriptor() {
				data, err := proto.Marshal(s)
				if err != nil {
					f.Fatal(err)
				}
				f.Add(uint8(i), uint8(0x85), data)
				f.Add(uint8(i), uint8(0x02), data)
			}
		}
	}
	h := startFuzzHost(f, asServer, trustUIDs)
	f.Fuzz(func(t *testing.T, op, sel uint8, data []byte) {
		h.send(t, methods[int(op)%len(methods)], sel, data)
		if asServer {
			h.pings(t)
		} else {
			h.r.alive(t, h.self)
		}
	})
}

var root0 = &wire.Caller{}

// FuzzNamespace: Lookup, GetAttr, Create, Link, Remove, Rename, ReadDir.
func FuzzNamespace(f *testing.F) {
	fuzzFamily(f, namespaceMethods, false, true, []proto.Message{
		&wire.LookupRequest{Caller: root0, Name: "f"},
		&wire.LookupRequest{Caller: root0, Name: "..", AbsentOk: true},
		&wire.GetAttrRequest{Caller: root0},
		&wire.CreateRequest{Caller: root0, Name: "n", Type: wire.Type_TYPE_FILE, Mode: 0o644, OpenAccess: 6,
			Cues: &wire.Cues{RepLevel: 2}, Op: 7},
		&wire.CreateRequest{Caller: root0, Name: "s", Type: wire.Type_TYPE_SYMLINK, Target: strings.Repeat("x/", 100)},
		&wire.LinkRequest{Caller: root0, Name: "hard"},
		&wire.RemoveRequest{Caller: root0, Name: "f", FileOnly: true},
		&wire.RenameRequest{Caller: root0, SrcName: "f", DstName: "g", Flags: wire.RenameExchange},
		&wire.ReadDirRequest{Caller: root0, Limit: 2, WithMeta: true},
	})
}

// FuzzData: GetBlocks, ReadBlocks, PutBlocks, Commit, SetAttr, Open,
// Release, StatFS.
func FuzzData(f *testing.F) {
	hash := bytes.Repeat([]byte{7}, 32)
	fuzzFamily(f, dataMethods, false, true, []proto.Message{
		&wire.GetBlocksRequest{Caller: root0, First: 0, Count: 1024},
		&wire.ReadBlocksRequest{Caller: root0, Hashes: [][]byte{hash}},
		&wire.PutBlocksRequest{Caller: root0, Data: [][]byte{[]byte("block")}},
		&wire.CommitRequest{Caller: root0, Blocks: []*wire.BlockRef{{Index: 1, Hash: hash, Len: 5}}, Size: 1 << 17,
			Attrs: []*wire.SetAttrRequest{{Caller: root0, Valid: wire.SetMode, Mode: 0o600}}},
		&wire.SetAttrRequest{Caller: root0, Valid: wire.SetSize | wire.SetMtime, Size: 100, MtimeNow: true},
		&wire.OpenRequest{Caller: &wire.Caller{Handle: &wire.HandleRef{Session: 1, Id: 2}}, Flags: 2},
		&wire.ReleaseRequest{Handle: &wire.HandleRef{Session: 1, Id: 2}},
		&wire.StatFSRequest{Caller: root0},
	})
}

// FuzzXattr: GetXattr, ListXattr, SetXattr, RemoveXattr.
func FuzzXattr(f *testing.F) {
	fuzzFamily(f, xattrMethods, false, true, []proto.Message{
		&wire.XattrRequest{Caller: root0, Name: "user.a", AbsentOk: true},
		&wire.XattrRequest{Caller: root0, Name: "user.b", Value: []byte("v"), Flags: 1},
		&wire.XattrRequest{Caller: root0, Name: "trusted.x", Value: bytes.Repeat([]byte{1}, 300)},
	})
}

// FuzzPeer: the Peer service, from the server's own certificate (only
// registered servers may call it; they are trusted, so this looks for
// panics and hangs, not refusals). A peer may legitimately fence the
// server out of its slices (a newer epoch), so afterwards the server
// must answer a Ping rather than a getattr of the root.
func FuzzPeer(f *testing.F) {
	sl := uint32(oid.Root.Slice())
	fuzzFamily(f, peerMethods, true, true, []proto.Message{
		&wire.ReplicateRequest{Slice: sl, Epoch: 1, Batches: []*wire.Batch{{Seq: 1, Mutations: []*wire.Mutation{{Kind: wire.MutationKind_MUT_PUT_ENTRY, Id: 1, Data: []byte{1}}}}}},
		&wire.DigestRequest{Slice: sl},
		&wire.DiffRequest{Slice: sl, Digest: &wire.DigestResponse{Ids: []uint64{1}, Versions: []uint64{1}}},
		&wire.InstallRequest{Slice: 99, Epoch: 1, Objects: []*wire.ObjectState{{Meta: &wire.Meta{Id: 99 << 32, Type: wire.Type_TYPE_FILE}}}},
		&wire.FetchBlocksRequest{Hashes: [][]byte{bytes.Repeat([]byte{1}, 32)}},
		&wire.PingRequest{},
		&wire.CreateObjectRequest{Meta: &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o644}},
		&wire.DropLinkRequest{FileOnly: true, Caller: root0},
		&wire.StatRequest{},
		&wire.AddLinkRequest{Caller: root0, Name: "x", Count: true},
		&wire.ReconcileRequest{Slice: sl, Entries: []*wire.EntryChange{{Name: "r", Entry: &wire.Entry{Name: "r", Id: 5, Version: 1}}}},
	})
}

// FuzzSession: the Callbacks stream (leases' back channel), logins,
// block holders and certificate renewal, with sessions required (no
// --trust-client-uids).
func FuzzSession(f *testing.F) {
	seeds := []proto.Message{
		&wire.CallbackAck{Session: 42, Seq: 1},
		&wire.ProbeRequest{},
		&wire.ReportHoldingRequest{Node: "n", Site: "s", Held: []*wire.HeldBlocks{{Caller: root0, Version: 1,
			Blocks: []*wire.BlockRange{{First: 0, Count: 3}}}}},
		&wire.HoldersRequest{Caller: root0, Version: 1, Blocks: []*wire.BlockRange{{First: 0, Count: 3}}, Max: 3},
		&wire.LoginChallengeRequest{Uid: 1000, User: "alice"},
		&wire.LoginRequest{Uid: 1000, User: "alice", Nonce: make([]byte, 32), PublicKey: []byte("k"), Signature: []byte("s")},
		&wire.SessionRequest{Uid: 1000},
		&wire.SessionRequest{Uid: 1000},
		&wire.RenewCertificateRequest{Csr: []byte("not a certificate request")},
	}
	for i, s := range seeds {
		data, _ := proto.Marshal(s)
		f.Add(uint8(i), uint8(0x85), data)
	}
	f.Add(uint8(7), uint8(0), []byte{8, 1})
	h := startFuzzHost(f, false, false)
	f.Fuzz(func(t *testing.T, op, sel uint8, data []byte) {
		if m := sessionMethods[int(op)%len(sessionMethods)]; m.name != wire.Storage_Callbacks_FullMethodName {
			h.send(t, m, sel, data)
		} else {
			h.callbacks(t, data)
		}
		h.r.alive(t, h.self)
	})
}

// pings checks that the server still answers a Peer call and has
// recovered from no panic.
func (h *fuzzHost) pings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := wire.NewPeerClient(h.self).Ping(ctx, &wire.PingRequest{}); err != nil {
		t.Fatalf("the server no longer answers a ping: %v", err)
	}
	if n := h.r.h.Server.Panics(); n != 0 {
		t.Fatalf("%d handler panics recovered (see the log)", n)
	}
}

// callbacks opens a Callbacks stream and sends data as its first message
// and as an acknowledgement (raw, then decoded when it parses), then
// closes it: the stream must end with a clear status or none.
func (h *fuzzHost) callbacks(t *testing.T, data []byte) {
	desc := &wire.Storage_ServiceDesc.Streams[0]
	send := func(msg any, opts ...grpc.CallOption) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := h.conn.NewStream(ctx, desc, wire.Storage_Callbacks_FullMethodName, opts...)
		if err != nil {
			checkStatus(t, desc.StreamName, err, false)
			return
		}
		for range 2 {
			if err := st.SendMsg(msg); err != nil {
				break // the server ended the stream: RecvMsg tells why
			}
		}
		st.CloseSend()
		for {
			var out rawMsg
			var err error
			if _, ok := msg.(*rawMsg); ok {
				err = st.RecvMsg(&out)
			} else {
				err = st.RecvMsg(new(wire.Revoke))
			}
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				checkStatus(t, desc.StreamName, err, true)
				return
			}
		}
	}
	raw := rawMsg(data)
	send(&raw, grpc.ForceCodec(rawCodec{}))
	var ack wire.CallbackAck
	if proto.Unmarshal(data, &ack) == nil {
		send(&ack)
	}
}
