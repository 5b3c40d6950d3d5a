package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// server accepts connections on a listener at site and runs handle on
// each until the test ends.
func server(t *testing.T, n *Network, site string, handle func(net.Conn)) string {
	t.Helper()
	l, err := n.Listen(site, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

func echo(c net.Conn) { io.Copy(c, c) }

func dial(t *testing.T, n *Network, from, addr string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := n.Dialer(from)(ctx, addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func pingPong(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := []byte{'x'}
	start := time.Now()
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func TestNilNetworkPassThrough(t *testing.T) {
	var n *Network
	l, err := n.Listen("a", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, ok := l.(*net.TCPListener); !ok {
		t.Errorf("nil Network wrapped the listener: %T", l)
	}
	go func() {
		if c, err := l.Accept(); err == nil {
			echo(c)
			c.Close()
		}
	}()
	c, err := n.Dialer("b")(t.Context(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*net.TCPConn); !ok {
		t.Errorf("nil Network wrapped the conn: %T", c)
	}
	pingPong(t, c)
}

func TestZeroNetwork(t *testing.T) {
	var n Network
	addr := server(t, &n, "b", echo)
	pingPong(t, dial(t, &n, "a", addr))
	n.Partition("a", "b")
	if _, err := n.Dialer("a")(t.Context(), addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial across partition: %v", err)
	}
}

// TestPumpsExit checks that a shaped connection's goroutines end with it.
func TestPumpsExit(t *testing.T) {
	n := NewNetwork()
	n.SetRTT("a", "b", 10*time.Millisecond)
	n.SetBandwidth("b", 1<<20)
	addr := server(t, n, "b", echo)
	before := runtime.NumGoroutine()
	for i := range 6 {
		c := dial(t, n, "a", addr)
		pingPong(t, c)
		if i%2 == 0 {
			c.Write([]byte("in flight"))
			c.Close()
		} else {
			n.Partition("a", "b")
			n.Heal("a", "b")
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUnshapedConnIsDirect(t *testing.T) {
	n := NewNetwork()
	addr := server(t, n, "b", echo)
	c := dial(t, n, "a", addr)
	for range 10 {
		if d := pingPong(t, c); d > 20*time.Millisecond {
			t.Errorf("unshaped ping-pong took %v", d)
		}
	}
	cc := c.(*conn)
	cc.mu.Lock()
	pumps := cc.inPump || cc.outPump
	cc.mu.Unlock()
	if pumps {
		t.Error("unshaped connection started pump goroutines")
	}
}

func TestRTT(t *testing.T) {
	const rtt = 40 * time.Millisecond
	n := NewNetwork()
	n.SetRTT("a", "b", rtt)
	addr := server(t, n, "b", echo)

	start := time.Now()
	c := dial(t, n, "a", addr)
	if d := time.Since(start); d < rtt {
		t.Errorf("dial took %v, want at least one rtt %v", d, rtt)
	}
	// Every round trip takes at least rtt; a scheduling hiccup may make
	// one slow, so the upper bound applies to the median.
	var ds []time.Duration
	for range 5 {
		d := pingPong(t, c)
		if d < rtt {
			t.Errorf("ping-pong took %v, less than rtt %v", d, rtt)
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	if med := ds[len(ds)/2]; med > rtt+20*time.Millisecond {
		t.Errorf("median ping-pong %v (all: %v), want at most %v", med, ds, rtt+20*time.Millisecond)
	}

	// Same-site traffic is not delayed.
	local := dial(t, n, "b", addr)
	if d := pingPong(t, local); d > 20*time.Millisecond {
		t.Errorf("same-site ping-pong took %v", d)
	}

	// Pipelined: 50 back-to-back messages all come back after about one
	// rtt, not 50.
	c.SetDeadline(time.Now().Add(5 * time.Second))
	start = time.Now()
	msg := bytes.Repeat([]byte("y"), 1000)
	go func() {
		for range 50 {
			if _, err := c.Write(msg); err != nil {
				return
			}
		}
	}()
	if _, err := io.ReadFull(c, make([]byte, 50*len(msg))); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < rtt || d > 3*rtt {
		t.Errorf("50 pipelined messages took %v, want about %v", d, rtt)
	}

	// Changing the RTT affects an existing connection.
	n.SetRTT("b", "a", 0)
	if d := pingPong(t, c); d > 20*time.Millisecond {
		t.Errorf("ping-pong after removing rtt: %v", d)
	}
}

// TestBandwidth sends 1 MiB in each direction across a limited uplink.
func TestBandwidth(t *testing.T) {
	const (
		rate = 4 << 20 // bytes/s
		size = 1 << 20
		want = time.Second * size / rate // 250ms
	)
	n := NewNetwork()
	n.SetBandwidth("a", rate)
	n.SetBandwidth("b", rate)

	received := make(chan time.Time, 1)
	sinkAddr := server(t, n, "b", func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, size)); err == nil {
			received <- time.Now()
		}
	})
	sourceAddr := server(t, n, "b", func(c net.Conn) {
		c.Write(make([]byte, size))
	})

	t.Run("uplink of dialer", func(t *testing.T) {
		c := dial(t, n, "a", sinkAddr)
		start := time.Now()
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		select {
		case end := <-received:
			checkWithin(t, end.Sub(start), want, 0.3)
		case <-time.After(5 * time.Second):
			t.Fatal("sink did not receive the data")
		}
	})
	t.Run("uplink of listener", func(t *testing.T) {
		c := dial(t, n, "a", sourceAddr)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		checkWithin(t, time.Since(start), want, 0.3)
	})
	t.Run("within a site unlimited", func(t *testing.T) {
		c := dial(t, n, "b", sourceAddr)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > want/2 {
			t.Errorf("same-site transfer took %v", d)
		}
	})
}

func checkWithin(t *testing.T, got, want time.Duration, frac float64) {
	t.Helper()
	lo, hi := time.Duration(float64(want)*(1-frac)), time.Duration(float64(want)*(1+frac))
	if got < lo || got > hi {
		t.Errorf("took %v, want %v ±%.0f%%", got, want, frac*100)
	}
}

// watchReads records the conns of n with a Read waiting for data, and
// returns a function that waits until each of conns has one.
func watchReads(n *Network) func(t *testing.T, conns ...net.Conn) {
	var mu sync.Mutex
	waiting := map[net.Conn]bool{}
	n.readWaits = func(c net.Conn) {
		mu.Lock()
		waiting[c] = true
		mu.Unlock()
	}
	return func(t *testing.T, conns ...net.Conn) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			all := true
			for _, c := range conns {
				all = all && waiting[c]
			}
			mu.Unlock()
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the reads never started waiting")
			}
		}
	}
}

func TestPartition(t *testing.T) {
	n := NewNetwork()
	blocked := watchReads(n)
	n.SetRTT("a", "b", 10*time.Millisecond)
	serverErr := make(chan error, 4)
	addr := server(t, n, "b", func(c net.Conn) {
		_, err := io.Copy(c, c)
		if err == nil {
			err = io.EOF
		}
		serverErr <- err
	})
	shaped := dial(t, n, "a", addr)
	pingPong(t, shaped)

	n.SetRTT("a", "c", 0)
	addrC := server(t, n, "c", echo)
	direct := dial(t, n, "a", addrC) // unshaped: direct socket I/O
	pingPong(t, direct)
	other := dial(t, n, "c", addr) // c-b is not partitioned below

	for _, c := range []net.Conn{shaped, direct} {
		c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	readErr := make(chan error, 2)
	for _, c := range []net.Conn{shaped, direct} {
		go func() {
			_, err := c.Read(make([]byte, 1))
			readErr <- err
		}()
	}
	// The partition must wake reads already waiting, not just refuse new ones.
	blocked(t, shaped, direct)

	start := time.Now()
	n.Partition("b", "a")
	n.Isolate("c")
	for range 2 {
		select {
		case err := <-readErr:
			if !errors.Is(err, syscall.ENETUNREACH) {
				t.Errorf("blocked read: %v, want ENETUNREACH", err)
			}
			var ne net.Error
			if !errors.As(err, &ne) || ne.Timeout() {
				t.Errorf("blocked read error %v is not a non-timeout net.Error", err)
			}
		case <-time.After(time.Second):
			t.Fatal("blocked read did not fail within 1s")
		}
	}
	if _, err := shaped.Write([]byte("z")); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("write after partition: %v", err)
	}
	select {
	case err := <-serverErr:
		if err == io.EOF {
			t.Errorf("accepting end saw an orderly close, want a reset")
		}
	case <-time.After(time.Second):
		t.Error("accepting end did not notice the partition within 1s")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("partition took %v to take effect", d)
	}
	// Isolating c broke c-b too, and c-b stays broken after Rejoin.
	if _, err := other.Write([]byte("z")); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("write on isolated site's conn: %v", err)
	}

	for _, tc := range []struct{ from, addr string }{{"a", addr}, {"a", addrC}, {"c", addr}} {
		_, err := n.Dialer(tc.from)(t.Context(), tc.addr)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial %s→%s across partition: %v, want ECONNREFUSED", tc.from, tc.addr, err)
		}
	}
	// Unaffected pairs still work.
	pingPong(t, dial(t, n, "b", addr))

	n.Heal("a", "b")
	pingPong(t, dial(t, n, "a", addr))
	if _, err := n.Dialer("a")(t.Context(), addrC); err == nil {
		t.Error("dial to isolated site succeeded after healing another pair")
	}
	n.Rejoin("c")
	pingPong(t, dial(t, n, "a", addrC))
	pingPong(t, dial(t, n, "c", addr))
}

// TestDrop: a dropped site's connections go silent instead of failing
// (writes are lost, reads wait for their deadline), dials wait for their
// context or for the site to rejoin, and Rejoin resets what went silent.
func TestDrop(t *testing.T) {
	n := NewNetwork()
	blocked := watchReads(n)
	n.SetRTT("a", "b", 10*time.Millisecond)
	addr := server(t, n, "b", echo)
	addrC := server(t, n, "c", echo)
	shaped := dial(t, n, "a", addr)
	pingPong(t, shaped)
	direct := dial(t, n, "c", addr) // unshaped: direct socket I/O
	pingPong(t, direct)
	same := dial(t, n, "b", addr) // within the dropped site

	const wait = 300 * time.Millisecond
	readErr := make(chan error, 2)
	for _, c := range []net.Conn{shaped, direct} {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		go func() {
			_, err := c.Read(make([]byte, 1))
			readErr <- err
		}()
	}
	blocked(t, shaped, direct)
	n.Drop("b")
	for _, c := range []net.Conn{shaped, direct} {
		if k, err := c.Write([]byte("lost")); k != 4 || err != nil {
			t.Errorf("write across a dropped path: %d, %v; want it accepted", k, err)
		}
		c.SetReadDeadline(time.Now().Add(wait))
	}
	for range 2 {
		select {
		case err := <-readErr:
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("read across a dropped path: %v, want its deadline", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("read across a dropped path ignored its deadline")
		}
	}
	pingPong(t, same)
	pingPong(t, dial(t, n, "a", addrC))

	ctx, cancel := context.WithTimeout(t.Context(), wait)
	began := time.Now()
	_, err := n.Dialer("a")(ctx, addr)
	cancel()
	if took := time.Since(began); !errors.Is(err, context.DeadlineExceeded) || took < wait {
		t.Errorf("dial across a dropped path: %v after %v, want its context's end after %v", err, took, wait)
	}
	// A dial waiting when the site rejoins connects.
	dialed := make(chan net.Conn, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		c, err := n.Dialer("a")(ctx, addr)
		if err != nil {
			t.Errorf("dial waiting across a dropped path, then rejoined: %v", err)
		}
		dialed <- c
	}()
	select {
	case c := <-dialed:
		t.Fatalf("a dial across a dropped path returned before the site rejoined: %v", c)
	case <-time.After(50 * time.Millisecond):
	}
	n.Rejoin("b")
	if c := <-dialed; c != nil {
		t.Cleanup(func() { c.Close() })
		pingPong(t, c)
	}
	for _, c := range []net.Conn{shaped, direct} {
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("a connection silenced by Drop, after Rejoin: %v, want ECONNRESET", err)
		}
	}
}

func TestDeadlineAndClose(t *testing.T) {
	n := NewNetwork()
	n.SetRTT("a", "b", 20*time.Millisecond)
	got := make(chan []byte, 1)
	addr := server(t, n, "b", func(c net.Conn) {
		b, _ := io.ReadAll(c)
		got <- b
	})
	c := dial(t, n, "a", addr)

	c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("read past deadline: %v", err)
	}

	// Data written just before Close still arrives, after its delay.
	msg := bytes.Repeat([]byte("data"), 10000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if _, err := c.Write(msg); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, msg) {
			t.Errorf("far end got %d bytes, want %d", len(b), len(msg))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("far end did not see the data and EOF")
	}
}

func TestDialContextCancelled(t *testing.T) {
	n := NewNetwork()
	n.SetRTT("a", "b", time.Hour)
	addr := server(t, n, "b", echo)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := n.Dialer("a")(ctx, addr); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial with expiring context: %v", err)
	}
}

func TestGRPC(t *testing.T) {
	const rtt = 30 * time.Millisecond
	n := NewNetwork()
	n.SetRTT("a", "b", rtt)
	l, err := n.Listen("b", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	defer srv.Stop()

	cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(n.Dialer("a")))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	check := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return time.Since(start), err
	}
	if _, err := check(); err != nil { // connects
		t.Fatal(err)
	}
	fastest := time.Hour
	for range 3 {
		d, err := check()
		if err != nil {
			t.Fatal(err)
		}
		if d < rtt {
			t.Errorf("RPC took %v, less than rtt %v", d, rtt)
		}
		fastest = min(fastest, d)
	}
	if fastest > rtt+30*time.Millisecond {
		t.Errorf("fastest RPC took %v, want about %v", fastest, rtt)
	}

	n.Partition("a", "b")
	start := time.Now()
	_, err = check()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("RPC across partition: %v, want Unavailable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("RPC across partition took %v to fail", d)
	}
	n.Heal("a", "b")
	cc.Connect()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := check(); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("RPC after heal: %v", err)
		}
		cc.Connect()
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRegister(t *testing.T) {
	n := NewNetwork()
	// A listener the Network did not make, as an etcd member's.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); echo(c) }()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	if err := n.Register("b", "localhost:"+port); err != nil {
		t.Fatal(err)
	}
	if err := n.Register("b", "example.com:1"); err == nil {
		t.Error("Register of a host name: no error")
	}
	if s, ok := n.SiteOf(l.Addr().String()); !ok || s != "b" {
		t.Fatalf("SiteOf = %q, %v; want b", s, ok)
	}
	n.SetRTT("a", "b", 60*time.Millisecond)
	c := dial(t, n, "a", l.Addr().String())
	if d := pingPong(t, c); d < 60*time.Millisecond {
		t.Errorf("round trip to a registered address took %v, want ≥ 60ms", d)
	}
	n.Isolate("b")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := n.Dialer("a")(ctx, l.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial into an isolated registered site: %v, want ECONNREFUSED", err)
	}
	n.Unregister("127.0.0.1:" + port)
	if _, ok := n.SiteOf(l.Addr().String()); ok {
		t.Error("SiteOf after Unregister: still known")
	}
	c2 := dial(t, n, "a", l.Addr().String()) // site "" now: not isolated
	if d := pingPong(t, c2); d >= 60*time.Millisecond {
		t.Errorf("round trip after Unregister took %v, want unshaped", d)
	}
	var nilNet *Network
	if _, ok := nilNet.SiteOf("127.0.0.1:1"); ok {
		t.Error("nil Network knows a site")
	}
}
