// Package cli implements the wheelfs command line with cobra: one
// subcommand per role (up, config, server, mount, node) plus ca, info,
// status, fsck and bench, each a thin layer over the deploy, client and fusefs
// packages.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// Main runs the command line and returns the exit code.
func Main(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "wheelfs:", err)
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}

// exitError is an error with its own exit status (fsck's "damage left").
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

type globalFlags struct {
	logLevel string
}

func newRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "wheelfs",
		Short:         "WheelFS: a wide-area distributed file system with semantic cues",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newUp(g), newConfigMember(g), newServer(g), newMount(g), newNode(g), newCA(g),
		newInfo(),
		newStats(), newStatus(g), newFsck(g), newBench(g), newTestbed(g), newLogin(), newLogout())
	return root
}

func (g *globalFlags) logger() *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// defaultDataDir is /var/lib/wheelfs for root and the XDG data directory
// otherwise.
func defaultDataDir() string {
	if os.Getuid() == 0 {
		return "/var/lib/wheelfs"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "wheelfs")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf("wheelfs-%d", os.Getuid()))
	}
	return filepath.Join(home, ".local", "share", "wheelfs")
}

// checkMountpoint gives a clear error for a missing, non-directory or
// already mounted mount point.
func checkMountpoint(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("mount point %s does not exist (create it with mkdir -p %s)", abs, abs)
	}
	if errors.Is(err, syscall.ENOTCONN) {
		return "", fmt.Errorf("mount point %s is a dead FUSE mount: run `umount -l %s` first", abs, abs)
	}
	if err != nil {
		return "", fmt.Errorf("mount point %s: %w", abs, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("mount point %s is not a directory", abs)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real // the mount table names resolved paths
	}
	if mountinfo.Mounted(abs) {
		return "", fmt.Errorf("mount point %s is busy: something is already mounted there", abs)
	}
	return abs, nil
}
