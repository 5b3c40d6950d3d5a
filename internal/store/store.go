// Package store is a storage server's crash-safe local store.
//
// Meta-data (objects, directory entries, block maps, the block index,
// extended attributes, ID counters and small system records) lives in a
// bbolt database (dir/meta.db) fronted by a write-ahead log (dir/wal-*).
// Block contents live in append-only segment files (dir/blocks/seg-%08d),
// addressed by their SHA-256 and deduplicated.
//
// Nothing is acknowledged before it is durable. Update runs its function
// with group commit: a single committer goroutine takes every Update queued
// at that moment and runs their functions against a read view; each
// function's writes are buffered as a list of puts and deletes and kept
// only if it succeeds, so a failing function rolls back only its own
// changes. The kept writes of the whole batch become one checksummed,
// sequence-numbered log record: the committer makes the newly referenced
// block data durable (see below), appends the record, fdatasyncs the log
// (one flush: log files are preallocated), inserts the writes into the
// in-memory overlay and answers every caller. A lone caller is committed at
// once (there is no batching delay); concurrent callers batch while the
// previous commit is in flight.
//
// The overlay is an ordered, multi-version memtable per layer. Readers
// (View, and Update functions) see the mutable layer, then the frozen
// layer being checkpointed, then a bbolt read transaction, all as of one
// sequence number, so a view is consistent and costs no copying. A
// background checkpoint, started when the mutable layer is large, a while
// after the last one, or on Close, freezes the mutable layer (switching to
// a new log file), writes it to bbolt in one transaction together with the
// sequence number it covers, deletes the old log files and drops the
// layer. On Open the records after bbolt's checkpoint are replayed into
// bbolt, up to the first torn or corrupt one (a crash's torn tail). Log
// records hold whole values (reference counts included), so replaying one
// twice is harmless.
//
// PutBlock appends a block to the active segment without syncing and
// remembers it as pending; the Update that first references it (SetBlock)
// makes it durable before the record that points at it takes effect, in
// one of two ways (the inline-block rule). If the blocks a batch newly
// references that are not yet fdatasynced in their segments total at most
// inlineMax (256 KiB), the record carries their bytes too (hash, segment,
// offset, CRC-32C, data), and the log's fdatasync makes them durable: a
// small file's close costs one flush of the preallocated log rather than a
// flush of a growing segment file (a file-system journal commit) as well.
// Larger batches fdatasync the segments first, so bulk data is not written
// twice. A checkpoint fdatasyncs every segment holding blocks its records
// carried before bbolt records it (after which those records are no longer
// replayed) and their log files are deleted. Replay checks each carried
// block that the replayed index still places at the logged location
// against the CRC-32C there, writes back missing or damaged bytes
// (extending the segment if it is short) and fdatasyncs those segments
// before committing the replay; a block the index no longer has, or that
// Compact moved (Compact syncs its copies before repointing the index), is
// left alone, so stale locations are never resurrected.
//
// Pending blocks that nothing references are forgotten after PendingTTL or
// on restart; their bytes are dead space that Compact reclaims. On Open,
// after the log replay, the segment with the highest number (the active
// one, or the compaction target) is truncated to the largest offset the
// index references, dropping data that was never acknowledged (blocks
// restored from the log are indexed, so they stay).
//
// Freed blocks are reclaimed in the background: every CompactInterval a
// goroutine runs Compact, which copies the live (and pending) blocks of
// every segment whose dead bytes exceed CompactDeadFraction of its size
// into a separate compaction segment, syncs the copies, repoints the index
// in one Update and deletes the old files (see Compact for why a crash at
// any point loses nothing). After a pass the segment files hold at most
// (live+pending)/(1−f) bytes plus activeMinDead (≤ 8 MiB) of dead bytes in
// the active segment, f being CompactDeadFraction: with the default 0.5,
// dead space is at most the live data plus 8 MiB, plus whatever was freed
// since the last pass.
//
// Lock order: ckMu → commitMu; appendMu → pendMu → segMu → segment.mu.
package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/wheelfs/wheelfs/internal/dirlock"
	"github.com/wheelfs/wheelfs/internal/fserr"
)

const (
	// MaxBlockSize is the largest block PutBlock accepts.
	MaxBlockSize = 1 << 20
	// DefaultSegmentSize is the size at which a segment file is rolled.
	DefaultSegmentSize = 256 << 20
	// PendingTTL is how long an unreferenced block stays referenceable.
	PendingTTL = 10 * time.Minute
	// DefaultCompactInterval is how often the background reclaimer looks
	// for segments worth compacting.
	DefaultCompactInterval = 30 * time.Second
	// DefaultCompactDeadFraction is the share of a segment's bytes that may
	// be dead before the segment is compacted.
	DefaultCompactDeadFraction = 0.5

	metaFile   = "meta.db"
	blocksDir  = "blocks"
	segPrefix  = "seg-"
	maxKeySize = 4096 // longest name (entry, xattr, sys key) accepted
	// writebackChunk is how much appended data accumulates before its
	// writeback is started early (overlapping disk I/O with hashing).
	writebackChunk = 256 << 10
)

// Errors specific to the store. Each wraps an fserr sentinel.
var (
	ErrClosed   = fmt.Errorf("store: closed: %w", fserr.ErrIO)
	ErrReadOnly = fmt.Errorf("store: write in a read-only transaction: %w", fserr.ErrInvalid)
	// ErrUnknownBlock: SetBlock of a block neither indexed nor pending.
	ErrUnknownBlock = fmt.Errorf("unknown block: %w", fserr.ErrInvalid)
)

// Options configure a Store.
type Options struct {
	Logger *slog.Logger
	// SegmentSize is the size at which segment files roll (default 256 MiB).
	SegmentSize int64
	// NoSync disables every fsync. Tests only: nothing is durable.
	NoSync bool
	// CompactInterval is how often the background reclaimer runs Compact
	// (default DefaultCompactInterval; negative turns it off).
	CompactInterval time.Duration
	// CompactDeadFraction is the share of a segment's bytes that may be
	// dead (freed, or never referenced) before Compact rewrites it; it
	// bounds the dead space to f/(1−f) of the live data (plus one active
	// segment's activeMinDead). Zero means DefaultCompactDeadFraction;
	// values outside (0, 1) are clamped to [0.05, 0.95].
	CompactDeadFraction float64
	// Reserve is the size of the reserve file the store keeps for its own
	// housekeeping on a full disk (see space.go): default DefaultReserve,
	// negative for none.
	Reserve int64
	// PendingTTL is how long a block put but not referenced stays
	// referenceable (default PendingTTL).
	PendingTTL time.Duration
	// LazyFlushDelay bounds how long a lazy update (Lazily) stays in the
	// log unsynced when no synced update or Flush comes first (default
	// DefaultLazyFlushDelay).
	LazyFlushDelay time.Duration

	// Checkpoint thresholds (tests; zero means the default).
	ckBytes, ckOps int64
	ckEvery        time.Duration
}

// Usage reports space accounting.
type Usage struct {
	LiveBytes     int64 // bytes of indexed blocks (each distinct block once)
	SegmentBytes  int64 // bytes in segment files (live + dead)
	Segments      int   // number of segment files
	Objects       int64 // number of objects
	PendingBlocks int   // blocks written but not (yet) referenced
	// Compactions and ReclaimedBytes count the Compact passes that deleted
	// segments since Open and the segment bytes they deleted (net of the
	// live bytes copied out: ReclaimedBytes = deleted − moved).
	Compactions    int64
	ReclaimedBytes int64
	// LogSyncs counts the fdatasyncs of the log since Open; Unsynced
	// reports lazy records (Lazily) in the log not synced yet.
	LogSyncs int64
	Unsynced bool
}

// Store is a storage server's local store. It is safe for concurrent use.
type Store struct {
	dir     string
	log     *slog.Logger
	db      *bbolt.DB
	lock    *os.File
	segSize int64
	noSync  bool
	start   time.Time

	objects     atomic.Int64 // committed object count
	batches     atomic.Int64 // committed batches (tests, diagnostics)
	checkpoints atomic.Int64 // completed checkpoints (tests, diagnostics)
	inlined     atomic.Int64 // records that carried block data (tests, diagnostics)
	logSyncs    atomic.Int64 // fdatasyncs of the log (Usage)
	restored    int          // blocks Open wrote back from the log (tests, diagnostics)

	// Group commit.
	qmu        sync.Mutex
	queue      []*request
	spare      []*request // an emptied batch slice, for the next queue
	committing bool       // a runBatch is under way (in loop or in a caller)
	closed     bool
	wake       chan struct{}
	loopDone   chan struct{}
	wtx        Tx    // the committer's transaction wrapper, reused
	failed     error // set (by the committer) once the log is unusable

	// Log and overlay. commitMu covers appending to wal and publishing
	// snap; ckMu serializes checkpoints (and guards walGen).
	commitMu sync.Mutex
	wal      *walFile
	// walDirty: records of lazy updates (Lazily) are in wal but not
	// synced; lazyArmed: lazyTimer will sync them. Both under commitMu.
	walDirty  atomic.Bool // Usage reads it without commitMu
	lazyArmed bool
	lazyOff   bool // Close: the timer must not touch the log
	// logErr is the failure of an fdatasync of lazy records (under
	// commitMu). Linux reports a writeback error to one fdatasync of an
	// open file only: the next one succeeds although those records may
	// never reach the disk, and a replay would stop at them, losing the
	// synced records after them. So the log takes no record after it.
	logErr    error
	lazyTimer *time.Timer
	lazyDelay time.Duration
	snap      atomic.Pointer[snapshot]
	ckMu      sync.Mutex
	walGen    uint64
	ckBytes   int64
	ckOps     int64
	ckEvery   time.Duration
	ckKick    chan struct{}
	ckStop    chan struct{}
	ckDone    chan struct{}

	// Segments.
	appendMu sync.Mutex // serializes appends and rolls
	active   *segment   // under appendMu
	target   *segment   // under appendMu: where Compact copies to (nil until needed)
	nextID   uint32     // under appendMu: the next segment number
	segMu    sync.RWMutex
	segs     map[uint32]*segment // live segment files
	live     map[uint32]int64    // indexed bytes per segment (committer updates)

	// Pending blocks.
	pendMu     sync.Mutex
	pending    map[[32]byte]pendingBlock
	lastSweep  int64
	pendingTTL time.Duration

	compactMu    sync.Mutex
	deadFrac     float64
	compactEvery time.Duration
	compactStop  context.CancelFunc
	compactDone  chan struct{}
	compactions  atomic.Int64
	reclaimed    atomic.Int64
	// compactHook, when set (tests), is called at each stage of Compact.
	compactHook func(stage string)
	// syncFault, when set (tests), stands in for a failing fdatasync of a
	// segment: a non-nil error is returned instead of syncing.
	syncFault func(seg uint32) error
	// logSyncFault, when set (tests), stands in for a failing fdatasync
	// of the log's lazy records.
	logSyncFault func() error

	// The reserve file (space.go).
	resMu      sync.Mutex
	reserve    int64 // wanted size
	hasReserve bool
	resSize    int64 // size of the reserve file
	resWarned  bool  // "no reserve" said once

	closeOnce sync.Once
	closeErr  error
}

// segment is one append-only block file.
type segment struct {
	id     uint32
	f      *os.File
	size   atomic.Int64 // bytes written (completed writes only)
	synced atomic.Int64 // bytes known durable
	kicked int64        // bytes whose writeback was started (under appendMu)
	mu     sync.RWMutex // readers hold RLock during I/O; deletion takes Lock
	dead   bool         // under mu: file closed and removed
	// compacting is set (under pendMu) while Compact copies the segment out:
	// no new pending reference to it may be created.
	compacting bool
	// broken holds the error of a failed fdatasync (breakSegment): after
	// one, a later fdatasync may succeed although the bytes never reached
	// the disk, so the segment is never synced again nor appended to.
	broken atomic.Pointer[error]
}

// pendingBlock is a block that may be referenced by SetBlock.
type pendingBlock struct {
	loc loc
	at  int64 // nanoseconds since Store.start
}

// loc is where a block's bytes live.
type loc struct {
	seg uint32
	off uint64
	n   uint32
	// crc is the block's CRC-32C, checked on every read: it catches bit rot
	// at a fraction of the cost of re-hashing with SHA-256.
	crc uint32
}

func (l loc) end() int64 { return int64(l.off) + int64(l.n) }

const idxValLen = 24 // seg u32 | off u64 | len u32 | refs u32 | crc32c u32

func putIdx(b []byte, l loc, refs uint32) {
	binary.BigEndian.PutUint32(b[0:], l.seg)
	binary.BigEndian.PutUint64(b[4:], l.off)
	binary.BigEndian.PutUint32(b[12:], l.n)
	binary.BigEndian.PutUint32(b[16:], refs)
	binary.BigEndian.PutUint32(b[20:], l.crc)
}

func getIdx(b []byte) (l loc, refs uint32, ok bool) {
	if len(b) != idxValLen {
		return loc{}, 0, false
	}
	l.seg = binary.BigEndian.Uint32(b[0:])
	l.off = binary.BigEndian.Uint64(b[4:])
	l.n = binary.BigEndian.Uint32(b[12:])
	l.crc = binary.BigEndian.Uint32(b[20:])
	return l, binary.BigEndian.Uint32(b[16:]), true
}

func blockCRC(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

// ioErr wraps an I/O failure with the matching file-system error (and
// keeps the cause: noSpace looks for it).
func ioErr(what string, err error) error {
	if noSpace(err) {
		return fmt.Errorf("store: %s: %w: %w", what, fserr.ErrNoSpace, err)
	}
	return fmt.Errorf("store: %s: %w: %w", what, fserr.ErrIO, err)
}

func segName(id uint32) string { return fmt.Sprintf("%s%08d", segPrefix, id) }

func (s *Store) segPath(id uint32) string { return filepath.Join(s.dir, blocksDir, segName(id)) }

func (s *Store) now() int64 { return int64(time.Since(s.start)) }

// Open opens (creating if needed) the store in dir and recovers from a crash.
func Open(dir string, o Options) (*Store, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.ckBytes <= 0 {
		o.ckBytes = defaultCkBytes
	}
	if o.ckOps <= 0 {
		o.ckOps = defaultCkOps
	}
	if o.ckEvery <= 0 {
		o.ckEvery = defaultCkEvery
	}
	if o.Reserve == 0 {
		o.Reserve = DefaultReserve
	}
	if o.CompactInterval == 0 {
		o.CompactInterval = DefaultCompactInterval
	}
	switch f := o.CompactDeadFraction; {
	case f == 0:
		o.CompactDeadFraction = DefaultCompactDeadFraction
	case f < 0.05:
		o.CompactDeadFraction = 0.05
	case f > 0.95:
		o.CompactDeadFraction = 0.95
	}
	if err := os.MkdirAll(filepath.Join(dir, blocksDir), 0o755); err != nil {
		return nil, fmt.Errorf("store: create %s: %w", dir, err)
	}
	lock, err := dirlock.Lock(dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{
		dir:      dir,
		log:      o.Logger,
		lock:     lock,
		segSize:  o.SegmentSize,
		noSync:   o.NoSync,
		start:    time.Now(),
		wake:     make(chan struct{}, 1),
		loopDone: make(chan struct{}),
		segs:     make(map[uint32]*segment),
		live:     make(map[uint32]int64),
		pending:  make(map[[32]byte]pendingBlock),
		ckBytes:  o.ckBytes,
		ckOps:    o.ckOps,
		ckEvery:  o.ckEvery,
		ckKick:   make(chan struct{}, 1),
		ckStop:   make(chan struct{}),
		ckDone:   make(chan struct{}),

		pendingTTL:   cmp.Or(o.PendingTTL, PendingTTL),
		deadFrac:     o.CompactDeadFraction,
		compactEvery: o.CompactInterval,
		compactDone:  make(chan struct{}),
		reserve:      o.Reserve,
		lazyDelay:    cmp.Or(o.LazyFlushDelay, DefaultLazyFlushDelay),
	}
	s.lazyTimer = time.AfterFunc(time.Hour, s.lazyFlush)
	s.lazyTimer.Stop()

	s.wtx.s = s
	s.wtx.writable = true
	if err := s.open(); err != nil {
		s.closeFiles()
		return nil, err
	}
	go s.loop()
	go s.checkpointer()
	ctx, cancel := context.WithCancel(context.Background())
	s.compactStop = cancel
	go s.reclaimer(ctx)
	return s, nil
}

func (s *Store) open() error {
	db, err := bbolt.Open(filepath.Join(s.dir, metaFile), 0o644, &bbolt.Options{
		Timeout:         5 * time.Second,
		NoFreelistSync:  true,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: 1 << 30, // avoid remaps (which wait for readers) early on
		NoSync:          s.noSync,
	})
	if err != nil {
		return fmt.Errorf("store: open %s: %w", filepath.Join(s.dir, metaFile), err)
	}
	s.db = db
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, name := range append(bucketNames[:], walBucket) {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("store: create buckets: %w", err)
	}

	// Replay the log first: the index scan below must see the blocks its
	// records reference. On a full disk the reserve makes room for the
	// replay and the new log file.
	s.makeReserve()
	var seq, gen uint64
	if err := s.withReserve(func() (err error) { seq, gen, err = s.recoverLog(); return err }); err != nil {
		return err
	}
	s.snap.Store(&snapshot{layers: [2]*memtable{newMemtable(), nil}, seq: seq})
	if s.wal, err = s.newWAL(gen + 1); err != nil {
		return err
	}
	s.walGen = gen + 1

	// Scan the block index: live bytes and the largest referenced offset per
	// segment; count objects.
	maxEnd := map[uint32]int64{}
	var maxSeg uint32
	if err := db.View(func(tx *bbolt.Tx) error {
		s.objects.Store(int64(tx.Bucket(bucketNames[bObjects]).Stats().KeyN))
		return tx.Bucket(bucketNames[bBlockidx]).ForEach(func(k, v []byte) error {
			l, _, ok := getIdx(v)
			if !ok || len(k) != 32 {
				s.log.Error("store: corrupt block index entry", "key", fmt.Sprintf("%x", k))
				return nil
			}
			s.live[l.seg] += int64(l.n)
			maxEnd[l.seg] = max(maxEnd[l.seg], l.end())
			maxSeg = max(maxSeg, l.seg)
			return nil
		})
	}); err != nil {
		return fmt.Errorf("store: scan block index: %w", err)
	}

	// Open the segment files.
	ents, err := os.ReadDir(filepath.Join(s.dir, blocksDir))
	if err != nil {
		return fmt.Errorf("store: read segments: %w", err)
	}
	var top *segment
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, segPrefix) {
			continue
		}
		n, err := strconv.ParseUint(name[len(segPrefix):], 10, 32)
		if err != nil || n == 0 {
			continue
		}
		id := uint32(n)
		f, err := os.OpenFile(s.segPath(id), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("store: open segment: %w", err)
		}
		adviseSequential(f)
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("store: stat segment: %w", err)
		}
		seg := &segment{id: id, f: f}
		seg.size.Store(st.Size())
		s.segs[id] = seg
		if top == nil || id > top.id {
			top = seg
		}
	}
	for id, end := range maxEnd {
		seg := s.segs[id]
		switch {
		case seg == nil:
			s.log.Error("store: block index references a missing segment", "segment", segName(id))
		case seg.size.Load() < end:
			s.log.Error("store: segment shorter than the block index says", "segment", segName(id),
				"size", seg.size.Load(), "referenced", end)
		}
	}

	// Recovery: data past the largest referenced offset of the active
	// segment (or of the compaction target, if it was created last) was
	// never acknowledged.
	s.nextID = maxSeg + 1
	if top != nil {
		s.nextID = max(s.nextID, top.id+1)
	}
	if top != nil && top.id >= maxSeg {
		if end := maxEnd[top.id]; top.size.Load() > end {
			s.log.Info("store: truncating unacknowledged segment tail", "segment", segName(top.id),
				"from", top.size.Load(), "to", end)
			if err := top.f.Truncate(end); err != nil {
				return ioErr("truncate segment", err)
			}
			top.size.Store(end)
		}
		s.active = top
	}
	// Everything on disk now is durable (a crashed process may have left
	// dirty pages behind).
	for _, seg := range s.segs {
		if !s.noSync {
			if err := fdatasync(seg.f); err != nil {
				return ioErr("sync segment", err)
			}
		}
		seg.synced.Store(seg.size.Load())
		seg.kicked = seg.size.Load()
	}
	if s.active == nil {
		seg, err := s.newSegmentLocked()
		if err != nil {
			return err
		}
		s.active = seg
	}
	return nil
}

// newSegmentLocked creates the next segment file and registers it
// (appendMu held or during Open). Numbers are never reused: a deleted
// segment's number could still be named by a stale log record.
func (s *Store) newSegmentLocked() (*segment, error) {
	id := s.nextID
	f, err := os.OpenFile(s.segPath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, ioErr("create segment", err)
	}
	adviseSequential(f)
	if err := s.syncDir(filepath.Join(s.dir, blocksDir)); err != nil {
		f.Close()
		os.Remove(s.segPath(id))
		return nil, err
	}
	s.nextID++
	seg := &segment{id: id, f: f}
	s.segMu.Lock()
	s.segs[id] = seg
	s.segMu.Unlock()
	return seg, nil
}

// syncDir makes the entries of directory dir durable.
func (s *Store) syncDir(dir string) error {
	if s.noSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return ioErr("open directory", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return ioErr("sync directory "+dir, err)
	}
	return nil
}

// syncSegment makes seg durable at least up to need.
func (s *Store) syncSegment(seg *segment, need int64) error {
	if s.noSync || seg.synced.Load() >= need {
		return nil
	}
	if err := seg.broken.Load(); err != nil {
		return *err
	}
	snap := seg.size.Load() // every byte below snap has been written
	err := error(nil)
	if s.syncFault != nil {
		err = s.syncFault(seg.id)
	}
	if err == nil {
		err = fdatasync(seg.f)
	}
	if err != nil {
		err = ioErr("sync segment "+segName(seg.id)+" (restart the store if it held blocks logged inline)", err)
		s.breakSegment(seg, err)
		return err
	}
	for {
		cur := seg.synced.Load()
		if cur >= snap || seg.synced.CompareAndSwap(cur, snap) {
			return nil
		}
	}
}

// breakSegment stops trusting seg after a failed fdatasync (on Linux the
// failed pages may be dropped, and the next fdatasync succeeds): it takes
// no more data (appendTo starts a new segment), its pending blocks past
// what was synced are forgotten (a PutBlock of the same data writes a
// fresh copy; a commit naming them without one fails), and syncing it
// fails from now on. Blocks a log record carried inline stay durable in
// the log, but checkpoints cannot drop those records (syncInline fails)
// until a restart's replay writes them into the segment again.
func (s *Store) breakSegment(seg *segment, err error) {
	if !seg.broken.CompareAndSwap(nil, &err) {
		return
	}
	synced := seg.synced.Load()
	n := 0
	s.pendMu.Lock()
	for h, p := range s.pending {
		if p.loc.seg == seg.id && p.loc.end() > synced {
			delete(s.pending, h)
			n++
		}
	}
	s.pendMu.Unlock()
	s.log.Error("store: segment sync failed; the segment takes no more data", "segment", segName(seg.id),
		"synced", synced, "dropped_pending", n, "err", err)
}

// syncInline makes the blocks that log records carried inline durable in
// their segments: ends maps a segment to the end of its highest such block.
// A segment deleted meanwhile is skipped: Compact deletes a segment only
// after durably repointing its live blocks to synced copies.
func (s *Store) syncInline(ends map[uint32]int64) error {
	for id, end := range ends {
		seg := s.segment(id)
		if seg == nil {
			continue
		}
		seg.mu.RLock() // keeps the file open
		var err error
		if !seg.dead {
			err = s.syncSegment(seg, end)
		}
		seg.mu.RUnlock()
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) segment(id uint32) *segment {
	s.segMu.RLock()
	seg := s.segs[id]
	s.segMu.RUnlock()
	return seg
}

// Dir returns the store's data directory.
func (s *Store) Dir() string { return s.dir }

// Close waits for queued updates, checkpoints the log into bbolt, then
// closes every file. Updates issued after Close fail with ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.compactStop() // a running pass stops copying at the next block
		<-s.compactDone
		s.stop()
		s.commitMu.Lock()
		s.lazyTimer.Stop()
		s.lazyOff = true // a timer that fired already finds it (the files close)
		s.commitMu.Unlock()
		err := s.checkpoint(true)
		if err == nil {
			s.makeReserve() // from what the log files freed: room to open again
		}
		s.compactMu.Lock() // let a running Compact finish with the files
		s.closeErr = errors.Join(err, s.closeFiles())
		s.compactMu.Unlock()
	})
	return s.closeErr
}

// stop drains the update queue and stops the committer and checkpointer.
func (s *Store) stop() {
	s.qmu.Lock()
	s.closed = true
	s.qmu.Unlock()
	s.wakeLoop()
	<-s.loopDone
	close(s.ckStop)
	<-s.ckDone
}

func (s *Store) closeFiles() error {
	var errs []error
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	s.commitMu.Lock() // Flush may come late (a server's Sync)
	if s.wal != nil {
		errs = append(errs, s.wal.f.Close())
		s.wal = nil
	}
	s.commitMu.Unlock()
	s.appendMu.Lock()
	s.segMu.Lock()
	for id, seg := range s.segs {
		seg.mu.Lock()
		seg.dead = true
		errs = append(errs, seg.f.Close())
		seg.mu.Unlock()
		delete(s.segs, id)
	}
	s.segMu.Unlock()
	s.appendMu.Unlock()
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

func (s *Store) isClosed() bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.closed
}

// Usage reports space accounting.
func (s *Store) Usage() (Usage, error) {
	if s.isClosed() {
		return Usage{}, ErrClosed
	}
	var u Usage
	s.pendMu.Lock()
	u.PendingBlocks = len(s.pending)
	s.pendMu.Unlock()
	s.segMu.RLock()
	for id, seg := range s.segs {
		u.Segments++
		u.SegmentBytes += seg.size.Load()
		u.LiveBytes += s.live[id]
	}
	s.segMu.RUnlock()
	u.Objects = s.objects.Load()
	u.Compactions, u.ReclaimedBytes = s.compactions.Load(), s.reclaimed.Load()
	u.LogSyncs, u.Unsynced = s.logSyncs.Load(), s.walDirty.Load()
	return u, nil
}

// readAt reads exactly len(buf) bytes at off from seg; ok is false if the
// segment was deleted (the caller looks the block up again).
func (seg *segment) readAt(buf []byte, off int64) (ok bool, err error) {
	seg.mu.RLock()
	defer seg.mu.RUnlock()
	if seg.dead {
		return false, nil
	}
	_, err = seg.f.ReadAt(buf, off)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return true, err
}
