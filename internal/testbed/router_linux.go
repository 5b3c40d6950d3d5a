package testbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The delay router runs in the wide-area namespace. Every packet that
// arrives there from a site is routed (table wanTable) into a TUN device;
// the router reads it, holds it for its site pair's one-way delay (or drops
// it while the pair is cut), and writes it back into the TUN device, from
// where the kernel forwards it to the destination site. The packet has
// already left its sender's namespace when it is held, so it no longer
// counts against the sender's TCP small queues: a held packet is in flight
// on the "wire", as on a real long link.

const (
	tunName     = "delay"
	tunMTU      = 1500
	pairBacklog = 1 << 16 // packets in flight per site pair before tail drop
)

// links is the router's view of the testbed: one-way delays and cuts,
// indexed by site.
type links struct {
	oneWay [][]time.Duration
	cut    [][]bool
}

func linksOf(st *State) *links {
	n := len(st.Opts.Sites)
	l := &links{oneWay: make([][]time.Duration, n), cut: make([][]bool, n)}
	cuts := map[string]bool{}
	for _, c := range st.Cuts {
		cuts[c] = true
	}
	for i, a := range st.Opts.Sites {
		l.oneWay[i], l.cut[i] = make([]time.Duration, n), make([]bool, n)
		for j, b := range st.Opts.Sites {
			l.oneWay[i][j] = st.Opts.RTT.Get(a, b) / 2
			l.cut[i][j] = i != j && cuts[pairKey(a, b)]
		}
	}
	return l
}

type packet struct {
	buf  *[]byte
	n    int
	due  time.Time
	pair [2]int
}

// router moves packets between sites.
type router struct {
	tun   *os.File
	links atomic.Pointer[links]
	log   *slog.Logger
	pool  sync.Pool

	mu     sync.Mutex
	queues map[[2]int]chan packet

	forwarded, dropped atomic.Uint64
}

// RunRouter is the delay router of the testbed in dir; it runs in the
// wide-area namespace until ctx ends, and reloads the delays and cuts from
// the state file on SIGHUP.
func RunRouter(ctx context.Context, dir string, log *slog.Logger) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	tap := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: tunName, MTU: tunMTU, TxQLen: 10000},
		Mode:       netlink.TUNTAP_MODE_TUN,
		Flags:      netlink.TUNTAP_NO_PI,
		Queues:     1,
		NonPersist: true, // gone with this process: a dead router is a dead WAN
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("create TUN device: %w", err)
	}
	link, err := netlink.LinkByName(tunName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: all, Table: wanTable}); err != nil {
		return fmt.Errorf("route into the TUN device: %w", err)
	}
	r := newRouter(tap.Fds[0], linksOf(st), log)
	log.Info("delay router up", "sites", st.Opts.Sites, "cuts", st.Cuts)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				st, err := Load(dir)
				if err != nil {
					log.Error("reload", "err", err)
					continue
				}
				r.links.Store(linksOf(st))
				log.Info("reloaded links", "rtt", st.Opts.RTT, "cuts", st.Cuts,
					"forwarded", r.forwarded.Load(), "dropped", r.dropped.Load())
			}
		}
	}()
	go func() {
		<-ctx.Done()
		r.tun.Close()
	}()
	err = r.readLoop()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// newRouter moves packets read from tun, one per read, back into it.
func newRouter(tun *os.File, l *links, log *slog.Logger) *router {
	r := &router{tun: tun, log: log, queues: map[[2]int]chan packet{}}
	r.pool.New = func() any { b := make([]byte, tunMTU+64); return &b }
	r.links.Store(l)
	return r
}

func (r *router) readLoop() error {
	for {
		bp := r.pool.Get().(*[]byte)
		n, err := r.tun.Read(*bp)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read TUN: %w", err)
		}
		b := (*bp)[:n]
		if n < 20 || b[0]>>4 != 4 {
			r.pool.Put(bp) // not IPv4: nothing in the testbed speaks anything else
			continue
		}
		src, dst := siteOf([4]byte(b[12:16])), siteOf([4]byte(b[16:20]))
		l := r.links.Load()
		if src < 0 || dst < 0 || src >= len(l.cut) || dst >= len(l.cut) || l.cut[src][dst] {
			r.dropped.Add(1)
			r.pool.Put(bp)
			continue
		}
		p := packet{buf: bp, n: n, due: time.Now().Add(l.oneWay[src][dst]), pair: [2]int{src, dst}}
		select {
		case r.queue(p.pair) <- p:
		default: // the pair's backlog is full: tail drop, as a full router queue
			r.dropped.Add(1)
			r.pool.Put(bp)
		}
	}
}

// queue returns the FIFO of a site pair, starting its sender. One delay
// per pair keeps every pair's packets in order.
func (r *router) queue(pair [2]int) chan packet {
	r.mu.Lock()
	defer r.mu.Unlock()
	q, ok := r.queues[pair]
	if !ok {
		q = make(chan packet, pairBacklog)
		r.queues[pair] = q
		go r.send(q)
	}
	return q
}

func (r *router) send(q chan packet) {
	for p := range q {
		sleepUntil(p.due)
		// A cut made while the packet was in flight drops it too.
		if l := r.links.Load(); l.cut[p.pair[0]][p.pair[1]] {
			r.dropped.Add(1)
		} else if _, err := r.tun.Write((*p.buf)[:p.n]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			r.dropped.Add(1)
		} else {
			r.forwarded.Add(1)
		}
		r.pool.Put(p.buf)
	}
}

// sleepUntil waits until t with a precision of tens of microseconds. Go's
// timers wake up to a millisecond late, which over a window of 45 packets
// added 50 ms to a 64 KiB round; the last stretch is a nanosleep(2), which
// the kernel times with a high-resolution timer.
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 2*time.Millisecond {
		time.Sleep(d - 1500*time.Microsecond)
	}
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(d.Nanoseconds())
		if err := unix.Nanosleep(&ts, nil); err != nil && err != unix.EINTR {
			return
		}
	}
}
