package server

// Keys of records in the store (outcomes, tombstones, name locks) are
// built on every mutation: by hand, since fmt.Sprintf was 9 % of a
// remove's CPU (docs/BENCHMARKS.md).

const hexDigits = "0123456789abcdef"

// appendHex appends v as width lowercase hex digits, zero-padded (as
// fmt's %0*x; wider values keep only the low digits, which no caller has).
func appendHex(b []byte, v uint64, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		b = append(b, hexDigits[(v>>(4*uint(i)))&0xf])
	}
	return b
}

// A key is built in a buffer on the stack, so that the string is its
// one allocation.
const keyBuf = 96

// hexKey returns prefix, v as 16 hex digits, then suffix.
func hexKey(prefix string, v uint64, suffix string) string {
	var buf [keyBuf]byte
	b := append(buf[:0], prefix...)
	b = appendHex(b, v, 16)
	return string(append(b, suffix...))
}

// hexKey2 returns prefix, then v and w as 16 hex digits each, '/'
// between them.
func hexKey2(prefix string, v, w uint64) string {
	var buf [keyBuf]byte
	b := append(buf[:0], prefix...)
	b = append(appendHex(b, v, 16), '/')
	return string(appendHex(b, w, 16))
}
