package cli

import (
	"testing"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/deploy"
)

// TestCacheFlags checks how --cache-mem, --cache-disk and --cache-dir
// become the client's cache configuration.
func TestCacheFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		mem, disk int64
		dir       string
		bad       bool
	}{
		{args: nil, mem: 100 << 20, disk: 4 << 30, dir: "/d/cache"},
		{args: []string{"--cache-mem", "1GiB", "--cache-disk", "10GiB", "--cache-dir", "/c"}, mem: 1 << 30, disk: 10 << 30, dir: "/c"},
		{args: []string{"--cache-disk", "0"}, mem: 100 << 20, disk: 0, dir: ""},
		{args: []string{"--cache-mem", "0"}, bad: true},
		{args: []string{"--cache-disk", "lots"}, bad: true},
	} {
		f := &hostFlags{data: "/d"}
		cmd := &cobra.Command{}
		f.register(cmd, deploy.RoleClient)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := deploy.NewConfig(f.data)
		err := f.cacheConfig(&cfg)
		if tc.bad {
			if err == nil {
				t.Errorf("%v: accepted", tc.args)
			}
			continue
		}
		c := cfg.Client
		if err != nil || c.CacheBytes != tc.mem || c.DiskCacheBytes != tc.disk || c.CacheDir != tc.dir {
			t.Errorf("%v: mem %d disk %d dir %q (%v), want %d %d %q", tc.args, c.CacheBytes, c.DiskCacheBytes, c.CacheDir, err, tc.mem, tc.disk, tc.dir)
		}
	}
}
