package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/pki"
)

func newStatus(g *globalFlags) *cobra.Command {
	var data, endpoints string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--config ENDPOINTS] [--json]",
		Short: "Show servers and slices of a deployment",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			creds, err := pki.LoadCredentials(filepath.Join(data, "node"))
			if err != nil {
				return fmt.Errorf("credentials: %w (use --data to point at a host's data directory)", err)
			}
			if endpoints == "" {
				b, err := os.ReadFile(deploy.EndpointsFile(data))
				if err != nil {
					return fmt.Errorf("no --config given and no running host in %s: %w", data, err)
				}
				endpoints = strings.TrimSpace(string(b))
			}
			ctx := cmd.Context()
			conf, err := configsvc.Dial(ctx, strings.Split(endpoints, ","), creds.ClientTLS(""),
				configsvc.Options{Logger: g.logger(), RPCTimeout: 5 * time.Second})
			if err != nil {
				return err
			}
			defer conf.Close()
			t, err := conf.Table(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(statusJSON(t))
			}
			printStatus(t)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "data directory holding this host's credentials")
	cmd.Flags().StringVar(&endpoints, "config", "", "configuration service endpoints (default: the local host's)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

type sliceStatus struct {
	Slice    uint32           `json:"slice"`
	Policy   configsvc.Policy `json:"policy"`
	Replicas []string         `json:"replicas"`
	Holder   string           `json:"holder"`
	Epoch    int64            `json:"epoch"`
	Health   []string         `json:"health"`
}

type status struct {
	Revision int64                  `json:"revision"`
	Servers  []configsvc.ServerInfo `json:"servers"`
	Slices   []sliceStatus          `json:"slices"`
}

func statusJSON(t *configsvc.Table) status {
	out := status{Revision: t.Revision, Servers: []configsvc.ServerInfo{}, Slices: []sliceStatus{}}
	for _, s := range t.Servers {
		out.Servers = append(out.Servers, s)
	}
	slices.SortFunc(out.Servers, func(a, b configsvc.ServerInfo) int { return strings.Compare(a.ID, b.ID) })
	for id, s := range t.Slices {
		st := sliceStatus{Slice: uint32(id), Policy: s.Policy, Replicas: s.Replicas, Holder: s.Holder, Epoch: s.Epoch, Health: []string{}}
		if s.Holder == "" {
			st.Health = append(st.Health, "unlocked")
		}
		if len(s.Replicas) < s.Policy.RepLevel {
			st.Health = append(st.Health, "under-replicated")
		}
		if len(s.Replicas) > 0 && s.Policy.Site != "" && t.Servers[s.Replicas[0]].Site != s.Policy.Site {
			st.Health = append(st.Health, "misplaced")
		}
		out.Slices = append(out.Slices, st)
	}
	slices.SortFunc(out.Slices, func(a, b sliceStatus) int { return int(a.Slice) - int(b.Slice) })
	return out
}

func printStatus(t *configsvc.Table) {
	s := statusJSON(t)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVER\tSITE\tADDRESS")
	for _, sv := range s.Servers {
		fmt.Fprintf(w, "%s\t%s\t%s\n", sv.ID, sv.Site, sv.Addr)
	}
	fmt.Fprintln(w, "\nSLICE\tSITE\tREPLEVEL\tREPLICAS\tHOLDER\tEPOCH\tHEALTH")
	for _, sl := range s.Slices {
		health := strings.Join(sl.Health, ",")
		if health == "" {
			health = "ok"
		}
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%d\t%s\n", sl.Slice, sl.Policy.Site, sl.Policy.RepLevel,
			strings.Join(sl.Replicas, ","), sl.Holder, sl.Epoch, health)
	}
	w.Flush()
}
