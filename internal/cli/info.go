package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fusefs"
	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

func newInfo() *cobra.Command {
	return &cobra.Command{
		Use:   "info PATH",
		Short: "Print an object's identity and placement (id, slice, version, primary, replicas, cues) as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			buf := make([]byte, 64<<10)
			n, err := unix.Lgetxattr(args[0], fusefs.InfoXattr, buf)
			if err != nil {
				if !onWheelFS(args[0]) {
					return fmt.Errorf("%s: %w (it is not on a WheelFS mount)", args[0], err)
				}
				return fmt.Errorf("%s: %w", args[0], err)
			}
			var out bytes.Buffer
			if err := json.Indent(&out, buf[:n], "", "  "); err != nil {
				return fmt.Errorf("%s: bad info: %w", args[0], err)
			}
			out.WriteByte('\n')
			_, err = os.Stdout.Write(out.Bytes())
			return err
		},
	}
}

func newStats() *cobra.Command {
	return &cobra.Command{
		Use:   "stats PATH",
		Short: "Print the requests the client of the mount holding PATH has sent, by method, as JSON",
		Long: "Print the requests the client of the mount holding PATH has sent to storage servers since it\n" +
			"started, by method (Lookup, Open, Commit, ...), as JSON. Two readings around an operation give\n" +
			"its round trips (background requests, such as open registrations and releases, included).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := mountStats(args[0])
			if err != nil {
				return err
			}
			out, err := json.MarshalIndent(st, "", "  ")
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(append(out, '\n'))
			return err
		},
	}
}

// mountStats reads the request counts of the mount holding path.
func mountStats(path string) (client.Stats, error) {
	st, err := mountinfo.Stats(path)
	if err != nil && !onWheelFS(path) {
		return st, fmt.Errorf("%w (it is not on a WheelFS mount)", err)
	}
	return st, err
}

// onWheelFS reports whether path (or, for a missing file, its directory)
// lies on a WheelFS mount.
func onWheelFS(path string) bool {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	// Resolve what exists of the path: the mount table names real paths.
	dir := abs
	for {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			abs = filepath.Join(real, strings.TrimPrefix(abs, dir))
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return false
	}
	m, ok := mountinfo.Of(ms, abs)
	return ok && strings.HasPrefix(m.FSType, "fuse.wheelfs")
}
