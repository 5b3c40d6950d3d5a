package store

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"

	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Buckets.
const (
	bObjects  = iota // id (8 BE) → wire.Meta
	bEntries         // dir id (8 BE) ‖ name → wire.Entry
	bBlockmap        // file id (8 BE) ‖ block index (8 BE) → SHA-256 (32)
	bBlockidx        // SHA-256 → seg u32 | off u64 | len u32 | refs u32
	bXattrs          // id (8 BE) ‖ name → value
	bCounters        // slice (4 BE) → next counter (8 BE)
	bSys             // key → value
	nBuckets
)

var bucketNames = [nBuckets][]byte{
	[]byte("objects"), []byte("entries"), []byte("blockmap"), []byte("blockidx"),
	[]byte("xattrs"), []byte("counters"), []byte("sys"),
}

// BlockRef is one present block of a file.
type BlockRef struct {
	Index uint64
	Hash  [32]byte
	Len   uint32
}

// Tx is a transaction handed to Update and View functions. It is valid only
// during the function. In Update, writes are buffered until the function
// returns nil; reads see the function's own writes and those of functions
// committed earlier in the same batch.
type Tx struct {
	s        *Store
	btx      *bbolt.Tx // read-only
	layers   [2]*memtable
	seq      uint64 // the overlay snapshot's sequence number
	writable bool
	bk       [nBuckets]*bbolt.Bucket
	// cur holds one cursor per bucket for point reads (get): bbolt's
	// Bucket.Get allocates a cursor and grows its stack on every call,
	// a fifth of a remove's allocations (docs/BENCHMARKS.md).
	cur [nBuckets]*bbolt.Cursor
	// scur is the same for scans (a scan's function may get, not scan:
	// skey and sorted are the scan's too).
	scur [nBuckets]*bbolt.Cursor

	// Update only.
	ops         []op           // the batch's buffered writes, oldest first
	fnStart     int            // where the running function's writes start
	idx         map[string]int // bucket ‖ key → latest op, once ops is long
	mem         arena          // keys and values of ops
	ikey        []byte         // scratch for idx lookups
	skey        []byte         // scratch for scan bounds
	sorted      []int          // scratch for scan
	fn, batch   effects        // side effects of the running function / the batch
	baseObjects int64
	inl         []inlineBlock    // commit scratch: blocks logged inline
	inlBuf      []byte           // commit scratch: their bytes
	ends        []segEnd         // commit scratch: segments to sync
	rec         []*wire.Mutation // the running function's changes, for replication
	removed     []Removed        // entries the running function removed or replaced
	fnAbort     []func()         // OnAbort of the running function
	batchAbort  []func()         // OnAbort of the batch's kept functions
	read        []oid.ID         // objects the running function read (Read)
}

// op is a buffered write.
type op struct {
	b   uint8
	del bool
	key []byte
	val []byte
}

// linearOps is how many buffered ops are searched linearly before an index
// map is built.
const linearOps = 16

// effects are a transaction's consequences outside bbolt.
type effects struct {
	fresh   []freshBlock // pending blocks now indexed: durable before commit
	used    [][32]byte   // pending blocks now referenced by the index
	live    []segDelta   // indexed bytes per segment
	objects int          // object count delta
}

// freshBlock is a pending block that a transaction indexed.
type freshBlock struct {
	h [32]byte
	l loc
}

type segEnd struct {
	seg uint32
	end int64
}

type segDelta struct {
	seg uint32
	n   int64
}

func (e *effects) reset() {
	e.fresh, e.used, e.live, e.objects = e.fresh[:0], e.used[:0], e.live[:0], 0
}

func (e *effects) addLive(seg uint32, n int64) {
	for i := range e.live {
		if e.live[i].seg == seg {
			e.live[i].n += n
			return
		}
	}
	e.live = append(e.live, segDelta{seg, n})
}

// arena hands out byte slices that stay valid until reset.
type arena struct{ cur []byte }

const arenaChunk = 64 << 10

var emptyVal = []byte{}

func (a *arena) copy(b []byte) []byte {
	if len(b) == 0 {
		return emptyVal
	}
	d := a.alloc(len(b))
	copy(d, b)
	return d
}

func (a *arena) alloc(n int) []byte {
	if n == 0 {
		return emptyVal
	}
	if cap(a.cur)-len(a.cur) < n {
		if n > arenaChunk/4 {
			return make([]byte, n)
		}
		a.cur = make([]byte, 0, arenaChunk)
	}
	l := len(a.cur)
	a.cur = a.cur[:l+n]
	return a.cur[l : l+n : l+n]
}

// endRead ends the read transaction beginRead started and drops what
// belongs to it (buckets, cursors, the snapshot's layers).
func (t *Tx) endRead() {
	_ = t.btx.Rollback()
	t.btx, t.layers, t.bk, t.cur, t.scur = nil, [2]*memtable{}, [nBuckets]*bbolt.Bucket{}, [nBuckets]*bbolt.Cursor{}, [nBuckets]*bbolt.Cursor{}
}

// endUpdate ends the committer's batch.
func (t *Tx) endUpdate() {
	t.endRead()
	clear(t.ops) // drop references for the GC
	t.ops, t.fnStart = t.ops[:0], 0
	if cap(t.ops) > 1<<16 {
		t.ops = nil
	}
	t.idx = nil
	t.fn.reset()
	t.batch.reset()
	t.rec, t.removed, t.read = nil, nil, t.read[:0]
	clear(t.inl)
	t.inl = t.inl[:0]
	t.mem.cur = t.mem.cur[:0] // the log record holds copies
	clear(t.fnAbort)
	clear(t.batchAbort)
	t.fnAbort, t.batchAbort = t.fnAbort[:0], t.batchAbort[:0]
}

// OnAbort registers f to run if the running function's writes are not
// committed after all: the function fails, or the batch's commit does
// (a full disk). Functions run in the reverse order of registration, in
// the committer, before the next batch starts; an Update function that
// changes state outside the store (a counter) undoes it here.
func (t *Tx) OnAbort(f func()) {
	if t.writable {
		t.fnAbort = append(t.fnAbort, f)
	}
}

// abortBatch runs the OnAbort functions of every kept function, newest
// first.
func (t *Tx) abortBatch() {
	for i := len(t.batchAbort) - 1; i >= 0; i-- {
		t.batchAbort[i]()
	}
	clear(t.batchAbort)
	t.batchAbort = t.batchAbort[:0]
}

// discardFn drops the running function's buffered writes.
func (t *Tx) discardFn() {
	clear(t.ops[t.fnStart:])
	t.ops = t.ops[:t.fnStart]
	if t.idx != nil { // rare (a failed function): rebuild
		clear(t.idx)
		for i := range t.ops {
			t.index(i)
		}
	}
	t.fn.reset()
	t.rec, t.removed, t.read = nil, nil, t.read[:0]
	for i := len(t.fnAbort) - 1; i >= 0; i-- {
		t.fnAbort[i]()
	}
	clear(t.fnAbort)
	t.fnAbort = t.fnAbort[:0]
}

// keepFn adds the running function's writes and effects to the batch.
func (t *Tx) keepFn() {
	f, b := &t.fn, &t.batch
	b.fresh = append(b.fresh, f.fresh...)
	b.used = append(b.used, f.used...)
	for _, d := range f.live {
		b.addLive(d.seg, d.n)
	}
	b.objects += f.objects
	t.fn.reset()
	t.fnStart = len(t.ops)
	t.rec, t.removed, t.read = nil, nil, t.read[:0]
	t.batchAbort = append(t.batchAbort, t.fnAbort...)
	clear(t.fnAbort)
	t.fnAbort = t.fnAbort[:0]
}

func (t *Tx) bucket(b int) *bbolt.Bucket {
	if bk := t.bk[b]; bk != nil {
		return bk
	}
	bk := t.btx.Bucket(bucketNames[b])
	t.bk[b] = bk
	return bk
}

func (t *Tx) writeCheck() error {
	if !t.writable {
		return ErrReadOnly
	}
	return nil
}

// find returns the index of the latest buffered op on key, or -1.
func (t *Tx) find(b int, key []byte) int {
	if t.idx != nil {
		t.ikey = append(append(t.ikey[:0], byte(b)), key...)
		if i, ok := t.idx[string(t.ikey)]; ok {
			return i
		}
		return -1
	}
	for i := len(t.ops) - 1; i >= 0; i-- {
		if o := &t.ops[i]; int(o.b) == b && bytes.Equal(o.key, key) {
			return i
		}
	}
	return -1
}

// get reads key: buffered writes, then the overlay, then bbolt. The value
// is valid for the transaction only and must not be modified.
func (t *Tx) get(b int, key []byte) ([]byte, bool) {
	if t.writable {
		t.noteRead(b, key)
	}
	if len(t.ops) > 0 {
		if i := t.find(b, key); i >= 0 {
			o := &t.ops[i]
			return o.val, !o.del
		}
	}
	if n := overlayGet(t.layers, b, key, t.seq); n != nil {
		return n.val, !n.del
	}
	c := t.cur[b]
	if c == nil {
		c = t.bucket(b).Cursor()
		t.cur[b] = c
	}
	// As Bucket.Get (no bucket nests another here), on a cursor that
	// keeps its stack from one read to the next.
	if k, v := c.Seek(key); v != nil && bytes.Equal(k, key) {
		return v, true
	}
	return nil, false
}

// noteRead adds to Read the object whose key in bucket b is read.
func (t *Tx) noteRead(b int, key []byte) {
	switch b {
	case bObjects, bEntries, bBlockmap, bXattrs:
	default:
		return
	}
	if len(key) < 8 {
		return
	}
	id := oid.ID(binary.BigEndian.Uint64(key))
	// A function reads a few objects, each several times in a row.
	if n := len(t.read); n > 0 && t.read[n-1] == id || n < 8 && slices.Contains(t.read, id) {
		return
	}
	t.read = append(t.read, id)
}

// Read returns the objects the running Update function has read so far
// (meta-data, entries of a directory, blocks, attributes), in first-read
// order, possibly with repeats: what an answer built from them shows. The
// slice is valid until the function returns.
func (t *Tx) Read() []oid.ID { return t.read }

func (t *Tx) addOp(o op) {
	t.ops = append(t.ops, o)
	switch {
	case t.idx != nil:
		t.index(len(t.ops) - 1)
	case len(t.ops) > linearOps:
		t.idx = make(map[string]int, 2*len(t.ops))
		for i := range t.ops {
			t.index(i)
		}
	}
}

func (t *Tx) index(i int) {
	t.ikey = append(append(t.ikey[:0], t.ops[i].b), t.ops[i].key...)
	t.idx[string(t.ikey)] = i
}

func (t *Tx) put(b int, key, val []byte) {
	t.addOp(op{b: uint8(b), key: t.mem.copy(key), val: t.mem.copy(val)})
}

func (t *Tx) del(b int, key []byte) {
	t.addOp(op{b: uint8(b), del: true, key: t.mem.copy(key)})
}

// scan calls fn for every key with the given prefix that is >= seek (which
// must start with prefix), in order, merging buffered writes. fn must not
// write; collect and write afterwards.
func (t *Tx) scan(b int, seek []byte, plen int, fn func(k, v []byte) bool) {
	if t.writable {
		t.noteRead(b, seek)
	}
	t.skey = append(t.skey[:0], seek...)
	seek = t.skey
	prefix := seek[:plen]
	var ov []int
	if len(t.ops) > 0 {
		ov = t.sorted[:0]
		for i := range t.ops {
			o := &t.ops[i]
			if int(o.b) == b && bytes.HasPrefix(o.key, prefix) && bytes.Compare(o.key, seek) >= 0 {
				ov = append(ov, i)
			}
		}
		if len(ov) > 1 {
			ops := t.ops
			slices.SortStableFunc(ov, func(x, y int) int { return bytes.Compare(ops[x].key, ops[y].key) })
			w := 0
			for r := range ov { // keep the latest op per key
				if r+1 < len(ov) && bytes.Equal(ops[ov[r]].key, ops[ov[r+1]].key) {
					continue
				}
				ov[w] = ov[r]
				w++
			}
			ov = ov[:w]
		}
		t.sorted = ov
	}
	var its [2]memIter
	for i, m := range t.layers {
		if m != nil {
			its[i] = m.lists[b].iter(seek, t.seq)
		}
	}
	c := t.scur[b]
	if c == nil {
		c = t.bucket(b).Cursor()
		t.scur[b] = c
	}
	ck, cv := c.Seek(seek)
	j := 0
	for {
		// The smallest key of the sources; on a tie the newest source
		// (buffered ops, then the layers, then bbolt) wins.
		var key, val []byte
		del, found := false, false
		if j < len(ov) {
			o := &t.ops[ov[j]]
			key, val, del, found = o.key, o.val, o.del, true
		}
		for i := range its {
			if n := its[i].n; n != nil && (!found || bytes.Compare(n.key, key) < 0) {
				key, val, del, found = n.key, n.val, n.del, true
			}
		}
		if ck != nil && (!found || bytes.Compare(ck, key) < 0) {
			key, val, del, found = ck, cv, false, true
		}
		if !found || !bytes.HasPrefix(key, prefix) {
			return
		}
		if j < len(ov) && bytes.Equal(t.ops[ov[j]].key, key) {
			j++
		}
		for i := range its {
			if n := its[i].n; n != nil && bytes.Equal(n.key, key) {
				its[i].next()
			}
		}
		if ck != nil && bytes.Equal(ck, key) {
			ck, cv = c.Next()
		}
		if !del && !fn(key, val) {
			return
		}
	}
}

func idKey(id oid.ID) [8]byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], uint64(id))
	return k
}

// nameKey builds id ‖ name into the arena-free scratch of the caller.
func nameKey(buf []byte, id oid.ID, name string) []byte {
	buf = binary.BigEndian.AppendUint64(buf[:0], uint64(id))
	return append(buf, name...)
}

func blockKey(id oid.ID, index uint64) [16]byte {
	var k [16]byte
	binary.BigEndian.PutUint64(k[:8], uint64(id))
	binary.BigEndian.PutUint64(k[8:], index)
	return k
}

func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("store: empty %s: %w", what, fserr.ErrInvalid)
	}
	if len(name) > maxKeySize {
		return fmt.Errorf("store: %s too long: %w", what, fserr.ErrNameTooLong)
	}
	return nil
}

// --- Objects ---

// Meta returns an object's meta-data (fserr.ErrNotExist if absent).
func (t *Tx) Meta(id oid.ID) (*wire.Meta, error) {
	k := idKey(id)
	v, ok := t.get(bObjects, k[:])
	if !ok {
		return nil, fmt.Errorf("store: object %v: %w", id, fserr.ErrNotExist)
	}
	return decodeMeta(id, v)
}

func decodeMeta(id oid.ID, v []byte) (*wire.Meta, error) {
	m := new(wire.Meta)
	if err := proto.Unmarshal(v, m); err != nil {
		return nil, fmt.Errorf("store: object %v: corrupt meta-data: %w: %v", id, fserr.ErrIO, err)
	}
	return m, nil
}

// RecentMeta returns object id's meta-data as last committed if the
// overlay holds it (an object changed since the last checkpoint): no
// read transaction. ok is false when only View can tell; m is nil (and
// ok true) when the object's last change deleted it.
func (s *Store) RecentMeta(id oid.ID) (m *wire.Meta, ok bool) {
	snap := s.snap.Load()
	k := idKey(id)
	n := overlayGet(snap.layers, bObjects, k[:], snap.seq)
	switch {
	case n == nil:
		return nil, false
	case n.del:
		return nil, true
	}
	m, err := decodeMeta(id, n.val)
	return m, err == nil
}

// HasObject tells whether object id exists, without decoding its
// meta-data.
func (t *Tx) HasObject(id oid.ID) bool {
	k := idKey(id)
	_, ok := t.get(bObjects, k[:])
	return ok
}

// PutMeta creates or replaces the meta-data of object m.Id.
func (t *Tx) PutMeta(m *wire.Meta) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if m.GetId() == 0 {
		return fmt.Errorf("store: meta-data without an id: %w", fserr.ErrInvalid)
	}
	if !t.HasObject(oid.ID(m.Id)) {
		t.fn.objects++
	}
	k := idKey(oid.ID(m.Id))
	mo := proto.MarshalOptions{}
	v := t.mem.alloc(mo.Size(m))
	v, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(v[:0], m)
	if err != nil {
		return fmt.Errorf("store: encode meta-data: %w", err)
	}
	t.addOp(op{b: bObjects, key: t.mem.copy(k[:]), val: v})
	t.record(wire.MutationKind_MUT_PUT_META, m.Id, bytes.Clone(v), "", 0)
	return nil
}

// DeleteObject removes an object's meta-data, extended attributes and block
// map (dropping its block references). A directory must have no entries.
func (t *Tx) DeleteObject(id oid.ID) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if !t.HasObject(id) {
		return fmt.Errorf("store: delete object %v: %w", id, fserr.ErrNotExist)
	}
	k := idKey(id)
	if has, err := t.HasEntries(id); err != nil {
		return err
	} else if has {
		return fmt.Errorf("store: delete object %v: %w", id, fserr.ErrNotEmpty)
	}
	t.del(bObjects, k[:])
	t.fn.objects--
	var keys [][]byte
	t.scan(bXattrs, k[:], 8, func(k, _ []byte) bool {
		keys = append(keys, k)
		return true
	})
	for _, xk := range keys {
		t.del(bXattrs, xk)
	}
	t.record(wire.MutationKind_MUT_DELETE_OBJECT, uint64(id), nil, "", 0)
	return t.truncateBlocks(id, 0)
}

// ObjectCount returns the number of objects (as of this transaction).
func (t *Tx) ObjectCount() int {
	if !t.writable {
		return int(t.s.objects.Load())
	}
	return int(t.baseObjects) + t.batch.objects + t.fn.objects
}

// --- Directory entries ---

// Entry returns the entry name in directory dir (fserr.ErrNotExist if absent).
func (t *Tx) Entry(dir oid.ID, name string) (*wire.Entry, error) {
	var buf [64]byte
	v, ok := t.get(bEntries, nameKey(buf[:0], dir, name))
	if !ok {
		return nil, &fserr.NameError{What: "store: entry", Name: name, In: dir, Err: fserr.ErrNotExist}
	}
	return decodeEntry(v)
}

func decodeEntry(v []byte) (*wire.Entry, error) {
	e := new(wire.Entry)
	if err := proto.Unmarshal(v, e); err != nil {
		return nil, fmt.Errorf("store: corrupt directory entry: %w: %v", fserr.ErrIO, err)
	}
	return e, nil
}

// PutEntry creates or replaces the entry e.Name in directory dir.
func (t *Tx) PutEntry(dir oid.ID, e *wire.Entry) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if err := checkName("entry name", e.GetName()); err != nil {
		return err
	}
	key := t.mem.alloc(8 + len(e.Name))
	nameKey(key[:0], dir, e.Name)
	if old, ok := t.get(bEntries, key); ok {
		if o, err := decodeEntry(old); err == nil && o.Id != e.GetId() {
			t.removed = append(t.removed, Removed{Dir: dir, Name: e.Name, ID: oid.ID(o.Id)})
		}
	}
	v := t.mem.alloc(proto.Size(e))
	v, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(v[:0], e)
	if err != nil {
		return fmt.Errorf("store: encode entry: %w", err)
	}
	t.addOp(op{b: bEntries, key: key, val: v})
	t.record(wire.MutationKind_MUT_PUT_ENTRY, uint64(dir), bytes.Clone(v), "", 0)
	return nil
}

// DeleteEntry removes the entry name from directory dir (fserr.ErrNotExist
// if absent).
func (t *Tx) DeleteEntry(dir oid.ID, name string) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	var buf [64]byte
	k := nameKey(buf[:0], dir, name)
	old, ok := t.get(bEntries, k)
	if !ok {
		return fmt.Errorf("store: entry %q in %v: %w", name, dir, fserr.ErrNotExist)
	}
	if o, err := decodeEntry(old); err == nil {
		t.removed = append(t.removed, Removed{Dir: dir, Name: name, ID: oid.ID(o.Id)})
	}
	t.del(bEntries, k)
	t.record(wire.MutationKind_MUT_DELETE_ENTRY, uint64(dir), nil, name, 0)
	return nil
}

// Entries returns up to limit entries of dir (all if limit <= 0) whose
// names sort after "after", in name order.
func (t *Tx) Entries(dir oid.ID, after string, limit int) ([]*wire.Entry, error) {
	var buf [64]byte
	seek := nameKey(buf[:0], dir, after)
	var out []*wire.Entry
	var err error
	t.scan(bEntries, seek, 8, func(k, v []byte) bool {
		if bytes.Equal(k, seek) { // the name "after" itself
			return true
		}
		var e *wire.Entry
		if e, err = decodeEntry(v); err != nil {
			return false
		}
		out = append(out, e)
		return limit <= 0 || len(out) < limit
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// HasEntries reports whether directory dir has any entry.
func (t *Tx) HasEntries(dir oid.ID) (bool, error) {
	k := idKey(dir)
	found := false
	t.scan(bEntries, k[:], 8, func(_, _ []byte) bool {
		found = true
		return false
	})
	return found, nil
}

// --- Blocks ---

// Block returns the hash of block index of file id; ok is false for a hole.
func (t *Tx) Block(id oid.ID, index uint64) (hash [32]byte, ok bool, err error) {
	k := blockKey(id, index)
	v, ok := t.get(bBlockmap, k[:])
	if !ok {
		return hash, false, nil
	}
	if len(v) != 32 {
		return hash, false, fmt.Errorf("store: corrupt block map of %v: %w", id, fserr.ErrIO)
	}
	copy(hash[:], v)
	return hash, true, nil
}

// Blocks returns the present blocks of file id with index in
// [first, first+count), in index order.
func (t *Tx) Blocks(id oid.ID, first, count uint64) ([]BlockRef, error) {
	if count == 0 {
		return nil, nil
	}
	last := first + count - 1
	if last < first {
		last = math.MaxUint64
	}
	k := blockKey(id, first)
	var out []BlockRef
	var err error
	t.scan(bBlockmap, k[:], 8, func(k, v []byte) bool {
		idx := binary.BigEndian.Uint64(k[8:])
		if idx > last {
			return false
		}
		if len(v) != 32 {
			err = fmt.Errorf("store: corrupt block map of %v: %w", id, fserr.ErrIO)
			return false
		}
		r := BlockRef{Index: idx}
		copy(r.Hash[:], v)
		iv, ok := t.get(bBlockidx, v)
		l, _, ok2 := getIdx(iv)
		if !ok || !ok2 {
			err = fmt.Errorf("store: block %d of %v: missing from the block index: %w", idx, id, fserr.ErrIO)
			return false
		}
		r.Len = l.n
		out = append(out, r)
		return true
	})
	return out, err
}

// SetBlock makes block index of file id the block with the given hash,
// which must have been stored by PutBlock (pending) or already be indexed.
func (t *Tx) SetBlock(id oid.ID, index uint64, hash [32]byte) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	k := blockKey(id, index)
	old, had := t.get(bBlockmap, k[:])
	if had && bytes.Equal(old, hash[:]) {
		return nil
	}
	if err := t.incRef(hash); err != nil {
		return err
	}
	t.put(bBlockmap, k[:], hash[:])
	t.record(wire.MutationKind_MUT_SET_BLOCK, uint64(id), bytes.Clone(hash[:]), "", index)
	if had {
		return t.decRef(old)
	}
	return nil
}

// ClearBlock turns block index of file id into a hole.
func (t *Tx) ClearBlock(id oid.ID, index uint64) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	k := blockKey(id, index)
	old, had := t.get(bBlockmap, k[:])
	if !had {
		return nil
	}
	t.del(bBlockmap, k[:])
	t.record(wire.MutationKind_MUT_CLEAR_BLOCK, uint64(id), nil, "", index)
	return t.decRef(old)
}

// TruncateBlocks drops every block of file id with index >= fromIndex.
func (t *Tx) TruncateBlocks(id oid.ID, fromIndex uint64) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	t.record(wire.MutationKind_MUT_TRUNCATE_BLOCKS, uint64(id), nil, "", fromIndex)
	return t.truncateBlocks(id, fromIndex)
}

func (t *Tx) truncateBlocks(id oid.ID, fromIndex uint64) error {
	k := blockKey(id, fromIndex)
	var keys, hashes [][]byte
	t.scan(bBlockmap, k[:], 8, func(k, v []byte) bool {
		keys = append(keys, k)
		hashes = append(hashes, v)
		return true
	})
	for i := range keys {
		t.del(bBlockmap, keys[i])
		if err := t.decRef(hashes[i]); err != nil {
			return err
		}
	}
	return nil
}

// incRef adds a reference to block hash, indexing it if it is pending.
func (t *Tx) incRef(hash [32]byte) error {
	var buf [idxValLen]byte
	if v, ok := t.get(bBlockidx, hash[:]); ok {
		l, refs, ok := getIdx(v)
		if !ok {
			return fmt.Errorf("store: corrupt block index entry %s: %w", short(hash[:]), fserr.ErrIO)
		}
		if refs == math.MaxUint32 {
			return fmt.Errorf("store: block %s: too many references: %w", short(hash[:]), fserr.ErrTooManyLinks)
		}
		putIdx(buf[:], l, refs+1)
		t.put(bBlockidx, hash[:], buf[:])
		return nil
	}
	s := t.s
	s.pendMu.Lock()
	p, ok := s.pending[hash]
	s.pendMu.Unlock()
	if !ok {
		return fmt.Errorf("store: block %s: %w", short(hash[:]), ErrUnknownBlock)
	}
	putIdx(buf[:], p.loc, 1)
	t.put(bBlockidx, hash[:], buf[:])
	t.fn.fresh = append(t.fn.fresh, freshBlock{hash, p.loc})
	t.fn.used = append(t.fn.used, hash)
	t.fn.addLive(p.loc.seg, int64(p.loc.n))
	return nil
}

// decRef drops a reference to block hash, freeing it at zero.
func (t *Tx) decRef(hash []byte) error {
	v, ok := t.get(bBlockidx, hash)
	l, refs, ok2 := getIdx(v)
	if !ok || !ok2 {
		t.s.log.Error("store: dropping a reference to a block missing from the index", "hash", fmt.Sprintf("%x", hash))
		return nil
	}
	if refs <= 1 {
		t.del(bBlockidx, hash)
		t.fn.addLive(l.seg, -int64(l.n))
		return nil
	}
	var buf [idxValLen]byte
	putIdx(buf[:], l, refs-1)
	t.put(bBlockidx, hash, buf[:])
	return nil
}

// blockLoc returns the indexed location and reference count of a block.
func (t *Tx) blockLoc(hash []byte) (loc, uint32, bool) {
	v, ok := t.get(bBlockidx, hash)
	if !ok {
		return loc{}, 0, false
	}
	return getIdx(v)
}

// --- Extended attributes ---

// Xattr returns the value of attribute name of object id (fserr.ErrNoAttr).
func (t *Tx) Xattr(id oid.ID, name string) ([]byte, error) {
	var buf [64]byte
	v, ok := t.get(bXattrs, nameKey(buf[:0], id, name))
	if !ok || name == "" {
		return nil, &fserr.NameError{What: "store: attribute", Name: name, In: id, Err: fserr.ErrNoAttr}
	}
	return bytes.Clone(v[:len(v):len(v)]), nil
}

// SetXattr sets attribute name of object id.
func (t *Tx) SetXattr(id oid.ID, name string, v []byte) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if err := checkName("attribute name", name); err != nil {
		return err
	}
	var buf [64]byte
	t.put(bXattrs, nameKey(buf[:0], id, name), v)
	t.record(wire.MutationKind_MUT_SET_XATTR, uint64(id), bytes.Clone(v), name, 0)
	return nil
}

// RemoveXattr removes attribute name of object id (fserr.ErrNoAttr).
func (t *Tx) RemoveXattr(id oid.ID, name string) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	var buf [64]byte
	k := nameKey(buf[:0], id, name)
	if _, ok := t.get(bXattrs, k); !ok || name == "" {
		return fmt.Errorf("store: attribute %q of %v: %w", name, id, fserr.ErrNoAttr)
	}
	t.del(bXattrs, k)
	t.record(wire.MutationKind_MUT_REMOVE_XATTR, uint64(id), nil, name, 0)
	return nil
}

// Xattrs lists the attribute names of object id, sorted.
func (t *Tx) Xattrs(id oid.ID) ([]string, error) {
	k := idKey(id)
	var out []string
	t.scan(bXattrs, k[:], 8, func(k, _ []byte) bool {
		out = append(out, string(k[8:]))
		return true
	})
	return out, nil
}

// EachXattr calls fn with the attributes of object id whose names sort at
// or after from, in name order, until fn returns false. v is valid only
// during the call. (Starting at "\x01" skips the server's hidden names,
// which begin with a NUL, without reading them.)
func (t *Tx) EachXattr(id oid.ID, from string, fn func(name string, v []byte) bool) {
	var buf [64]byte
	t.scan(bXattrs, nameKey(buf[:0], id, from), 8, func(k, v []byte) bool {
		return fn(string(k[8:]), v)
	})
}

// --- Counters ---

func counterKey(s oid.Slice) [4]byte {
	var k [4]byte
	binary.BigEndian.PutUint32(k[:], uint32(s))
	return k
}

func (t *Tx) counter(s oid.Slice) uint64 {
	k := counterKey(s)
	v, ok := t.get(bCounters, k[:])
	if !ok || len(v) != 8 {
		return 1
	}
	return binary.BigEndian.Uint64(v)
}

// NextCounter allocates the next counter value of slice s (starting at 1).
// The allocation is persisted with the transaction.
func (t *Tx) NextCounter(s oid.Slice) (uint64, error) {
	if err := t.writeCheck(); err != nil {
		return 0, err
	}
	n := t.counter(s)
	if n > oid.MaxCounter {
		return 0, fmt.Errorf("store: slice %d: counter exhausted: %w", s, fserr.ErrNoSpace)
	}
	t.setCounter(s, n+1)
	return n, nil
}

// SetCounterFloor makes the next NextCounter(s) return at least n.
func (t *Tx) SetCounterFloor(s oid.Slice, n uint64) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if t.counter(s) < n {
		t.setCounter(s, n)
	}
	return nil
}

func (t *Tx) setCounter(s oid.Slice, next uint64) {
	k := counterKey(s)
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], next)
	t.put(bCounters, k[:], v[:])
	t.record(wire.MutationKind_MUT_COUNTER_FLOOR, uint64(s), nil, "", next)
}

// --- System records ---

// Sys returns the system record key (fserr.ErrNotExist if absent).
func (t *Tx) Sys(key string) ([]byte, error) {
	v, ok := t.get(bSys, []byte(key))
	if !ok || key == "" {
		return nil, fmt.Errorf("store: system record %q: %w", key, fserr.ErrNotExist)
	}
	return bytes.Clone(v[:len(v):len(v)]), nil
}

// PutSys stores the system record key.
func (t *Tx) PutSys(key string, v []byte) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	if err := checkName("system key", key); err != nil {
		return err
	}
	t.put(bSys, []byte(key), v)
	return nil
}

// DeleteSys removes the system record key (no error if absent).
func (t *Tx) DeleteSys(key string) error {
	if err := t.writeCheck(); err != nil {
		return err
	}
	t.del(bSys, []byte(key))
	return nil
}

// short abbreviates a block hash for messages (without making it escape).
func short(h []byte) string { return hex.EncodeToString(h[:8]) }

// SysKeys lists the system record keys starting with prefix, sorted.
func (t *Tx) SysKeys(prefix string) ([]string, error) {
	var out []string
	seek := []byte(prefix)
	t.scan(bSys, seek, len(seek), func(k, _ []byte) bool {
		out = append(out, string(k))
		return true
	})
	return out, nil
}
