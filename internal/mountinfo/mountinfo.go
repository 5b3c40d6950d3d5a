// Package mountinfo reads the kernel's table of mounts
// (/proc/self/mountinfo): which file system is mounted where. The CLI, the
// benchmark and the end-to-end tests use it to tell a live mount from a bare
// directory.
package mountinfo

import (
	"os"
	"strconv"
	"strings"
)

// Entry is one mount, from one line of /proc/self/mountinfo.
type Entry struct {
	Point  string
	FSType string
	Source string
}

// Parse parses the text of /proc/self/mountinfo.
func Parse(text string) []Entry {
	var out []Entry
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, Entry{Point: unescape(f[4]), FSType: f[sep+1], Source: unescape(f[sep+2])})
	}
	return out
}

// unescapeMount undoes the kernel's octal escapes (\040 for space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Read returns the current process's mounts.
func Read() ([]Entry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return Parse(string(b)), nil
}

// Mounted tells whether something is mounted exactly at dir.
func Mounted(dir string) bool {
	ms, err := Read()
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m.Point == dir {
			return true
		}
	}
	return false
}

// Under lists the mount points at or below dir.
func Under(dir string) []string {
	ms, _ := Read()
	var out []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	return out
}

// Of returns the mount holding path (the longest matching mount point).
func Of(ms []Entry, path string) (Entry, bool) {
	var best Entry
	found := false
	for _, m := range ms {
		if m.Point == path || m.Point == "/" || strings.HasPrefix(path, m.Point+"/") {
			if !found || len(m.Point) >= len(best.Point) {
				best, found = m, true
			}
		}
	}
	return best, found
}
