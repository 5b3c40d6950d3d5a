package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fsck"
)

// Exit statuses as fsck(8)'s: damage found and not repaired ("errors
// left uncorrected"); some servers could not be read ("operational
// error"), so a clean report is not the whole deployment's.
const (
	fsckDamageLeft = 4
	fsckIncomplete = 8
)

func newFsck(g *globalFlags) *cobra.Command {
	var data, config, etcd, caDir, nodeDir string
	var repair, asJSON bool
	var timeout, settle, young time.Duration
	cmd := &cobra.Command{
		Use:   "fsck [--repair] [--json]",
		Short: "Check a live deployment's replicas and namespace, and repair them",
		Long: `Check a live deployment: replicas of every slice agree; every object is
named by as many entries as its link count says; no entry names a missing
object; no object is named by no entry (leaked by an interrupted two-step
create or a remove in backup mode); no server keeps a copy of a slice whose
replica list does not name it. A finding counts only if a second scan, a
moment later, shows it again (the deployment stays online).

--repair fixes each: a differing backup gets a snapshot from its primary;
link counts are set; dangling entries are removed; leaked objects are named
/lost+found/#<id> (never deleted); stale copies are deleted. Repairs go
through the primaries' update path, so they replicate like any change.

Credentials as for 'wheelfs status': --ca (the CA key's holder), --node-dir
or --data of a server host; a client node's are refused. Progress goes to
stderr, the report to stdout (--json: machine-readable). Exit status 0:
clean or all repaired; 4: damage left; 8: some servers could not be read;
1: fsck could not run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			creds, cleanup, err := statusCredentials(data, caDir, nodeDir)
			if err != nil {
				return err
			}
			defer cleanup()
			warnExpiry(cmd.ErrOrStderr(), creds, time.Now())
			endpoints, err := configEndpoints(data, config, etcd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
			conf, err := configsvc.Dial(dctx, endpoints, creds.ClientTLS(""),
				configsvc.Options{Logger: g.logger(), RPCTimeout: 10 * time.Second, OneShot: true})
			dcancel()
			if err != nil {
				return err
			}
			defer conf.Close()
			remote := fsck.NewRemote(retryTables{conf}, creds, nil)
			defer remote.Close()
			bar := newProgressLine(cmd.ErrOrStderr())
			rep, err := fsck.Check(ctx, remote, fsck.Options{Repair: repair, Settle: settle, Young: young,
				Progress: bar.show, Logger: g.logger()})
			bar.done()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else if err := renderFsck(cmd.OutOrStdout(), rep); err != nil {
				return err
			}
			if n := rep.Unrepaired(); n > 0 {
				return exitError{code: fsckDamageLeft, err: fmt.Errorf("%d findings not repaired", n)}
			}
			if len(rep.Errors) > 0 {
				return exitError{code: fsckIncomplete, err: fmt.Errorf("%d calls to servers failed: not everything was checked", len(rep.Errors))}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&repair, "repair", false, "repair what is found")
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fl.StringVar(&data, "data", "", "data `DIR` of a host on this machine (credentials, and endpoints without --config)")
	fl.StringVar(&config, "config", "", "configuration service: comma-separated HOST:PORT of config members")
	fl.StringVar(&etcd, "etcd", "", "endpoints of an existing etcd (instead of --config)")
	fl.StringVar(&caDir, "ca", "", "deployment CA `DIR`: act as the deployment's administrator with an in-memory certificate from it")
	fl.StringVar(&nodeDir, "node-dir", "", "node credentials `DIR` to authenticate with (a server's)")
	fl.DurationVar(&timeout, "timeout", time.Hour, "give up after this long")
	fl.DurationVar(&settle, "settle", 2*time.Second, "wait this long before the scan that confirms findings")
	fl.DurationVar(&young, "young", time.Minute, "an object changed more recently than this is never called leaked (a create may still be adding its name)")
	return cmd
}

// retryTables reads the slice table through a leader election (members
// joining fail reads for a moment), within the caller's deadline.
type retryTables struct{ conf configsvc.Service }

func (r retryTables) Table(ctx context.Context) (t *configsvc.Table, err error) {
	err = retryUntil(ctx, func() (err error) {
		t, err = r.conf.Table(ctx)
		return err
	})
	return t, err
}

// renderFsck prints the report for people.
func renderFsck(w io.Writer, rep *fsck.Report) error {
	fmt.Fprintf(w, "checked %d servers, %d slices, %d objects, %d entries\n",
		rep.Servers, rep.Slices, rep.Objects, rep.Entries)
	if len(rep.Findings) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "\nKIND\tSLICE\tSTATE\tDETAIL")
		for _, f := range rep.Findings {
			state := "found"
			switch {
			case f.Repaired:
				state = "repaired"
			case f.RepairError != "":
				state = "not repaired: " + f.RepairError
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", f.Kind, f.Slice, state, f.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintln(w, "\nfailed (not checked):")
		for _, u := range rep.Errors {
			fmt.Fprintln(w, "  "+u)
		}
	}
	if len(rep.Unchecked) > 0 {
		fmt.Fprintln(w, "\nnot judged:")
		for _, u := range rep.Unchecked {
			fmt.Fprintln(w, "  "+u)
		}
	}
	n, left := len(rep.Findings), rep.Unrepaired()
	switch {
	case n == 0 && len(rep.Errors) > 0:
		fmt.Fprintln(w, "\nno damage found in what could be read")
	case n == 0:
		fmt.Fprintln(w, "\nclean")
	case left == 0:
		fmt.Fprintf(w, "\n%d findings, all repaired\n", n)
	case rep.Repair:
		fmt.Fprintf(w, "\n%d findings, %d not repaired (run fsck again)\n", n, left)
	default:
		fmt.Fprintf(w, "\n%d findings (repair with --repair)\n", n)
	}
	return nil
}

// progressLine shows fsck's progress on stderr: one line redrawn in
// place on a terminal, else a line every few seconds and at each
// phase's end.
type progressLine struct {
	w     io.Writer
	tty   bool
	last  time.Time
	shown bool
}

func newProgressLine(w io.Writer) *progressLine {
	p := &progressLine{w: w}
	if f, ok := w.(*os.File); ok {
		st, err := f.Stat()
		p.tty = err == nil && st.Mode()&os.ModeCharDevice != 0
	}
	return p
}

func (p *progressLine) show(pr fsck.Progress) {
	end := pr.Done == pr.Total
	if !p.tty && !end && time.Since(p.last) < 5*time.Second {
		return
	}
	p.last = time.Now()
	const width = 30
	filled := width
	if pr.Total > 0 {
		filled = width * pr.Done / pr.Total
	}
	line := fmt.Sprintf("fsck: %-7s [%s%s] %d/%d", pr.Phase, strings.Repeat("#", filled),
		strings.Repeat(".", width-filled), pr.Done, pr.Total)
	if p.tty {
		fmt.Fprint(p.w, "\r"+line+"\x1b[K")
		p.shown = true
		return
	}
	fmt.Fprintln(p.w, line)
}

// done ends the redrawn line.
func (p *progressLine) done() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}
