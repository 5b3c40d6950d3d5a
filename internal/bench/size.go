package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte count such as "512MiB", "1GiB", "100MB", "64k" or
// "4096". Suffixes with an "i" (KiB, MiB, GiB, TiB) and the bare letters K,
// M, G, T are powers of 1024; KB, MB, GB and TB are powers of 1000, as in
// dd(1). Case is ignored, and a trailing "B" alone means bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("size %q: empty", s)
	}
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	var mult float64
	switch unit {
	case "", "b":
		mult = 1
	case "k", "kib":
		mult = 1 << 10
	case "m", "mib":
		mult = 1 << 20
	case "g", "gib":
		mult = 1 << 30
	case "t", "tib":
		mult = 1 << 40
	case "kb":
		mult = 1e3
	case "mb":
		mult = 1e6
	case "gb":
		mult = 1e9
	case "tb":
		mult = 1e12
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", s, t[i:])
	}
	if num == "" {
		return 0, fmt.Errorf("size %q: no number", s)
	}
	if n, err := strconv.ParseInt(num, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q: negative", s)
		}
		if mult > 1 && float64(n) > float64(1<<62)/mult {
			return 0, fmt.Errorf("size %q: too large", s)
		}
		return n * int64(mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: bad number %q", s, num)
	}
	if f < 0 || f*mult > float64(1<<62) {
		return 0, fmt.Errorf("size %q: out of range", s)
	}
	return int64(f * mult), nil
}

// FormatSize renders a byte count with the largest binary unit that divides
// it exactly ("512MiB", "1GiB", "1536KiB"), or in bytes.
func FormatSize(n int64) string {
	units := []struct {
		name  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}
	for _, u := range units {
		if n != 0 && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}
