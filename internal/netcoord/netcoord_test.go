package netcoord

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestConverges feeds exact samples of a three-site topology to six nodes
// and checks that every estimate ends up close to the real RTT.
func TestConverges(t *testing.T) {
	site := []int{0, 0, 1, 1, 2, 2}
	rttMs := [3][3]float64{{1, 80, 150}, {80, 1, 100}, {150, 100, 1}}
	nodes := make([]*Node, len(site))
	ids := []string{"a0", "a1", "b0", "b1", "c0", "c1"}
	for i := range nodes {
		nodes[i] = New(ids[i], Options{})
	}
	real := func(i, j int) time.Duration {
		return time.Duration(rttMs[site[i]][site[j]] * float64(time.Millisecond))
	}
	for round := range 200 {
		for i, n := range nodes {
			j := (i + 1 + round%(len(nodes)-1)) % len(nodes)
			if err := n.Observe(ids[j], nodes[j].Coordinate(), real(i, j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range nodes {
		for j := range nodes {
			if i == j {
				continue
			}
			est := Estimate(nodes[i].Coordinate(), nodes[j].Coordinate())
			want := real(i, j)
			// Vivaldi's random start leaves a few milliseconds on a 1 ms
			// link in some runs (up to 7.7 ms in 300); what placement
			// needs is the order: a site-mate nearer than any other site.
			if d := est - want; d > want/4+10*time.Millisecond || -d > want/4+10*time.Millisecond {
				t.Errorf("%s→%s: estimate %v, real %v", ids[i], ids[j], est, want)
			}
			if site[i] == site[j] {
				for k := range nodes {
					if site[k] != site[i] && Estimate(nodes[i].Coordinate(), nodes[k].Coordinate()) <= est {
						t.Errorf("%s→%s (same site) %v is not nearer than %s→%s", ids[i], ids[j], est, ids[i], ids[k])
					}
				}
			}
		}
	}
	if applied, rejected := nodes[0].Samples(); applied != 200 || rejected != 0 {
		t.Errorf("samples applied %d rejected %d, want 200 and 0", applied, rejected)
	}
}

func TestObserveRefusesBadSamples(t *testing.T) {
	n := New("me", Options{})
	other := New("other", Options{}).Coordinate()
	if err := n.Observe("me", other, time.Millisecond); err == nil {
		t.Error("a sample of itself was applied")
	}
	if err := n.Observe("other", other, -time.Millisecond); err == nil {
		t.Error("a negative RTT was applied")
	}
	if err := n.Observe("other", other, time.Minute); err == nil {
		t.Error("a one-minute RTT was applied")
	}
	if FromWire(&wire.Coord{Vec: []float64{1, 2}}) != nil {
		t.Error("a coordinate of the wrong dimension was accepted")
	}
	if _, rejected := n.Samples(); rejected != 3 {
		t.Errorf("rejected %d samples, want 3", rejected)
	}
	if got := Estimate(nil, other); got != Unknown {
		t.Errorf("estimate to a missing coordinate = %v, want Unknown", got)
	}
}

// slowStorage answers Probe after a delay and ReadBlocks with a large block.
type slowStorage struct {
	wire.UnimplementedStorageServer
	delay time.Duration
}

func (s slowStorage) Probe(context.Context, *wire.ProbeRequest) (*wire.ProbeResponse, error) {
	time.Sleep(s.delay) // server time: the client must subtract it
	return &wire.ProbeResponse{}, nil
}

func (s slowStorage) ReadBlocks(context.Context, *wire.ReadBlocksRequest) (*wire.ReadBlocksResponse, error) {
	return &wire.ReadBlocksResponse{Data: [][]byte{make([]byte, 64<<10)}}, nil
}

// TestInterceptors samples real gRPC calls: the server's time is taken
// out, samples of one peer are rate-limited, and large calls do not count.
func TestInterceptors(t *testing.T) {
	srvNode := New("server", Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(srvNode.UnaryServerInterceptor()))
	wire.RegisterStorageServer(gs, slowStorage{delay: 50 * time.Millisecond})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	cliNode := New("client", Options{SampleEvery: time.Hour})
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(cliNode.UnaryClientInterceptor("server")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sc := wire.NewStorageClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The first call connects: not sampled, and no sample is used up.
	if _, err := sc.Probe(ctx, &wire.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	if applied, _ := cliNode.Samples(); applied != 0 {
		t.Fatalf("the connecting call was sampled")
	}
	// A large answer on a ready connection: asked, but not counted.
	if _, err := sc.ReadBlocks(ctx, &wire.ReadBlocksRequest{}); err != nil {
		t.Fatal(err)
	}
	if applied, rejected := cliNode.Samples(); applied != 0 || rejected != 0 {
		t.Fatalf("a 64 KiB answer was sampled (applied %d, rejected %d)", applied, rejected)
	}
	cliNode.Forget("server") // ask again now
	if _, err := sc.Probe(ctx, &wire.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	if applied, rejected := cliNode.Samples(); applied != 1 || rejected != 0 {
		t.Fatalf("samples applied %d rejected %d, want 1 and 0", applied, rejected)
	}
	// Loopback RTT with the server's 50 ms taken out.
	if est := Estimate(cliNode.Coordinate(), srvNode.Coordinate()); est > 20*time.Millisecond {
		t.Errorf("estimate %v after one loopback sample: the server's time was not subtracted", est)
	}
	// Rate limit: no second sample within SampleEvery.
	if _, err := sc.Probe(ctx, &wire.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	if applied, _ := cliNode.Samples(); applied != 1 {
		t.Errorf("samples applied %d, want 1 (rate limit)", applied)
	}
}
