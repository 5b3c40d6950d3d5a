package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/fusefs"
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
				return fmt.Errorf("%s: %w (is it on a WheelFS mount?)", args[0], err)
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
