package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Primary/backup replication (paper §5.3).
//
// Every committed store update of a slice is one numbered batch of
// mutations. The primary numbers batches inside the store's commit loop
// (so numbers follow commit order), persists the slice's stream position
// (epoch, seq) in the same transaction, and keeps recent batches in
// memory. One follower goroutine per backup sends committed batches in
// order, stamped with the primary's fencing epoch; a backup applies a
// batch only if it directly follows its own position, durably, and
// refuses epochs older than one it has seen. A backup that cannot follow
// (new, restarted, behind the in-memory log, or last fed by another
// primary) gets a snapshot of the slice: only the objects whose version
// or meta-data checksum differ travel. A writer waits until SyncLevel−1
// backups acknowledged its batch.

// Replication limits.
const (
	maxLogBatches   = 4096    // batches kept for backups that lag
	maxSendBatches  = 256     // batches per Replicate call
	maxInlineBlocks = 8 << 20 // block bytes carried in one Replicate call
	installChunk    = 1024    // objects per Install call
)

// pos is a replica's stream position in a slice.
type pos struct {
	epoch int64
	seq   uint64
}

func (p pos) less(q pos) bool { return p.epoch < q.epoch || p.epoch == q.epoch && p.seq < q.seq }

func posKey(s oid.Slice) string { return string(appendHex([]byte("repl/"), uint64(uint32(s)), 8)) }

func readPos(tx *store.Tx, s oid.Slice) pos {
	v, err := tx.Sys(posKey(s))
	if err != nil || len(v) != 16 {
		return pos{}
	}
	return pos{int64(binary.BigEndian.Uint64(v)), binary.BigEndian.Uint64(v[8:])}
}

func writePos(tx *store.Tx, s oid.Slice, p pos) error {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:], uint64(p.epoch))
	binary.BigEndian.PutUint64(v[8:], p.seq)
	return tx.PutSys(posKey(s), v[:])
}

// sliceRepl is the primary's replication state of one slice.
type sliceRepl struct {
	s        *Server
	slice    oid.Slice
	epoch    int64
	repLevel int // the policy's: the default SyncLevel
	ctx      context.Context
	cancel   context.CancelFunc

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every ack or commit
	seq       uint64        // last assigned
	committed uint64        // last durable at the primary
	log       []*wire.Batch // consecutive batches up to seq
	followers map[string]*follower
	wg        sync.WaitGroup
	tombs     bool // the slice may hold tombstones to collect
	// noOutcomes: no outcome records (once.go) were written since the
	// last sweep; false at first, so a new primary sweeps once.
	noOutcomes bool
	// listed is the replica list this primary wrote last, over replaced
	// (currentList).
	listed, replaced []string
	pinging          map[string]bool // backups pingIdle is pinging
	checked          time.Time       // last digest comparison (checkReplicas)
	collected        time.Time       // last tombstone collection (or taking the slice)
	swept            time.Time       // last sweep of outcome records
	quiet            *time.Timer     // sends what commitQuiet held back
	// since is when this server started serving the slice at this
	// epoch: orphans' holders get HolderIdle from then to show up.
	since time.Time
	// orphans are the slice's orphans this primary knows of (valued
	// with the sweeps in a row that found the object linked: its unlink
	// did not commit); until orphansKnown, the first sweep reads the
	// whole slice for them.
	orphans      map[oid.ID]int
	orphansKnown bool
	orphansSwept time.Time
	// unstable are the committed batches not yet at the backups their
	// writers wait for, oldest first; byObject lists them by object, in
	// seq order (stable.go).
	unstable    []*unstableBatch
	byObject    map[oid.ID][]*unstableBatch
	anyUnstable atomic.Bool // len(unstable) > 0, read without mu
}

// follower is one backup as the primary sees it.
type follower struct {
	id      string
	kick    chan struct{}
	stop    context.CancelFunc
	synced  bool     // acked is meaningful
	acked   uint64   // last seq the backup has durably
	pin     uint64   // a snapshot at this seq is on its way: keep later batches
	force   bool     // send a snapshot even if the backup seems to follow
	extra   []oid.ID // objects the next snapshot sends whatever the digests say (fsck)
	busy    bool     // it holds eventual changes not yet reconciled
	lastOK  time.Time
	failing time.Time // first failure since lastOK (zero when fine)
}

func newSliceRepl(s *Server, slice oid.Slice, epoch int64, repLevel int, seq uint64) *sliceRepl {
	ctx, cancel := context.WithCancel(s.bg)
	// Tombstones are first collected a collection period after the slice
	// is taken, not at once: the first maintenance pass follows any table
	// change, and collecting then could drop a removal's tombstone before
	// a late push it guards against arrives.
	now := time.Now()
	return &sliceRepl{s: s, slice: slice, epoch: epoch, repLevel: repLevel, ctx: ctx, cancel: cancel,
		changed: make(chan struct{}), seq: seq, committed: seq, followers: map[string]*follower{}, tombs: true,
		since: now, collected: now, orphans: map[oid.ID]int{}}
}

// signalLocked wakes waiters (r.mu held).
func (r *sliceRepl) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// assign numbers a batch of mutations (called inside the store's commit
// loop, so in commit order) and records the new position in tx. watch,
// if not nil, is registered as unstable (stable.go) under that number.
func (r *sliceRepl) assign(tx *store.Tx, muts []*wire.Mutation, watch *unstableBatch) (uint64, error) {
	r.mu.Lock()
	r.seq++
	seq := r.seq
	if watch != nil {
		watch.seq = seq
		r.watchLocked(watch)
	}
	if len(r.followers) > 0 { // a backup added later starts with a snapshot
		r.log = append(r.log, &wire.Batch{Seq: seq, Mutations: muts})
		if len(r.log) > maxLogBatches {
			clear(r.log[:len(r.log)-maxLogBatches])
			r.log = r.log[len(r.log)-maxLogBatches:]
		}
	}
	epoch := r.epoch
	r.mu.Unlock()
	// A batch that does not commit after all (a full disk) gives its
	// number back: followers must never be sent it, and the next batch
	// must follow the last committed one.
	tx.OnAbort(func() { r.unassign(seq) })
	return seq, writePos(tx, r.slice, pos{epoch, seq})
}

// unassign takes back seq, the last number assign gave, whose batch was
// not committed (called in the store's commit loop, newest first).
func (r *sliceRepl) unassign(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seq != seq {
		r.s.log.Error("replication: cannot take back an uncommitted batch number", "slice", r.slice, "seq", seq, "last", r.seq)
		return
	}
	r.seq--
	r.unwatchLocked(seq)
	if n := len(r.log); n > 0 && r.log[n-1].Seq == seq {
		r.log[n-1] = nil
		r.log = r.log[:n-1]
	}
}

// commit marks batches up to seq durable at the primary and kicks the
// followers. Commits complete in order, so the maximum is right.
func (r *sliceRepl) commit(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.committedLocked(seq)
	r.kickLocked()
}

// commitQuiet is commit without the kick, for a change whose client waits
// for it later (deferral): it travels with the next change of the slice
// (the file's commit) in one Replicate call instead of ahead of it, where
// the next would wait for its answer. A Sync, any other commit, or
// quietMax at the latest sends it.
func (r *sliceRepl) commitQuiet(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.committedLocked(seq)
	if r.quiet == nil {
		r.quiet = time.AfterFunc(quietMax, r.kick)
	}
}

// quietMax bounds how long commitQuiet holds a change back from backups.
const quietMax = 500 * time.Millisecond

func (r *sliceRepl) committedLocked(seq uint64) {
	if seq > r.committed {
		r.committed = seq
		r.signalLocked()
	}
}

// kick makes the followers send what is committed.
func (r *sliceRepl) kick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kickLocked()
}

func (r *sliceRepl) kickLocked() {
	if r.quiet != nil {
		r.quiet.Stop()
		r.quiet = nil
	}
	for _, f := range r.followers {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
}

// wait returns when need backups have acknowledged seq, or fails when ctx
// ends first. Backups not in the list yet count as missing: the caller
// caps need by what the deployment can give (update).
func (r *sliceRepl) wait(ctx context.Context, seq uint64, need int) error {
	for {
		r.mu.Lock()
		n := r.ackedLocked(seq)
		listed := len(r.followers)
		ch := r.changed
		r.mu.Unlock()
		if n >= need {
			return nil
		}
		select {
		case <-ch:
		case <-r.ctx.Done():
			return fmt.Errorf("slice %d: no longer primary while replicating: %w", r.slice, fserr.ErrNotPrimary)
		case <-ctx.Done():
			return fmt.Errorf("slice %d: %d of %d backups acknowledged before the deadline (%d listed): %w",
				r.slice, n, need, listed, fserr.ErrTimeout)
		}
	}
}

// setFollowers makes the followers the given backups.
func (r *sliceRepl) setFollowers(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return
	}
	want := map[string]bool{}
	for _, id := range ids {
		if id == r.s.cfg.ID {
			continue
		}
		want[id] = true
		if _, ok := r.followers[id]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(r.ctx)
		f := &follower{id: id, kick: make(chan struct{}, 1), stop: cancel}
		f.kick <- struct{}{}
		r.followers[id] = f
		r.wg.Add(1)
		go r.follow(ctx, f)
	}
	for id, f := range r.followers {
		if !want[id] {
			f.stop()
			delete(r.followers, id)
		}
	}
	r.signalLocked()
}

// close stops replication (the slice is no longer ours) and waits.
func (r *sliceRepl) close() {
	r.cancel()
	r.wg.Wait()
}

// followerHealth reports, per backup, since when it has been failing.
func (r *sliceRepl) followerHealth() map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Time, len(r.followers))
	for id, f := range r.followers {
		out[id] = f.failing
	}
	return out
}

// idle returns the backups not heard from within d (a ping is due).
func (r *sliceRepl) idle(d time.Duration) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, f := range r.followers {
		if time.Since(f.lastOK) > d {
			out = append(out, id)
		}
	}
	return out
}

// contact records the outcome of a call to backup id (a replication
// step or a ping): since when it fails, or that it answered.
func (r *sliceRepl) contact(id string, err error) {
	if err == nil {
		r.s.clearSuspect(id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.followers[id]
	switch {
	case !ok:
	case err == nil:
		f.lastOK, f.failing = time.Now(), time.Time{}
	case f.failing.IsZero():
		f.failing = time.Now()
	}
}

// startPing reports whether a ping of backup id may start (none is out).
func (r *sliceRepl) startPing(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pinging[id] {
		return false
	}
	if r.pinging == nil {
		r.pinging = map[string]bool{}
	}
	r.pinging[id] = true
	return true
}

func (r *sliceRepl) endPing(id string) {
	r.mu.Lock()
	delete(r.pinging, id)
	r.mu.Unlock()
}

// wroteList records that this primary replaced replica list old by cur.
func (r *sliceRepl) wroteList(old, cur []string) {
	r.mu.Lock()
	r.replaced, r.listed = slices.Clone(old), slices.Clone(cur)
	r.mu.Unlock()
}

// currentList is the slice table's replica list table, or the one this
// primary wrote over it when the table does not show that yet.
func (r *sliceRepl) currentList(table []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.replaced != nil && sameSet(table, r.replaced) && !sameSet(table, r.listed) {
		return slices.Clone(r.listed)
	}
	return table
}

// streaming reports whether backup id follows the stream (no snapshot due).
func (r *sliceRepl) streaming(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.followers[id]
	return ok && f.synced
}

// caughtUp reports whether backup id has everything committed.
func (r *sliceRepl) caughtUp(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.followers[id]
	return ok && f.synced && f.acked >= r.committed
}

// follow feeds one backup until ctx ends.
func (r *sliceRepl) follow(ctx context.Context, f *follower) {
	defer r.wg.Done()
	backoff := 20 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		for ctx.Err() == nil {
			if r.s.paused.Load() { // a paused process sends nothing
				if !sleepCtx(ctx, 10*time.Millisecond) {
					return
				}
				continue
			}
			more, err := r.step(ctx, f)
			if errors.Is(err, errBusy) {
				// Not a failure: it pushes its changes first (maintenance).
				r.contact(f.id, nil)
				if !sleepCtx(ctx, max(r.s.cfg.MaintainPeriod/4, 20*time.Millisecond)) {
					return
				}
				continue
			}
			r.contact(f.id, err)
			if err != nil {
				if errors.Is(err, errStale) {
					r.s.lostSlice(r.slice, r.epoch, "a backup has seen a newer epoch")
					return
				}
				if errors.Is(err, fserr.ErrInvalid) {
					// It cannot apply these batches, and would refuse
					// them again: a snapshot brings it up to date.
					r.s.log.Warn("backup refused the stream; sending it a snapshot", "slice", r.slice, "backup", f.id, "err", err)
					r.resync(f.id)
				}
				if errors.Is(err, fserr.ErrNoSpace) && !r.s.suspected(f.id) {
					// Its disk is full: replace it now (tend), as one
					// that does not answer, rather than retry until
					// DeadAfter while writes wait.
					r.s.log.Warn("backup's disk is full; replacing it", "slice", r.slice, "backup", f.id, "err", err)
					r.s.suspect(f.id)
					r.s.kick()
				}
				if ctx.Err() == nil {
					r.s.log.Debug("replication to backup failed; retrying", "slice", r.slice, "backup", f.id, "err", err)
				}
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(backoff*2, time.Second)
				continue
			}
			backoff = 20 * time.Millisecond
			if !more {
				break
			}
		}
	}
}

var (
	errStale = errors.New("stale epoch")
	errBusy  = errors.New("backup busy with eventual changes")
	errGone  = errors.New("block no longer stored")
)

// readBlocks returns the blocks of hs that the store still has: a block
// a batch references may have been freed by a later batch.
func (s *Server) readBlocks(hs [][32]byte) [][]byte {
	if data, err := s.store.ReadBlocks(hs); err == nil {
		return data
	}
	var out [][]byte
	for _, h := range hs {
		if d, err := s.store.ReadBlock(h); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// step does one round of work for a backup: a snapshot if it needs one,
// else the next committed batches. more reports whether work remains.
func (r *sliceRepl) step(ctx context.Context, f *follower) (more bool, err error) {
	r.mu.Lock()
	synced, acked := f.synced, f.acked
	r.mu.Unlock()
	if !synced {
		return true, r.snapshot(ctx, f)
	}
	r.mu.Lock()
	committed := r.committed
	var batches []*wire.Batch
	if acked < committed {
		if len(r.log) == 0 || r.log[0].Seq > acked+1 {
			f.synced = false // fell behind the log
			r.mu.Unlock()
			return true, nil
		}
		i := int(acked + 1 - r.log[0].Seq)
		for ; i < len(r.log) && r.log[i].Seq <= committed && len(batches) < maxSendBatches; i++ {
			batches = append(batches, r.log[i])
		}
	}
	r.mu.Unlock()
	if len(batches) == 0 {
		return false, nil
	}
	req := &wire.ReplicateRequest{Slice: uint32(r.slice), Epoch: r.epoch, Batches: batches}
	var hs [][32]byte
	for _, b := range batches {
		hs = append(hs, store.MutationBlocks(b.Mutations)...)
	}
	if len(hs) > 0 && len(hs) <= r.s.xfer.blocks(f.id) {
		req.Blocks = r.s.readBlocks(hs) // else the backup asks for what it lacks
	}
	resp, err := r.replicate(ctx, f.id, req)
	if err != nil {
		return false, err
	}
	if resp.Status == wire.ReplStatus_REPL_BUSY {
		r.setBusy(f)
		return false, errBusy
	}
	if resp.Status == wire.ReplStatus_REPL_MISSING_BLOCKS {
		if err := r.pushBlocks(ctx, f.id, resp.Missing); errors.Is(err, errGone) {
			r.mu.Lock()
			f.synced = false // a later batch freed it: catch up by snapshot
			r.mu.Unlock()
			return true, nil
		} else if err != nil {
			return false, err
		}
		return true, nil
	}
	if err := r.outcome(f, resp.Status, resp.Seq); err != nil {
		return false, err
	}
	r.mu.Lock()
	more = f.synced && f.acked < r.committed
	r.mu.Unlock()
	return more, nil
}

// outcome records a backup's answer.
func (r *sliceRepl) outcome(f *follower, st wire.ReplStatus, seq uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch st {
	case wire.ReplStatus_REPL_OK:
		f.synced, f.acked, f.pin, f.force, f.busy = true, seq, 0, false, false
		r.trimLocked()
		r.pruneLocked()
		r.signalLocked()
		return nil
	case wire.ReplStatus_REPL_NEED_SYNC:
		f.synced = false
		return nil
	case wire.ReplStatus_REPL_STALE_EPOCH:
		return errStale
	}
	return fmt.Errorf("backup %s: unexpected status %v", f.id, st)
}

// trimLocked drops batches every backup has.
func (r *sliceRepl) trimLocked() {
	low := r.committed
	for _, f := range r.followers {
		switch {
		case f.synced:
			low = min(low, f.acked)
		case f.pin > 0:
			low = min(low, f.pin)
		}
	}
	n := 0
	for n < len(r.log) && r.log[n].Seq <= low {
		n++
	}
	if n > 0 {
		clear(r.log[:n])
		r.log = r.log[n:]
	}
}

func (r *sliceRepl) replicate(ctx context.Context, id string, req *wire.ReplicateRequest) (*wire.ReplicateResponse, error) {
	p, err := r.s.peer(ctx, id)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.s.cfg.PeerTimeout)
	defer cancel()
	start := time.Now()
	n := blockBytes(req.Blocks)
	var answered atomic.Bool
	if d := r.s.cfg.StallAfter; d > 0 {
		stall := time.AfterFunc(d+r.s.xfer.duration(id, n), func() { r.checkStalled(id, n, &answered) })
		defer stall.Stop()
	}
	resp, err := p.Replicate(cctx, req)
	answered.Store(true)
	if n > 0 {
		r.s.xfer.done(id, n, time.Since(start), err != nil && cctx.Err() != nil && ctx.Err() == nil)
	}
	return resp, fserr.FromStatus(err)
}

// checkStalled pings backup id, whose replication call (carrying n block
// bytes) is unanswered past StallAfter: a backup that does not answer a
// ping either, while the call is still out, is suspected and replaced at
// once (tend). The ping may queue behind the call's data on the link, so
// it gets the time that data takes, and at least a second.
func (r *sliceRepl) checkStalled(id string, n int, answered *atomic.Bool) {
	ctx, cancel := context.WithTimeout(r.ctx, max(time.Second, 2*r.s.xfer.duration(id, n)))
	defer cancel()
	p, err := r.s.peer(ctx, id)
	if err == nil {
		_, err = p.Ping(ctx, &wire.PingRequest{})
	}
	if err == nil || answered.Load() || r.ctx.Err() != nil {
		return
	}
	r.s.log.Warn("backup answers neither replication nor a ping; replacing it", "slice", r.slice, "backup", id, "err", err)
	r.s.suspect(id)
	r.contact(id, err)
	r.s.kick()
}

func blockBytes(blocks [][]byte) (n int) {
	for _, b := range blocks {
		n += len(b)
	}
	return n
}

// pushBlocks sends blocks a backup lacks, in calls sized for the link.
func (r *sliceRepl) pushBlocks(ctx context.Context, id string, missing [][]byte) error {
	for len(missing) > 0 {
		n := min(r.s.xfer.blocks(id), len(missing))
		hs := make([][32]byte, 0, n)
		for _, h := range missing[:n] {
			if len(h) == 32 {
				hs = append(hs, [32]byte(h))
			}
		}
		missing = missing[n:]
		data := r.s.readBlocks(hs)
		if len(data) < len(hs) {
			return errGone
		}
		resp, err := r.replicate(ctx, id, &wire.ReplicateRequest{Slice: uint32(r.slice), Epoch: r.epoch, Blocks: data})
		if err != nil {
			return err
		}
		if resp.Status == wire.ReplStatus_REPL_STALE_EPOCH {
			return errStale
		}
	}
	return nil
}

// setBusy records that backup f refused the stream until it has pushed
// its eventual changes.
func (r *sliceRepl) setBusy(f *follower) {
	r.mu.Lock()
	f.busy = true
	r.mu.Unlock()
}

// resync makes backup id get a snapshot (its copy differs from ours),
// which sends the objects extra whole even where the digests agree (a
// directory entry the digest does not cover); false if id is not a
// backup of the slice.
func (r *sliceRepl) resync(id string, extra ...oid.ID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.followers[id]
	if !ok {
		return false
	}
	f.synced, f.force = false, true
	f.extra = append(f.extra, extra...)
	select {
	case f.kick <- struct{}{}:
	default:
	}
	return true
}

// due reports whether a periodic task last run at *last is due (every
// d), and if so starts its next period.
func (r *sliceRepl) due(last *time.Time, d time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(*last) < d {
		return false
	}
	*last = time.Now()
	return true
}

// caughtUpAt returns the backups that follow the stream and have
// acknowledged exactly seq.
func (r *sliceRepl) caughtUpAt(seq uint64) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, f := range r.followers {
		if f.synced && !f.busy && f.acked == seq {
			out = append(out, id)
		}
	}
	return out
}

// everyoneHas returns the highest seq every replica of the slice has
// applied: every backup in replicas follows the stream, answers, and is
// not holding eventual changes. ok is false if some replica does not.
func (r *sliceRepl) everyoneHas(replicas []string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	low := r.committed
	for _, id := range replicas {
		if id == r.s.cfg.ID {
			continue
		}
		f, ok := r.followers[id]
		if !ok || !f.synced || f.busy || !f.failing.IsZero() {
			return 0, false
		}
		low = min(low, f.acked)
	}
	return low, true
}

func (r *sliceRepl) markTombs() {
	r.mu.Lock()
	r.tombs = true
	r.mu.Unlock()
}

// lastCommitted is the slice's last change durable at the primary.
func (r *sliceRepl) lastCommitted() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.committed
}

// markOutcomes notes that the slice holds outcome records (once.go) for
// maintenance to sweep.
func (r *sliceRepl) markOutcomes() {
	r.mu.Lock()
	r.noOutcomes = false
	r.mu.Unlock()
}

// takeOutcomes reports whether outcome records were written since it was
// last called.
func (r *sliceRepl) takeOutcomes() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	had := !r.noOutcomes
	r.noOutcomes = true
	return had
}

// addOrphan notes an orphan being made in the slice (its transaction
// may not have committed yet: a sweep meanwhile finds it linked).
func (r *sliceRepl) addOrphan(id oid.ID) {
	r.mu.Lock()
	r.orphans[id] = 0
	r.mu.Unlock()
}

// servingSince is when this server started serving the slice.
func (r *sliceRepl) servingSince() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.since
}

// knowsOrphan reports whether id is one of the slice's orphans; known
// is false until the primary's first sweep has read the slice.
func (r *sliceRepl) knowsOrphan(id oid.ID) (is, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, is = r.orphans[id]
	return is, r.orphansKnown
}

// orphansDue reports whether a sweep of the slice's orphans is due:
// there are some, or none is known yet, and a period passed.
func (r *sliceRepl) orphansDue(period time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.orphansKnown && len(r.orphans) == 0 || time.Since(r.orphansSwept) < period {
		return false
	}
	r.orphansSwept = time.Now()
	return true
}

// orphanList returns the orphans known, and whether they are all.
func (r *sliceRepl) orphanList() ([]oid.ID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]oid.ID, 0, len(r.orphans))
	for id := range r.orphans {
		ids = append(ids, id)
	}
	return ids, r.orphansKnown
}

// sweptOrphans records what a sweep found: orphans, objects gone, and
// listed ones found linked (forgotten the second sweep in a row: one
// sweep may have read before their unlink committed).
func (r *sliceRepl) sweptOrphans(found, gone, linked []oid.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range found {
		r.orphans[id] = 0
	}
	for _, id := range gone {
		delete(r.orphans, id)
	}
	for _, id := range linked {
		if n, ok := r.orphans[id]; ok && n >= 1 {
			delete(r.orphans, id)
		} else if ok {
			r.orphans[id] = n + 1
		}
	}
	r.orphansKnown = true
}

func (r *sliceRepl) hasTombs() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tombs
}

// sleepCtx waits for d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
