package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Write-ahead log files are dir/wal-%016x, numbered by generation; a
// checkpoint starts the next generation. A file is preallocated with zeros
// in walChunk steps so that appending a record changes no file-system
// meta-data and its fdatasync is a single data flush; a zero length field
// marks the end of the records.
//
// Record: payload length u32 | CRC-32C of the rest u32 | sequence u64 |
// payload. Payload: ops, each kind u8 (bucket<<1 | delete) | uvarint key
// length | key | (put only) uvarint value length | value; or an inline
// block: kind opBlock | SHA-256 (32) | segment u32 | offset u64 | CRC-32C
// u32 | uvarint length | bytes (a block this record makes durable in place
// of a segment fdatasync, see inlineMax).
const (
	walPrefix    = "wal-"
	walHeader    = 16
	walChunk     = 1 << 20
	maxWALRecord = 1 << 30

	opBlock      = 0xff
	blockOpFixed = 1 + 32 + 4 + 8 + 4 // kind, hash, segment, offset, CRC
)

// inlineBlock is a block whose bytes a log record carries. data aliases
// the record (or a scratch buffer while encoding).
type inlineBlock struct {
	h    [32]byte
	l    loc
	data []byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeroChunk = make([]byte, walChunk)

type walFile struct {
	gen   uint64
	f     *os.File
	off   int64 // end of the last record
	alloc int64 // bytes zero-filled
}

func walName(gen uint64) string { return fmt.Sprintf("%s%016x", walPrefix, gen) }

func (s *Store) walPath(gen uint64) string { return filepath.Join(s.dir, walName(gen)) }

// newWAL creates log generation gen (createWAL) with room from the
// reserve if need be, and on a disk too full even for that, empty: its
// appends then grow it, or are refused for lack of space, but the store
// opens.
func (s *Store) newWAL(gen uint64) (w *walFile, err error) {
	err = s.withReserve(func() (err error) { w, err = s.createWAL(gen, walChunk); return err })
	if noSpace(err) {
		s.log.Warn("store: no room to preallocate the log", "err", err)
		w, err = s.createWAL(gen, 0)
	}
	return w, err
}

// createWAL creates generation gen, zero-filled (prealloc bytes) and
// durable, directory entry included.
func (s *Store) createWAL(gen uint64, prealloc int64) (*walFile, error) {
	f, err := os.OpenFile(s.walPath(gen), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, ioErr("create log", err)
	}
	w := &walFile{gen: gen, f: f}
	err = w.grow(prealloc)
	if err == nil && !s.noSync {
		if err = fdatasync(f); err != nil {
			err = ioErr("sync log", err)
		}
	}
	if err == nil {
		err = s.syncDir(s.dir)
	}
	if err != nil {
		f.Close()
		os.Remove(s.walPath(gen))
		return nil, err
	}
	return w, nil
}

// grow zero-fills at least n more bytes.
func (w *walFile) grow(n int64) error {
	for end := w.alloc + n; w.alloc < end; {
		c := min(end-w.alloc, walChunk)
		if _, err := w.f.WriteAt(zeroChunk[:c], w.alloc); err != nil {
			return ioErr("extend log", err)
		}
		w.alloc += c
	}
	return nil
}

// zero writes zeros over [off, off+n).
func (w *walFile) zero(off, n int64) error {
	for end := off + n; off < end; {
		c := min(end-off, walChunk)
		if _, err := w.f.WriteAt(zeroChunk[:c], off); err != nil {
			return err
		}
		off += c
	}
	return nil
}

// walGens lists the log generations present, in order.
func (s *Store) walGens() ([]uint64, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("store: read %s: %w", s.dir, err)
	}
	var gens []uint64
	for _, e := range ents {
		if name, ok := strings.CutPrefix(e.Name(), walPrefix); ok {
			if g, err := strconv.ParseUint(name, 16, 64); err == nil {
				gens = append(gens, g)
			}
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// encodeRecord serializes ops and inline blocks as the record with
// sequence number seq.
func encodeRecord(seq uint64, ops []op, blocks ...inlineBlock) []byte {
	n := walHeader
	for i := range ops {
		o := &ops[i]
		n += 1 + binary.MaxVarintLen32 + len(o.key)
		if !o.del {
			n += binary.MaxVarintLen32 + len(o.val)
		}
	}
	for i := range blocks {
		n += blockOpFixed + binary.MaxVarintLen32 + len(blocks[i].data)
	}
	rec := make([]byte, walHeader, n)
	for i := range ops {
		o := &ops[i]
		kind := o.b << 1
		if o.del {
			kind |= 1
		}
		rec = append(rec, kind)
		rec = binary.AppendUvarint(rec, uint64(len(o.key)))
		rec = append(rec, o.key...)
		if !o.del {
			rec = binary.AppendUvarint(rec, uint64(len(o.val)))
			rec = append(rec, o.val...)
		}
	}
	for i := range blocks {
		b := &blocks[i]
		rec = append(rec, opBlock)
		rec = append(rec, b.h[:]...)
		rec = binary.BigEndian.AppendUint32(rec, b.l.seg)
		rec = binary.BigEndian.AppendUint64(rec, b.l.off)
		rec = binary.BigEndian.AppendUint32(rec, b.l.crc)
		rec = binary.AppendUvarint(rec, uint64(len(b.data)))
		rec = append(rec, b.data...)
	}
	binary.LittleEndian.PutUint32(rec[0:], uint32(len(rec)-walHeader))
	binary.LittleEndian.PutUint64(rec[8:], seq)
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(rec[8:], castagnoli))
	return rec
}

var errBadRecord = errors.New("malformed log record")

// decodeOps calls fn for each op of a record's payload and blk (if not
// nil) for each inline block. The slices alias p.
func decodeOps(p []byte, fn func(b int, del bool, key, val []byte), blk func(b inlineBlock)) error {
	for len(p) > 0 {
		kind := p[0]
		if kind == opBlock {
			if len(p) < blockOpFixed {
				return errBadRecord
			}
			var b inlineBlock
			copy(b.h[:], p[1:33])
			b.l.seg = binary.BigEndian.Uint32(p[33:])
			b.l.off = binary.BigEndian.Uint64(p[37:])
			b.l.crc = binary.BigEndian.Uint32(p[45:])
			data, rest, ok := cutLen(p[blockOpFixed:])
			if !ok || len(data) > MaxBlockSize {
				return errBadRecord
			}
			b.l.n, b.data = uint32(len(data)), data
			if blk != nil {
				blk(b)
			}
			p = rest
			continue
		}
		b, del := int(kind>>1), kind&1 == 1
		if b >= nBuckets {
			return errBadRecord
		}
		key, rest, ok := cutLen(p[1:])
		if !ok {
			return errBadRecord
		}
		var val []byte
		if !del {
			if val, rest, ok = cutLen(rest); !ok {
				return errBadRecord
			}
		}
		fn(b, del, key, val)
		p = rest
	}
	return nil
}

// cutLen splits a uvarint-length-prefixed field off p.
func cutLen(p []byte) (field, rest []byte, ok bool) {
	n, w := binary.Uvarint(p)
	if w <= 0 || n > uint64(len(p)-w) {
		return nil, nil, false
	}
	end := w + int(n)
	return p[w:end:end], p[end:], true
}

// nextRecord parses the record at the start of buf. It returns n == 0 at
// the end of the records (zeros or end of data) and err for a torn or
// corrupt record.
func nextRecord(buf []byte) (seq uint64, payload []byte, n int, err error) {
	if len(buf) < walHeader {
		if len(buf) == 0 || allZero(buf) {
			return 0, nil, 0, nil
		}
		return 0, nil, 0, errBadRecord
	}
	plen := binary.LittleEndian.Uint32(buf[0:])
	if plen == 0 {
		if !allZero(buf[:walHeader]) {
			return 0, nil, 0, errBadRecord
		}
		return 0, nil, 0, nil
	}
	if plen > maxWALRecord || int64(plen) > int64(len(buf)-walHeader) {
		return 0, nil, 0, errBadRecord
	}
	end := walHeader + int(plen)
	if crc32.Checksum(buf[8:end], castagnoli) != binary.LittleEndian.Uint32(buf[4:]) {
		return 0, nil, 0, errBadRecord
	}
	return binary.LittleEndian.Uint64(buf[8:]), buf[walHeader:end:end], end, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
