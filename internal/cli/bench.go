package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/bench"
	"github.com/wheelfs/wheelfs/internal/loopbackfs"
)

func newBench(g *globalFlags) *cobra.Command {
	var (
		dir, size    string
		files        int
		runs         int
		skipLoopback bool
		passthrough  bool
		asJSON, keep bool
	)
	cmd := &cobra.Command{
		Use:   "bench [--dir DIR] [--size 512MiB] [--files 10000] [--runs 3] [--skip-loopback] [--json]",
		Short: "Measure a one-host WheelFS against the raw disk and a FUSE loopback mount (run as root for cold reads)",
		Long: `bench measures, on the same backing disk, three targets side by side: a plain
directory (the raw disk), go-fuse's loopback file system mounting a directory
(the FUSE ceiling, served by this binary; its reads and writes go through
its process, as WheelFS's do, unless --loopback-passthrough), and a one-host
WheelFS started as ` + "`wheelfs up`" + ` with this binary. The tar workload needs the go
command (it extracts $GOROOT/src).
Workloads: sequential write and cold sequential read in 1 MiB I/Os; create,
stat, readdir and unlink of many empty files; tar -x of $GOROOT/src; and
the floor of a durable create: the raw disk's pwrite+fdatasync, and the
loopback's creates each followed by one (WheelFS makes every create
durable, the loopback none: the last column compares with that floor).
Progress goes to stderr, the table (or JSON) to stdout. See docs/BENCHMARKS.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := bench.ParseSize(size)
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("locating the wheelfs binary: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := bench.Run(ctx, bench.Options{Dir: dir, Size: n, Files: files, Runs: runs, SkipLoopback: skipLoopback,
				LoopbackPassthrough: passthrough, Keep: keep, Self: self, Logger: g.logger()})
			if rep != nil && len(rep.Targets) > 0 {
				if asJSON {
					enc := json.NewEncoder(os.Stdout)
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(rep); jerr != nil {
						return jerr
					}
					bench.WriteTable(os.Stderr, rep)
				} else {
					bench.WriteTable(os.Stdout, rep)
				}
			}
			if err != nil {
				return err
			}
			if f := rep.Failures(); len(f) > 0 {
				return fmt.Errorf("%d workload or target failure(s), listed above", len(f))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "make the scratch directory in DIR (default /var/tmp); it sets the backing disk")
	f.StringVar(&size, "size", "512MiB", "size of the sequential file (KiB, MiB, GiB; KB, MB, GB)")
	f.IntVar(&files, "files", 10000, "number of small files to create, stat, list and unlink")
	f.IntVar(&runs, "runs", 3, "repetitions of the sequential write and read and of the metadata workloads; the median is reported")
	f.BoolVar(&skipLoopback, "skip-loopback", false, "do not measure go-fuse's loopback file system")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON on stdout (the table goes to stderr)")
	f.BoolVar(&keep, "keep", false, "keep the scratch directory (logs, data) after the run")
	f.BoolVar(&passthrough, "loopback-passthrough", false, "let the loopback's kernel read and write its backing files itself (FUSE passthrough, root on Linux 6.9+): its reads and writes are then the raw disk's")
	cmd.AddCommand(newBenchCompare(), newBenchLoopback(g))
	return cmd
}

// newBenchLoopback is the loopback file system bench mounts as its FUSE
// ceiling, served by this binary (hidden: bench runs it).
func newBenchLoopback(g *globalFlags) *cobra.Command {
	var o loopbackfs.Options
	cmd := &cobra.Command{
		Use:    "loopback MOUNTPOINT BACKING [--allow-other] [--passthrough]",
		Short:  "Serve go-fuse's loopback file system of BACKING at MOUNTPOINT until interrupted (bench's FUSE ceiling)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return loopbackfs.Serve(ctx, args[0], args[1], o, func() {
				g.logger().Info("loopback mounted", "mountpoint", args[0], "backing", args[1], "passthrough", o.Passthrough)
			})
		},
	}
	cmd.Flags().BoolVar(&o.AllowOther, "allow-other", false, "let other users in (the kernel checks permissions)")
	cmd.Flags().BoolVar(&o.Passthrough, "passthrough", false, "let the kernel read and write the backing files itself")
	cmd.Flags().BoolVar(&o.Debug, "debug", false, "log every FUSE request")
	return cmd
}

func newBenchCompare() *cobra.Command {
	var (
		slack  float64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "compare RECORDED.json NEW.json [--slack 0.2] [--json]",
		Short: "Flag workloads whose WheelFS ratio (to the same run's raw disk or loopback) fell by more than --slack",
		Long: `compare reads two reports of 'wheelfs bench --json' (the last one recorded in
docs/bench/ and a new one) and compares, per workload, WheelFS's ratio to its
base in the same run (the raw disk for sequential I/O, the loopback mount for
the rest). A workload whose ratio fell by more than --slack is REGRESSED, and
the command exits with status 1. scripts/bench-guard.sh runs a new benchmark,
records it and calls this.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if slack <= 0 || slack >= 1 {
				return fmt.Errorf("--slack %v: want a fraction between 0 and 1", slack)
			}
			old, err := bench.ReadReport(args[0])
			if err != nil {
				return err
			}
			cur, err := bench.ReadReport(args[1])
			if err != nil {
				return err
			}
			cs := bench.Compare(old, cur, slack)
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(cs); err != nil {
					return err
				}
			} else if err := bench.WriteComparison(os.Stdout, cs, slack); err != nil {
				return err
			}
			if n := bench.Regressions(cs); n > 0 {
				cmd.SilenceUsage = true
				return fmt.Errorf("%d workload(s) regressed against %s", n, args[0])
			}
			return nil
		},
	}
	cmd.Flags().Float64Var(&slack, "slack", bench.DefaultSlack, "largest tolerated fall of a ratio, as a fraction")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the comparison as JSON")
	return cmd
}
