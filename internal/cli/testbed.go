package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/experiment"
	"github.com/wheelfs/wheelfs/internal/testbed"
)

// defaultTestbedDir is where testbed commands look without --dir.
func defaultTestbedDir() string {
	if d := os.Getenv("WHEELFS_TESTBED"); d != "" {
		return d
	}
	return "/tmp/wheelfs-testbed"
}

func newTestbed(g *globalFlags) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "testbed",
		Short: "A multi-site WheelFS on this machine: real processes in network namespaces with wide-area delays",
		Long: `Bring up several sites on one Linux machine (root): one network namespace
per host, per site and for the wide area, where a delay router holds each
packet for its site pair's one-way delay and drops cut pairs' packets. Each
site runs a config member (3 or 5 in all) and wheelfs node / mount processes
whose mounts appear under DIR/SITE-N.

Every subcommand but up takes --dir (default $WHEELFS_TESTBED or
/tmp/wheelfs-testbed).`,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "testbed `DIR` (state, data, logs and mounts; default $WHEELFS_TESTBED or /tmp/wheelfs-testbed)")
	dirOf := func() string {
		if dir == "" {
			return defaultTestbedDir()
		}
		return dir
	}
	cmd.AddCommand(newTestbedUp(dirOf), newTestbedDown(dirOf), newTestbedStatus(dirOf),
		newTestbedPartition(dirOf), newTestbedHeal(dirOf), newTestbedKill(dirOf), newTestbedRestart(dirOf),
		newTestbedSetRTT(dirOf), newTestbedExec(dirOf), newTestbedRouter(g), newTestbedRun(g, dirOf))
	return cmd
}

func newTestbedUp(dirOf func() string) *cobra.Command {
	var (
		sites, rttMatrix, uplink string
		rtt                      time.Duration
		o                        testbed.Options
	)
	cmd := &cobra.Command{
		Use:   "up [DIR] --sites west,east,eu [--rtt 100ms | --rtt-matrix FILE] [--uplink 6mbit] [--servers-per-site N] [--clients-per-site N] [--lock-ttl L]",
		Short: "Create the namespaces and links and start every process; returns once every mount answers",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dirOf()
			if len(args) == 1 {
				dir = args[0]
			}
			o.Sites = splitList(sites)
			if rttMatrix != "" && cmd.Flags().Changed("rtt") {
				return errors.New("give either --rtt or --rtt-matrix, not both")
			}
			o.RTT = testbed.Uniform(o.Sites, rtt)
			if rttMatrix != "" {
				m, err := testbed.ReadRTTMatrix(rttMatrix)
				if err != nil {
					return err
				}
				o.RTT = m
			}
			var err error
			if o.Uplink, err = testbed.ParseRate(uplink); err != nil {
				return fmt.Errorf("--uplink: %w", err)
			}
			out := cmd.OutOrStdout()
			st, err := testbed.Up(cmd.Context(), dir, o, out)
			if err != nil {
				if st != nil {
					return fmt.Errorf("%w\n(clean up with: wheelfs testbed down --dir %s)", err, st.Dir)
				}
				return err
			}
			fmt.Fprintln(out)
			testbed.WriteStatus(out, st)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&sites, "sites", "west,east,eu", "comma-separated site `NAMES`")
	fl.DurationVar(&rtt, "rtt", 100*time.Millisecond, "round-trip time between every two sites")
	fl.StringVar(&rttMatrix, "rtt-matrix", "", "`FILE` of per-pair RTTs, lines \"SITE SITE RTT\"")
	fl.StringVar(&uplink, "uplink", "0", "egress `RATE` of every site (e.g. 6mbit; 0 = unlimited)")
	fl.IntVar(&o.ServersPerSite, "servers-per-site", 1, "storage nodes (server + mount) per site")
	fl.IntVar(&o.ClientsPerSite, "clients-per-site", 0, "client-only mounts per site")
	fl.DurationVar(&o.LockTTL, "lock-ttl", 0, "slice lock lease L of the nodes (default: the node's own)")
	fl.DurationVar(&o.Maintain, "maintain-period", 0, "maintenance period of the nodes (default: the node's own)")
	fl.StringVar(&o.TCPCongestion, "tcp-cc", "cubic", "TCP congestion control of the hosts' wide-area routes (\"\" = the kernel's default)")
	fl.BoolVar(&o.NoSlowStartAfterIdle, "no-slow-start-after-idle", false, "set net.ipv4.tcp_slow_start_after_idle=0 in the hosts (keep the congestion window across idle periods)")
	fl.DurationVar(&o.Lease, "lease", 0, "meta-data lease length of the nodes (default: the node's own)")
	return cmd
}

func newTestbedDown(dirOf func() string) *cobra.Command {
	return &cobra.Command{
		Use:   "down [DIR]",
		Short: "Stop every process and remove every mount and namespace of the testbed (data and logs stay)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dirOf()
			if len(args) == 1 {
				dir = args[0]
			}
			return testbed.Down(dir, cmd.OutOrStdout())
		},
	}
}

func newTestbedStatus(dirOf func() string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Hosts (process, readiness, mount) and links (RTT, cut or up)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := testbed.Load(dirOf())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			testbed.WriteStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state file")
	return cmd
}

func newTestbedPartition(dirOf func() string) *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "partition SITE [--from SITE]",
		Short: "Cut a site off from every other site (or only from --from); packets are dropped",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return testbed.Partition(dirOf(), args[0], from)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "cut only the link to this `SITE`")
	return cmd
}

func newTestbedHeal(dirOf func() string) *cobra.Command {
	return &cobra.Command{
		Use:   "heal [SITE]",
		Short: "Restore the links of a site (of every site without SITE)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			site := ""
			if len(args) == 1 {
				site = args[0]
			}
			return testbed.Heal(dirOf(), site)
		},
	}
}

func newTestbedKill(dirOf func() string) *cobra.Command {
	var kill9 bool
	cmd := &cobra.Command{
		Use:   "kill [-9] HOST...",
		Short: "Stop hosts' processes together: SIGTERM (clean stop), or SIGKILL with -9 (a crash; their mounts stay dead)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return testbed.Kill(dirOf(), args, kill9)
		},
	}
	cmd.Flags().BoolVarP(&kill9, "kill", "9", false, "send SIGKILL")
	return cmd
}

func newTestbedRestart(dirOf func() string) *cobra.Command {
	return &cobra.Command{
		Use:   "restart HOST...",
		Short: "Stop hosts together (if running) and start them again on the same data; waits until every one serves",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return testbed.Restart(cmd.Context(), dirOf(), args)
		},
	}
}

func newTestbedSetRTT(dirOf func() string) *cobra.Command {
	var (
		rtt    time.Duration
		matrix string
		pairs  []string
	)
	cmd := &cobra.Command{
		Use:   "set-rtt (--rtt 100ms | --rtt-matrix FILE | --pair west,east=50ms ...)",
		Short: "Change the RTT between sites while the testbed runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := testbed.Load(dirOf())
			if err != nil {
				return err
			}
			m := testbed.RTTMatrix{}
			switch {
			case cmd.Flags().Changed("rtt"):
				m = testbed.Uniform(st.Opts.Sites, rtt)
			case matrix != "":
				if m, err = testbed.ReadRTTMatrix(matrix); err != nil {
					return err
				}
			}
			for _, p := range pairs {
				k, v, ok := strings.Cut(p, "=")
				a, b, ok2 := strings.Cut(k, ",")
				d, err := time.ParseDuration(v)
				if !ok || !ok2 || err != nil || d < 0 {
					return fmt.Errorf("--pair %q: want SITE,SITE=RTT such as west,east=50ms", p)
				}
				m.Set(a, b, d)
			}
			if len(m) == 0 {
				return errors.New("give --rtt, --rtt-matrix or --pair")
			}
			return testbed.SetRTT(dirOf(), m)
		},
	}
	cmd.Flags().DurationVar(&rtt, "rtt", 0, "RTT between every two sites")
	cmd.Flags().StringVar(&matrix, "rtt-matrix", "", "`FILE` of per-pair RTTs")
	cmd.Flags().StringSliceVar(&pairs, "pair", nil, "one pair's RTT, `SITE,SITE=RTT` (repeatable)")
	return cmd
}

func newTestbedExec(dirOf func() string) *cobra.Command {
	return &cobra.Command{
		Use:   "exec HOST -- COMMAND [ARG...]",
		Short: "Run a command in a host's network namespace (e.g. a load generator at a site)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return testbed.Exec(dirOf(), args[0], args[1:])
		},
	}
}

func newTestbedRouter(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:    "router DIR",
		Short:  "The testbed's delay router (started by up in the wide-area namespace)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return testbed.RunRouter(cmd.Context(), args[0], g.logger())
		},
	}
}

func newTestbedRun(g *globalFlags, dirOf func() string) *cobra.Command {
	var (
		jsonOut string
		set     []string
		env     experiment.Env
	)
	var list strings.Builder
	for _, e := range experiment.All() {
		fmt.Fprintf(&list, "  %-14s %s\n", e.Name, e.Summary)
		for _, k := range slices.Sorted(maps.Keys(e.Params)) {
			fmt.Fprintf(&list, "  %-14s   --set %s=%s\n", "", k, e.Params[k])
		}
	}
	cmd := &cobra.Command{
		Use:   "run EXPERIMENT [--runs N] [--set KEY=VALUE ...] [--json FILE] [--keep]",
		Short: "Run one of the paper's experiments on a testbed it brings up in --dir, print a table and write JSON",
		Long:  "Experiments (with their --set parameters and defaults):\n" + list.String(),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := experiment.Find(args[0])
			if err != nil {
				return err
			}
			env.Dir, env.Out, env.Log = dirOf(), cmd.OutOrStdout(), g.logger()
			env.Params = map[string]string{}
			for _, kv := range set {
				k, v, ok := strings.Cut(kv, "=")
				if _, known := e.Params[k]; !ok || !known {
					return fmt.Errorf("--set %q: want KEY=VALUE with KEY one of the experiment's parameters (wheelfs testbed run --help)", kv)
				}
				env.Params[k] = v
			}
			if env.Runs < 1 {
				return errors.New("--runs: want at least 1")
			}
			start := time.Now()
			res, err := e.Run(cmd.Context(), &env)
			if err != nil {
				return fmt.Errorf("%s: %w", e.Name, err)
			}
			res.Experiment, res.Started, res.Seconds = e.Name, start, time.Since(start).Seconds()
			res.Command = "wheelfs testbed " + strings.Join(os.Args[2:], " ")
			res.Write(cmd.OutOrStdout())
			if jsonOut == "" {
				jsonOut = fmt.Sprintf("%s/%s.json", env.Dir, e.Name)
			}
			if err := res.WriteJSON(jsonOut); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nwrote %s\n", jsonOut)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&env.Runs, "runs", 5, "repetitions of each measured step")
	fl.StringArrayVar(&set, "set", nil, "experiment parameter `KEY=VALUE` (repeatable)")
	fl.StringVar(&jsonOut, "json", "", "write the result as JSON to `FILE` (default DIR/EXPERIMENT.json)")
	fl.BoolVar(&env.Keep, "keep", false, "leave the testbed up afterwards")
	fl.StringVar(&env.Binary, "host-binary", "", "wheelfs `EXECUTABLE` the hosts run (default: this one; before/after runs of a change with the same experiment code)")
	return cmd
}
