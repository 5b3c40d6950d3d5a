package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// BenchmarkSequentialCreate: one durable Update (meta + entry) per op from a
// single caller; no batching can help.
func BenchmarkSequentialCreate(b *testing.B) {
	s := openT(b, b.TempDir(), Options{})
	ctx := context.Background()
	var i uint64
	m := &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o644, Nlink: 1}
	e := &wire.Entry{Type: wire.Type_TYPE_FILE}
	var name [16]byte
	fn := func(tx *Tx) error {
		i++
		id := oid.Make(9, i)
		m.Id = uint64(id)
		if err := tx.PutMeta(m); err != nil {
			return err
		}
		e.Id = uint64(id)
		e.Name = string(fmt.Appendf(name[:0], "f%08d", i))
		return tx.PutEntry(dirID, e)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Update(ctx, fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

// BenchmarkParallelCreate: concurrent durable creates, batched by group commit.
func BenchmarkParallelCreate(b *testing.B) {
	s := openT(b, b.TempDir(), Options{})
	ctx := context.Background()
	var next atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := next.Add(1)
			id := oid.Make(9, n)
			err := s.Update(ctx, func(tx *Tx) error {
				if err := tx.PutMeta(&wire.Meta{Id: uint64(id), Type: wire.Type_TYPE_FILE, Mode: 0o644, Nlink: 1}); err != nil {
					return err
				}
				return tx.PutEntry(dirID, &wire.Entry{Name: fmt.Sprintf("f%08d", n), Id: uint64(id), Type: wire.Type_TYPE_FILE})
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
	b.ReportMetric(float64(b.N)/float64(s.batches.Load()), "ops/batch")
}

// BenchmarkPutBlock64K: PutBlock of distinct 64 KiB blocks (not yet
// durable: that happens at the referencing Update).
func BenchmarkPutBlock64K(b *testing.B) {
	s := openT(b, b.TempDir(), Options{})
	data := make([]byte, 64<<10)
	var n uint64
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		n++
		binary.LittleEndian.PutUint64(data, n)
		if _, err := s.PutBlock(data); err != nil {
			b.Fatal(err)
		}
	}
}

// commitEvery is how many 64 KiB blocks a file write commits at once: a
// 1 MiB file (or fsync every MiB), and a 64 MiB file closed at the end.
var commitEvery = []struct {
	name   string
	blocks int
}{{"commit=1MiB", 16}, {"commit=64MiB", 1024}}

// BenchmarkWriteFile64K: a sequential file write as the server does it:
// PutBlock 64 KiB blocks, then one durable Update referencing them all
// (the file's close).
func BenchmarkWriteFile64K(b *testing.B) {
	for _, ce := range commitEvery {
		b.Run(ce.name, func(b *testing.B) {
			s := openT(b, b.TempDir(), Options{})
			ctx := context.Background()
			data := make([]byte, 64<<10)
			hashes := make([][32]byte, 0, ce.blocks)
			var idx uint64
			commit := func(tx *Tx) error {
				first := idx - uint64(len(hashes))
				for j, h := range hashes {
					if err := tx.SetBlock(fileID, first+uint64(j), h); err != nil {
						return err
					}
				}
				return nil
			}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				binary.LittleEndian.PutUint64(data, idx)
				h, err := s.PutBlock(data)
				if err != nil {
					b.Fatal(err)
				}
				hashes = append(hashes, h)
				idx++
				if len(hashes) == ce.blocks {
					if err := s.Update(ctx, commit); err != nil {
						b.Fatal(err)
					}
					hashes = hashes[:0]
				}
			}
			if len(hashes) > 0 { // the tail is part of the measured work
				if err := s.Update(ctx, commit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRawDisk64K is the baseline for BenchmarkWriteFile64K: plain
// 64 KiB writes to one file with an fdatasync at each commit point.
func BenchmarkRawDisk64K(b *testing.B) {
	for _, ce := range commitEvery {
		b.Run(ce.name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			data := make([]byte, 64<<10)
			var n int
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				binary.LittleEndian.PutUint64(data, uint64(n))
				if _, err := f.Write(data); err != nil {
					b.Fatal(err)
				}
				if n++; n%ce.blocks == 0 {
					if err := fdatasync(f); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := fdatasync(f); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkReadBlock64K: verified reads of committed blocks.
func BenchmarkReadBlock64K(b *testing.B) {
	s := openT(b, b.TempDir(), Options{NoSync: true})
	data := make([]byte, 64<<10)
	var hs [][32]byte
	for i := range 64 {
		binary.LittleEndian.PutUint64(data, uint64(i))
		h, _ := s.PutBlock(data)
		hs = append(hs, h)
	}
	if err := s.Update(context.Background(), func(tx *Tx) error {
		for i, h := range hs {
			if err := tx.SetBlock(fileID, uint64(i), h); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.ReadBlock(hs[i%len(hs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSmallFileCommit: a small file's close as the server does it,
// sequentially: PutBlock of a fresh 4 KiB block, then one durable Update
// that references it and writes the file's meta-data.
func BenchmarkSmallFileCommit(b *testing.B) {
	s := openT(b, b.TempDir(), Options{})
	ctx := context.Background()
	data := randBlock(b, 4<<10)
	m := &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o644, Nlink: 1, Size: uint64(len(data))}
	var i uint64
	var h [32]byte
	fn := func(tx *Tx) error {
		id := oid.Make(9, i)
		if err := tx.SetBlock(id, 0, h); err != nil {
			return err
		}
		m.Id = uint64(id)
		return tx.PutMeta(m)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		i++
		binary.LittleEndian.PutUint64(data, i)
		var err error
		if h, err = s.PutBlock(data); err != nil {
			b.Fatal(err)
		}
		if err := s.Update(ctx, fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
}
