package store

import (
	"bytes"
	"testing"
)

// FuzzDecodeOps feeds arbitrary log payloads to the record decoder, which
// reads whatever a crash left on disk: it must never panic, and a payload
// it accepts must re-encode to the same ops.
func FuzzDecodeOps(f *testing.F) {
	seed := encodeRecord(7, []op{
		{b: 1, key: []byte("k"), val: []byte("v")},
		{b: 2, del: true, key: []byte("gone")},
	}, inlineBlock{h: [32]byte{1}, l: loc{seg: 1, off: 4096, n: 3, crc: 9}, data: []byte("abc")})
	f.Add(seed[walHeader:])
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		var ops []op
		var blocks []inlineBlock
		err := decodeOps(p, func(b int, del bool, key, val []byte) {
			ops = append(ops, op{b: uint8(b), del: del, key: bytes.Clone(key), val: bytes.Clone(val)})
		}, func(b inlineBlock) {
			b.data = bytes.Clone(b.data)
			blocks = append(blocks, b)
		})
		if err != nil {
			return
		}
		again := encodeRecord(0, ops, blocks...)[walHeader:]
		var n int
		if err := decodeOps(again, func(int, bool, []byte, []byte) { n++ }, func(inlineBlock) { n++ }); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if n != len(ops)+len(blocks) {
			t.Fatalf("re-encoded record has %d entries, want %d", n, len(ops)+len(blocks))
		}
	})
}
