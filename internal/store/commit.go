package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.etcd.io/bbolt"
)

// Request states.
const (
	reqQueued int32 = iota
	reqRunning
	reqCancelled
)

// request is one queued Update.
type request struct {
	ctx      context.Context
	fn       func(*Tx) error
	state    atomic.Int32
	err      error
	panicked bool
	panicVal any
	done     chan struct{} // buffered (1); reused through reqPool
}

var reqPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

var errPanicked = errors.New("store: update function panicked")

// Update runs fn in a read-write transaction and returns once its changes
// are durable (or fn failed, in which case none of them is applied). fn may
// run in a batch with other callers' functions; its own error rolls back
// only its own writes. ctx is honoured only until fn starts; after that the
// update completes. fn must not call Update or View and must not keep the
// Tx. A panic in fn is re-raised in the caller.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := reqPool.Get().(*request)
	r.ctx, r.fn = ctx, fn
	r.state.Store(reqQueued)
	s.qmu.Lock()
	if s.closed {
		s.qmu.Unlock()
		r.ctx, r.fn = nil, nil
		reqPool.Put(r)
		return ErrClosed
	}
	s.queue = append(s.queue, r)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	if cancel := ctx.Done(); cancel != nil {
		select {
		case <-r.done:
		case <-cancel:
			if r.state.CompareAndSwap(reqQueued, reqCancelled) {
				// The committer drops it (and it is not recycled).
				return ctx.Err()
			}
			<-r.done
		}
	} else {
		<-r.done
	}
	err, panicked, pv := r.err, r.panicked, r.panicVal
	r.ctx, r.fn, r.err, r.panicked, r.panicVal = nil, nil, nil, false, nil
	reqPool.Put(r)
	if panicked {
		panic(pv)
	}
	return err
}

// View runs fn in a read-only transaction on a consistent snapshot. Writes
// fail with ErrReadOnly.
func (s *Store) View(fn func(*Tx) error) error {
	t := viewPool.Get().(*Tx)
	t.s = s
	err := s.db.View(func(btx *bbolt.Tx) error {
		t.btx = btx
		return fn(t)
	})
	t.btx = nil
	t.bk = [nBuckets]*bbolt.Bucket{}
	t.s = nil
	viewPool.Put(t)
	if errors.Is(err, bbolt.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

var viewPool = sync.Pool{New: func() any { return new(Tx) }}

// loop is the committer: it drains the queue and commits each drain as one
// batch. It never waits for a timer; batches form while a commit is in
// flight.
func (s *Store) loop() {
	defer close(s.loopDone)
	var batch []*request
	for range s.wake {
		for {
			s.qmu.Lock()
			batch, s.queue = s.queue, batch[:0]
			closed := s.closed
			s.qmu.Unlock()
			if len(batch) == 0 {
				if closed {
					return
				}
				break
			}
			s.runBatch(batch)
			clear(batch)
		}
	}
}

func answer(r *request, err error) {
	r.err = err
	r.done <- struct{}{}
}

// runBatch runs the functions of batch in one bbolt transaction, makes the
// block data they reference durable, commits, and answers every caller.
func (s *Store) runBatch(batch []*request) {
	// Claim the requests; drop those whose caller gave up.
	n := 0
	for _, r := range batch {
		if !r.state.CompareAndSwap(reqQueued, reqRunning) {
			continue
		}
		if err := r.ctx.Err(); err != nil {
			answer(r, err)
			continue
		}
		batch[n] = r
		n++
	}
	clear(batch[n:])
	batch = batch[:n]
	if n == 0 {
		return
	}

	btx, err := s.db.Begin(true)
	if err != nil {
		if errors.Is(err, bbolt.ErrDatabaseNotOpen) {
			err = ErrClosed
		} else {
			err = fmt.Errorf("store: begin: %w", err)
		}
		for _, r := range batch {
			answer(r, err)
		}
		return
	}
	t := &s.wtx
	t.beginUpdate(btx)
	var batchErr error
	ok := 0
	for i, r := range batch {
		if batchErr != nil {
			break
		}
		if err := s.runFn(t, r); err != nil {
			t.discardFn()
			answer(r, err)
			batch[i] = nil
			continue
		}
		if err := t.applyFn(); err != nil {
			batchErr = fmt.Errorf("store: apply: %w", err)
		}
		ok++
	}
	if batchErr == nil && ok > 0 {
		batchErr = s.syncBatch(t)
	}
	if batchErr == nil && ok > 0 {
		if err := btx.Commit(); err != nil {
			batchErr = ioErr("commit", err)
		} else {
			s.batches.Add(1)
			s.afterCommit(t)
		}
	} else {
		_ = btx.Rollback()
	}
	t.endUpdate()
	for _, r := range batch {
		if r != nil {
			answer(r, batchErr)
		}
	}
}

func (s *Store) runFn(t *Tx, r *request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.panicked, r.panicVal = true, p
			err = errPanicked
		}
	}()
	return r.fn(t)
}

// syncBatch fdatasyncs every segment holding block data that this batch
// newly references, so that no index entry points at non-durable bytes.
func (s *Store) syncBatch(t *Tx) error {
	syncs := t.batch.syncs
	for i := range syncs {
		need := syncs[i]
		if need.seg == 0 {
			continue
		}
		for j := i + 1; j < len(syncs); j++ { // merge duplicates
			if syncs[j].seg == need.seg {
				need.end = max(need.end, syncs[j].end)
				syncs[j].seg = 0
			}
		}
		seg := s.segment(need.seg)
		if seg == nil {
			return fmt.Errorf("store: segment %s vanished before commit: %w", segName(need.seg), errSegmentGone)
		}
		if err := s.syncSegment(seg, need.end); err != nil {
			return err
		}
	}
	return nil
}

var errSegmentGone = errors.New("segment deleted")

// afterCommit publishes the committed batch's side effects.
func (s *Store) afterCommit(t *Tx) {
	b := &t.batch
	if b.objects != 0 {
		s.objects.Add(int64(b.objects))
	}
	if len(b.used) > 0 {
		s.pendMu.Lock()
		for _, h := range b.used {
			delete(s.pending, h)
		}
		s.pendMu.Unlock()
	}
	if len(b.live) > 0 {
		s.segMu.Lock()
		for _, d := range b.live {
			s.live[d.seg] += d.n
		}
		s.segMu.Unlock()
	}
}
