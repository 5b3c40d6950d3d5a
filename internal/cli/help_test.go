package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current --help output")

// TestHelpGolden compares every command's --help with testdata/<path>.golden
// (go test ./internal/cli -run TestHelpGolden -update rewrites them).
func TestHelpGolden(t *testing.T) {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				walk(sub, append(append([]string(nil), path...), sub.Name()))
			}
		}
	}
	walk(newRoot(), nil)
	for _, path := range paths {
		name := strings.Join(append([]string{"wheelfs"}, path...), "_")
		t.Run(name, func(t *testing.T) {
			root := newRoot()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(append(append([]string(nil), path...), "--help"))
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			for _, bad := range []string{"wheelfs ca init\n", "--ca wheelfs", "--node-dir wheelfs"} {
				if strings.Contains(got, bad) {
					t.Errorf("help shows %q", bad)
				}
			}
			golden := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("--help differs from %s (run with -update if intended):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}
