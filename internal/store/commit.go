package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
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
	lazy     bool // Lazily: answered once logged, before it is synced
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
	r.lazy = ctx.Value(lazyKey{}) != nil
	r.state.Store(reqQueued)
	s.qmu.Lock()
	if s.closed {
		s.qmu.Unlock()
		r.ctx, r.fn = nil, nil
		reqPool.Put(r)
		return ErrClosed
	}
	s.queue = append(s.queue, r)
	var batch []*request
	if !s.committing {
		// Nothing is being committed: commit the queue (this request
		// and any that came with it) here, sparing the hand-offs to the
		// committer goroutine and back, each a thread wake-up.
		s.committing = true
		batch, s.queue = s.queue, s.spare
		s.spare = nil
	}
	s.qmu.Unlock()
	if batch != nil {
		s.runBatch(batch)
		s.doneCommitting(batch)
	} else {
		s.wakeLoop()
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

// View runs fn in a read-only transaction on a consistent snapshot that
// includes every Update that returned before View was called. Writes fail
// with ErrReadOnly.
func (s *Store) View(fn func(*Tx) error) error {
	t := viewPool.Get().(*Tx)
	t.s = s
	if err := s.beginRead(t, false); err != nil {
		t.s = nil
		viewPool.Put(t)
		return err
	}
	defer func() {
		t.endRead()
		t.s = nil
		viewPool.Put(t)
	}()
	return fn(t)
}

var viewPool = sync.Pool{New: func() any { return new(Tx) }}

// loop is the committer for updates that arrive while a batch is being
// committed: it drains the queue and commits each drain as one batch. It
// never waits for a timer; batches form while a commit is in flight. An
// Update that finds no commit under way commits in its caller instead.
func (s *Store) loop() {
	defer close(s.loopDone)
	for range s.wake {
		for {
			s.qmu.Lock()
			if s.committing {
				s.qmu.Unlock()
				break // doneCommitting wakes the loop again
			}
			if len(s.queue) == 0 {
				closed := s.closed
				s.qmu.Unlock()
				if closed {
					return
				}
				break
			}
			batch := s.queue
			s.queue, s.spare = s.spare, nil
			s.committing = true
			s.qmu.Unlock()
			s.runBatch(batch)
			s.doneCommitting(batch)
		}
	}
}

// doneCommitting ends a runBatch and hands what queued meanwhile (or the
// close) to the loop.
func (s *Store) doneCommitting(batch []*request) {
	clear(batch)
	s.qmu.Lock()
	s.committing = false
	if s.spare == nil {
		s.spare = batch[:0]
	}
	more := len(s.queue) > 0 || s.closed
	s.qmu.Unlock()
	if more {
		s.wakeLoop()
	}
}

func (s *Store) wakeLoop() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func answer(r *request, err error) {
	r.err = err
	r.done <- struct{}{}
}

// runBatch runs the functions of batch against one read view, logs the
// writes of the successful ones as one durable record, applies them to the
// overlay and answers every caller.
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
	answerAll := func(err error) {
		for _, r := range batch {
			if r != nil {
				answer(r, err)
			}
		}
	}
	if s.failed != nil {
		answerAll(s.failed)
		return
	}
	// Far over the threshold: let the running checkpoint finish first, so
	// the overlay stays bounded. (Before beginning a bbolt read transaction,
	// which the checkpoint's commit may have to wait for.)
	if s.overThreshold(2) {
		s.kickCheckpoint()
		s.ckMu.Lock() // wait for it
		s.ckMu.Unlock()
	}

	t := &s.wtx
	if err := s.beginRead(t, true); err != nil {
		answerAll(err)
		return
	}
	t.baseObjects = s.objects.Load()
	ok, lazy := 0, true
	for i, r := range batch {
		if err := s.runFn(t, r); err != nil {
			t.discardFn()
			answer(r, err)
			batch[i] = nil
			continue
		}
		t.keepFn()
		ok++
		lazy = lazy && r.lazy
	}
	var err error
	if ok > 0 {
		if len(t.ops) > 0 {
			err = s.commit(t, !lazy)
		}
		if err == nil {
			s.batches.Add(1)
			s.afterCommit(t)
		} else {
			t.abortBatch()
		}
	}
	t.endUpdate()
	answerAll(err)
}

// commit logs the batch's writes as one record, durable unless !sync,
// and applies them to the mutable overlay layer.
func (s *Store) commit(t *Tx, sync bool) error {
	inl, err := s.syncBatch(t)
	if err != nil {
		return err
	}
	seq := t.seq + 1
	rec := encodeRecord(seq, t.ops, inl...)
	if len(rec)-walHeader > maxWALRecord { // bbolt could not take it either
		return fmt.Errorf("store: %d bytes of changes in one batch: %w", len(rec), fserr.ErrNoSpace)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if err := s.appendLog(rec, sync); err != nil {
		return err
	}
	// The overlay keeps referencing rec (never reused).
	snap := s.snap.Load()
	m := snap.layers[0]
	if err := decodeOps(rec[walHeader:], func(b int, del bool, k, v []byte) { m.put(b, k, v, seq, del) }, nil); err != nil {
		panic("store: cannot decode a record just encoded: " + err.Error())
	}
	if len(inl) > 0 {
		m.addInline(inl)
		s.inlined.Add(1)
	}
	s.snap.Store(&snapshot{layers: snap.layers, seq: seq})
	if s.overThreshold(1) {
		s.kickCheckpoint()
	}
	return nil
}

// appendLog appends rec to the log and makes it durable (commitMu held).
// A failure after the record may have reached the file makes the store
// refuse further updates: what the log holds is unknown until a restart
// replays it. Except for a full disk (ENOSPC, EDQUOT: a copy-on-write file
// system allocates on overwrite too): the record's bytes are zeroed again
// (an overwrite of pages the failed write allocated), the log's end stays
// where it was, and the next record is written in its place; its
// fdatasync flushes the zeros too, so a torn record can never be read
// after the records that follow. Only if the zeroing fails is the store
// stopped.
//
// Without sync the record is written but not synced (a lazy batch): the
// next synced record's fdatasync covers it, as it is earlier in the same
// file, and lazyTimer syncs it within Options.LazyFlushDelay otherwise. After a
// failed sync of lazy records (logErr) nothing is appended.
func (s *Store) appendLog(rec []byte, sync bool) error {
	if s.logErr != nil {
		s.failed = s.logErr
		return s.failed
	}
	w := s.wal
	if need := w.off + int64(len(rec)) - w.alloc; need > 0 {
		err := w.grow((need + walChunk - 1) / walChunk * walChunk)
		if noSpace(err) { // a nearly full disk: only what this record needs
			if need = w.off + int64(len(rec)) - w.alloc; need > 0 {
				err = w.grow((need + 4095) &^ 4095)
			} else {
				err = nil
			}
		}
		if err != nil {
			return err // nothing was logged; the log is still usable
		}
	}
	_, err := w.f.WriteAt(rec, w.off)
	if err == nil && !s.noSync && sync {
		err = fdatasync(w.f)
		s.logSyncs.Add(1)
	}
	if err != nil {
		if noSpace(err) {
			if zerr := w.zero(w.off, int64(len(rec))); zerr == nil {
				s.log.Warn("store: log write failed for lack of space; the update is refused", "err", err)
				return ioErr("write log", err)
			}
		}
		s.failed = ioErr("write log (restart the store to recover)", err)
		return s.failed
	}
	w.off += int64(len(rec))
	if sync {
		s.walDirty.Store(false)
	} else if !s.noSync {
		s.walDirty.Store(true)
		if !s.lazyArmed {
			s.lazyArmed = true
			s.lazyTimer.Reset(s.lazyDelay)
		}
	}
	return nil
}

// DefaultLazyFlushDelay bounds how long a lazy update (Lazily) stays in
// the log unsynced when no synced update or Flush comes first
// (Options.LazyFlushDelay).
const DefaultLazyFlushDelay = 50 * time.Millisecond

type lazyKey struct{}

// Lazily marks ctx's Update as one whose caller need not wait for it to
// be durable: it is answered once logged and applied, and becomes
// durable with the next update that is not lazy, at Flush, at a
// checkpoint, or within Options.LazyFlushDelay. Updates are durable in order (one
// log), so a crash loses a suffix of lazy updates and nothing after them.
// For changes POSIX makes durable only at the next fsync(2): unlink,
// chmod, utimes.
func Lazily(ctx context.Context) context.Context {
	return context.WithValue(ctx, lazyKey{}, true)
}

// Flush makes every update answered so far durable (a barrier for lazy
// ones).
func (s *Store) Flush() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.syncLazyLocked()
}

// syncLazyLocked syncs the log if lazy records are unsynced (commitMu
// held). A failure is final (logErr): every later sync and append fails
// with it, so the store takes no update until a restart replays the log.
// It stays under commitMu: a synced append's fdatasync running beside it
// could be the one told of a failure and report success to the other.
func (s *Store) syncLazyLocked() error {
	if s.logErr != nil {
		return s.logErr
	}
	if !s.walDirty.Load() || s.wal == nil {
		return nil
	}
	var err error
	if s.logSyncFault != nil {
		err = s.logSyncFault()
	} else {
		err = fdatasync(s.wal.f)
		s.logSyncs.Add(1)
	}
	if err != nil {
		s.logErr = ioErr("sync lazy log records (restart the store to recover)", err)
		s.log.Error("store: sync of lazy log records failed; the store takes no more updates", "err", err)
		return s.logErr
	}
	s.walDirty.Store(false)
	return nil
}

// lazyFlush is lazyTimer's function.
func (s *Store) lazyFlush() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.lazyArmed = false
	if !s.lazyOff {
		_ = s.syncLazyLocked() // a failure is logged and kept (logErr)
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

// inlineMax is the most block data a batch logs inline. If the blocks a
// batch newly references that are not yet durable in their segments total
// at most this much, their bytes go into the batch's log record, whose
// fdatasync makes them durable: a small file's close then costs one
// fdatasync of the preallocated log instead of two, the first of a growing
// segment file (a journal commit). Larger batches fdatasync the segments
// before the log record is written, so bulk data is not written twice.
const inlineMax = 256 << 10

// syncBatch makes the block data that this batch newly references durable
// before the record that points at it: it returns the blocks to log inline
// (with their bytes, read back from the segments), or fdatasyncs their
// segments and returns nil.
func (s *Store) syncBatch(t *Tx) ([]inlineBlock, error) {
	fresh := t.batch.fresh
	if len(fresh) == 0 {
		return nil, nil
	}
	inl := t.inl[:0]
	var total int64
	for i := range fresh {
		l := fresh[i].l
		seg := s.segment(l.seg)
		if seg == nil {
			return nil, fmt.Errorf("store: segment %s vanished before commit: %w", segName(l.seg), errSegmentGone)
		}
		if seg.synced.Load() >= l.end() {
			continue // durable already
		}
		// A block indexed, freed and indexed again within the batch is
		// logged twice; that is harmless.
		if total += int64(l.n); total > inlineMax {
			clear(inl)
			t.inl = inl[:0]
			return nil, s.syncSegments(t)
		}
		inl = append(inl, inlineBlock{h: fresh[i].h, l: l})
	}
	t.inl = inl
	if len(inl) == 0 {
		return nil, nil
	}
	if int64(cap(t.inlBuf)) < total {
		t.inlBuf = make([]byte, total, max(total, 64<<10))
	}
	buf := t.inlBuf[:total]
	for i := range inl {
		b := &inl[i]
		d := buf[:b.l.n:b.l.n]
		buf = buf[b.l.n:]
		seg := s.segment(b.l.seg)
		if seg == nil {
			return nil, fmt.Errorf("store: segment %s vanished before commit: %w", segName(b.l.seg), errSegmentGone)
		}
		live, err := seg.readAt(d, int64(b.l.off))
		if !live {
			return nil, fmt.Errorf("store: segment %s vanished before commit: %w", segName(b.l.seg), errSegmentGone)
		}
		if err != nil {
			return nil, ioErr(fmt.Sprintf("read back block %s from %s at %d", short(b.h[:]), segName(b.l.seg), b.l.off), err)
		}
		if blockCRC(d) != b.l.crc {
			return nil, fmt.Errorf("store: block %s in %s at %d: checksum mismatch before commit: %w",
				short(b.h[:]), segName(b.l.seg), b.l.off, fserr.ErrIO)
		}
		b.data = d
	}
	return inl, nil
}

// syncSegments fdatasyncs every segment holding block data that this batch
// newly references.
func (s *Store) syncSegments(t *Tx) error {
	ends := t.ends[:0]
	defer func() { t.ends = ends[:0] }()
next:
	for i := range t.batch.fresh {
		l := t.batch.fresh[i].l
		for j := range ends {
			if ends[j].seg == l.seg {
				ends[j].end = max(ends[j].end, l.end())
				continue next
			}
		}
		ends = append(ends, segEnd{l.seg, l.end()})
	}
	for _, e := range ends {
		seg := s.segment(e.seg)
		if seg == nil {
			return fmt.Errorf("store: segment %s vanished before commit: %w", segName(e.seg), errSegmentGone)
		}
		if err := s.syncSegment(seg, e.end); err != nil {
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
