package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

const (
	// chunkSize is the unit of queueing and of bandwidth accounting.
	chunkSize = 32 << 10
	// maxQueued bounds the bytes in flight per direction of a connection;
	// with a one-way delay d, one connection carries at most maxQueued/d.
	maxQueued = 4 << 20
	// drainTimeout bounds how long a closed connection keeps sending data
	// written before Close.
	drainTimeout = 5 * time.Second
)

// chunk is data in flight: it may be delivered from due on.
type chunk struct {
	b   []byte
	due time.Time
}

// conn is a dialed connection between two sites, shaped in both directions
// (see the package comment). Each direction switches from direct socket I/O
// to a queue and a pump goroutine the first time shaping applies to it, and
// stays queued, so data is never reordered.
type conn struct {
	net.Conn // the TCP connection
	n        *Network
	local    string // site of the dialer (this end)
	remote   string // site of the listener

	rmu, wmu sync.Mutex    // serialize Read and Write
	kill     chan struct{} // closed when the pumps must stop
	killOnce sync.Once
	rawOnce  sync.Once

	mu       sync.Mutex
	wakeIn   chan struct{} // closed and replaced when read-side state changes
	wakeOut  chan struct{} // closed and replaced when write-side state changes
	err      error         // sticky failure: the cause (partition) or the socket error
	closed   bool
	silent   bool      // dropped (Network.Drop): writes are lost, reads wait
	rdl, wdl time.Time // deadlines
	outPump  bool
	out      []chunk
	outBytes int
	inPump   bool
	in       []chunk
	inBytes  int
	inErr    error // the socket's read error (such as io.EOF), after in drains
}

func newConn(n *Network, raw net.Conn, local, remote string) *conn {
	return &conn{
		Conn:    raw,
		n:       n,
		local:   local,
		remote:  remote,
		kill:    make(chan struct{}),
		wakeIn:  make(chan struct{}),
		wakeOut: make(chan struct{}),
	}
}

func (c *conn) wakeInLocked() {
	close(c.wakeIn)
	c.wakeIn = make(chan struct{})
}

func (c *conn) wakeOutLocked() {
	close(c.wakeOut)
	c.wakeOut = make(chan struct{})
}

// sleepLocked releases c.mu until *ch is closed or until t (if not zero),
// then reacquires it.
func (c *conn) sleepLocked(ch chan struct{}, t time.Time) {
	c.mu.Unlock()
	defer c.mu.Lock()
	if t.IsZero() {
		<-ch
		return
	}
	d := time.Until(t)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	select {
	case <-ch:
	case <-timer.C:
	}
	timer.Stop()
}

func (c *conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// stateErrLocked returns the error every operation op fails with now, if
// any.
func (c *conn) stateErrLocked(op string) error {
	if c.closed {
		return c.opErr(op, net.ErrClosed)
	}
	if c.err != nil {
		var oe *net.OpError
		if errors.As(c.err, &oe) {
			return c.err
		}
		return c.opErr(op, c.err)
	}
	return nil
}

func expired(deadline time.Time) bool {
	return !deadline.IsZero() && !time.Now().Before(deadline)
}

// sockErr translates an error of direct socket I/O: after Close or a
// partition, the socket's error is a consequence, not the cause.
func (c *conn) sockErr(op string, err error) error {
	if err == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.stateErrLocked(op); e != nil {
		return e
	}
	return err
}

func (c *conn) closeRaw(reset bool) {
	c.rawOnce.Do(func() {
		if reset {
			abort(c.Conn)
		} else {
			_ = c.Conn.Close()
		}
	})
}

// fail breaks the connection for good with cause (such as a partition's
// syscall.ENETUNREACH or a socket error), dropping data in flight.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = cause
	}
	c.wakeInLocked()
	c.wakeOutLocked()
	c.mu.Unlock()
	c.stopPumps()
	c.n.forget(c)
	c.closeRaw(true)
}

// sockFail is fail for an error of the socket itself, which a silent
// connection does not show: its socket was closed on purpose.
func (c *conn) sockFail(err error) {
	if !c.isSilent() {
		c.fail(err)
	}
}

func (c *conn) stopPumps() { c.killOnce.Do(func() { close(c.kill) }) }

// silence makes the connection lose everything from now on (Network.Drop):
// data in flight is dropped, the socket is reset, writes succeed and are
// lost, reads wait for their deadline or Close.
func (c *conn) silence() {
	c.mu.Lock()
	if c.silent || c.err != nil || c.closed {
		c.mu.Unlock()
		return
	}
	c.silent = true
	c.out, c.outBytes, c.in, c.inBytes = nil, 0, nil, 0
	c.wakeInLocked()
	c.wakeOutLocked()
	c.mu.Unlock()
	c.stopPumps()
	c.closeRaw(true)
}

func (c *conn) isSilent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.silent
}

// silentReadLocked is Read on a silent connection: nothing arrives.
func (c *conn) silentReadLocked() (int, error) {
	for {
		if err := c.stateErrLocked("read"); err != nil {
			return 0, err
		}
		if expired(c.rdl) {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		c.readWaits()
		c.sleepLocked(c.wakeIn, c.rdl)
	}
}

// Close closes the connection. Data already written is still delivered
// after its delay (within drainTimeout), as a kernel would; reads end at
// once.
func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	drain := c.err == nil && len(c.out) > 0
	var last time.Time
	if drain {
		last = c.out[len(c.out)-1].due
	}
	c.wakeInLocked()
	c.wakeOutLocked()
	c.mu.Unlock()
	c.n.forget(c)
	if !drain {
		c.closeRaw(false)
		return nil
	}
	// The write pump closes the socket when the queue is empty. Stop the
	// read pump now.
	_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
	_ = c.Conn.SetWriteDeadline(last.Add(drainTimeout))
	return nil
}

// Write queues p for delivery after the current one-way delay, first
// waiting for the local site's uplink, or writes it directly if no shaping
// applies.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	cfg := c.n.config()
	delay, up := cfg.oneWay(c.local, c.remote), cfg.uplinkFor(c.local, c.remote)

	c.mu.Lock()
	if err := c.stateErrLocked("write"); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if c.silent {
		c.mu.Unlock()
		return len(p), nil
	}
	if !c.outPump {
		if delay == 0 && up == nil {
			c.mu.Unlock()
			n, err := c.Conn.Write(p)
			if err != nil && c.isSilent() {
				return len(p), nil
			}
			return n, c.sockErr("write", err)
		}
		c.outPump = true
		// The pump writes without deadlines; Write enforces c.wdl.
		_ = c.Conn.SetWriteDeadline(time.Time{})
		go c.writeLoop()
	}
	c.mu.Unlock()

	written := 0
	for len(p) > 0 {
		k := min(len(p), chunkSize)
		var at time.Time
		if up != nil {
			at = up.reserve(k)
		}
		c.mu.Lock()
		for {
			if err := c.stateErrLocked("write"); err != nil {
				c.mu.Unlock()
				return written, err
			}
			if c.silent {
				c.mu.Unlock()
				return written + len(p), nil
			}
			if expired(c.wdl) {
				c.mu.Unlock()
				return written, c.opErr("write", os.ErrDeadlineExceeded)
			}
			if time.Now().Before(at) { // waiting for the uplink
				c.sleepLocked(c.wakeOut, earliest(at, c.wdl))
				continue
			}
			if c.outBytes >= maxQueued { // waiting for queue space
				c.sleepLocked(c.wakeOut, c.wdl)
				continue
			}
			break
		}
		c.out = append(c.out, chunk{b: bytes.Clone(p[:k]), due: time.Now().Add(delay)})
		c.outBytes += k
		c.wakeOutLocked()
		c.mu.Unlock()
		written += k
		p = p[k:]
		cfg = c.n.config()
		delay, up = cfg.oneWay(c.local, c.remote), cfg.uplinkFor(c.local, c.remote)
	}
	return written, nil
}

// writeLoop writes queued chunks to the socket when they are due.
func (c *conn) writeLoop() {
	for {
		c.mu.Lock()
		for len(c.out) == 0 && !c.closed && c.err == nil {
			c.sleepLocked(c.wakeOut, time.Time{})
		}
		if c.err != nil || len(c.out) == 0 {
			closed := c.closed && c.err == nil
			c.mu.Unlock()
			if closed {
				c.closeRaw(false) // drained after Close
			}
			return
		}
		ch := c.out[0]
		c.mu.Unlock()

		if d := time.Until(ch.due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-c.kill:
				t.Stop()
				return
			}
		}
		_, err := c.Conn.Write(ch.b)

		c.mu.Lock()
		if c.silent {
			c.mu.Unlock()
			return
		}
		c.out[0] = chunk{}
		c.out = c.out[1:]
		c.outBytes -= len(ch.b)
		c.wakeOutLocked()
		c.mu.Unlock()
		if err != nil {
			c.sockFail(err)
			return
		}
	}
}

// Read returns data that has arrived and whose delay has passed, or reads
// the socket directly if no shaping applies.
func (c *conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	cfg := c.n.config()
	delay, up := cfg.oneWay(c.remote, c.local), cfg.uplinkFor(c.remote, c.local)

	c.mu.Lock()
	if err := c.stateErrLocked("read"); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if c.silent {
		defer c.mu.Unlock()
		return c.silentReadLocked()
	}
	if !c.inPump {
		if delay == 0 && up == nil {
			c.mu.Unlock()
			c.readWaits()
			n, err := c.Conn.Read(p)
			if err != nil && c.isSilent() {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.silentReadLocked()
			}
			return n, c.sockErr("read", err)
		}
		c.inPump = true
		// The pump reads without deadlines; Read enforces c.rdl.
		_ = c.Conn.SetReadDeadline(time.Time{})
		go c.readLoop()
	}
	defer c.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if err := c.stateErrLocked("read"); err != nil {
			return 0, err
		}
		if c.silent {
			return c.silentReadLocked()
		}
		now := time.Now()
		if len(c.in) > 0 && !c.in[0].due.After(now) {
			n := 0
			for n < len(p) && len(c.in) > 0 && !c.in[0].due.After(now) {
				k := copy(p[n:], c.in[0].b)
				n += k
				c.inBytes -= k
				if k == len(c.in[0].b) {
					c.in[0] = chunk{}
					c.in = c.in[1:]
				} else {
					c.in[0].b = c.in[0].b[k:]
				}
			}
			c.wakeInLocked()
			return n, nil
		}
		if len(c.in) == 0 && c.inErr != nil {
			return 0, c.inErr
		}
		if expired(c.rdl) {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		var due time.Time
		if len(c.in) > 0 {
			due = c.in[0].due
		}
		c.readWaits()
		c.sleepLocked(c.wakeIn, earliest(due, c.rdl))
	}
}

// readWaits tells the Network's test hook that a Read is about to wait.
func (c *conn) readWaits() {
	if h := c.n.readWaits; h != nil {
		h(c)
	}
}

// readLoop moves data from the socket to the incoming queue, stamping it
// with its delivery time after waiting for the remote site's uplink.
func (c *conn) readLoop() {
	buf := make([]byte, chunkSize)
	for {
		c.mu.Lock()
		for c.inBytes >= maxQueued && !c.closed && c.err == nil {
			c.sleepLocked(c.wakeIn, time.Time{})
		}
		stop := c.closed || c.err != nil
		c.mu.Unlock()
		if stop {
			return
		}

		n, err := c.Conn.Read(buf)
		if n > 0 {
			cfg := c.n.config()
			delay, up := cfg.oneWay(c.remote, c.local), cfg.uplinkFor(c.remote, c.local)
			if up != nil {
				if d := time.Until(up.reserve(n)); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-t.C:
					case <-c.kill:
						t.Stop()
						return
					}
				}
			}
			c.mu.Lock()
			c.in = append(c.in, chunk{b: bytes.Clone(buf[:n]), due: time.Now().Add(delay)})
			c.inBytes += n
			c.wakeInLocked()
			c.mu.Unlock()
		}
		if err != nil {
			c.mu.Lock()
			if c.silent {
				c.mu.Unlock()
				return
			}
			if errors.Is(err, io.EOF) {
				c.inErr = io.EOF
			} else {
				c.inErr = err
			}
			c.wakeInLocked()
			c.mu.Unlock()
			return
		}
	}
}

func (c *conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl = t
	c.wakeInLocked()
	if !c.inPump {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl = t
	c.wakeOutLocked()
	if !c.outPump {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

// earliest returns the earlier of two times, where zero means never.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	case a.Before(b):
		return a
	}
	return b
}
