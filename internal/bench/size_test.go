package bench

import "testing"

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"512MiB": 512 << 20,
		"512mib": 512 << 20,
		"1GiB":   1 << 30,
		"1g":     1 << 30,
		"64K":    64 << 10,
		"4096":   4096,
		"4096B":  4096,
		"100MB":  100e6,
		"2GB":    2e9,
		"1.5GiB": 3 << 29,
		" 8 MiB": 8 << 20,
		"1TiB":   1 << 40,
		"0":      0,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "12XB", "-1MiB", "1..2M", "99999999999TiB", "abc"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatSize(t *testing.T) {
	cases := map[int64]string{
		512 << 20:       "512MiB",
		1 << 30:         "1GiB",
		1536 << 10:      "1536KiB",
		1000:            "1000B",
		0:               "0B",
		3 << 40:         "3TiB",
		(1 << 20) + 512: "1049088B",
	}
	for in, want := range cases {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
		if n, err := ParseSize(FormatSize(in)); err != nil || n != in {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", in, n, err)
		}
	}
}
