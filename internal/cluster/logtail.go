package cluster

import (
	"bytes"
	"sync"
	"testing"
)

// logTail keeps the last lines of the cluster's logs in memory, to show
// them when a test that ran without -v fails.
type logTail struct {
	mu    sync.Mutex
	lines [][]byte
	next  int // ring position once full
	max   int
}

func newLogTail(max int) *logTail { return &logTail{max: max} }

// Write takes one formatted record (slog handlers write a record at a time).
func (l *logTail) Write(p []byte) (int, error) {
	line := bytes.TrimRight(bytes.Clone(p), "\n")
	l.mu.Lock()
	if len(l.lines) < l.max {
		l.lines = append(l.lines, line)
	} else {
		l.lines[l.next] = line
		l.next = (l.next + 1) % l.max
	}
	l.mu.Unlock()
	return len(p), nil
}

// dump logs the kept lines to t, oldest first.
func (l *logTail) dump(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var b bytes.Buffer
	for i := range l.lines {
		b.Write(l.lines[(l.next+i)%len(l.lines)])
		b.WriteByte('\n')
	}
	t.Logf("cluster: the last %d log lines (info and above):\n%s", len(l.lines), b.Bytes())
}
