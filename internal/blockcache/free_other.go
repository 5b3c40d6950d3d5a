//go:build !unix

package blockcache

// freeBytes is unknown here: the configured bound applies as is.
func freeBytes(string) (int64, bool) { return 0, false }
