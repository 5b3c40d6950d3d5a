package testbed

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

const stateFile = "testbed.json"

// State is everything the testbed created, kept in DIR/testbed.json and
// written before each resource is made, so that `down` can remove what a
// crashed `up` left behind.
type State struct {
	Dir    string  `json:"dir"`
	Prefix string  `json:"prefix"` // every network namespace name starts with it
	Opts   Options `json:"options"`
	Hosts  []Host  `json:"hosts"`
	Router Host    `json:"router"`
	// Cuts are the site pairs "a,b" whose packets the router drops.
	Cuts []string `json:"cuts,omitempty"`
	// Namespaces lists every namespace name up has started to create.
	Namespaces []string `json:"namespaces"`
	CA         string   `json:"ca"`
	Config     string   `json:"config"` // the members' client addresses, comma-separated
	Up         bool     `json:"up"`     // up finished
}

// prefixFor derives the namespace prefix from the directory, so that two
// testbeds on one machine never share a namespace and `down` finds them
// even without a state file.
func prefixFor(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "wtb" + hex.EncodeToString(sum[:])[:6] + "-"
}

func absDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("missing testbed DIR")
	}
	return filepath.Abs(dir)
}

// Load reads DIR/testbed.json.
func Load(dir string) (*State, error) {
	dir, err := absDir(dir)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no testbed in %s (run 'wheelfs testbed up %s' first)", dir, dir)
	}
	if err != nil {
		return nil, err
	}
	st := &State{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

// Save writes the state atomically.
func (st *State) Save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(st.Dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(st.Dir, stateFile))
}

// Host returns the named host.
func (st *State) Host(name string) (*Host, error) {
	for i := range st.Hosts {
		if st.Hosts[i].Name == name {
			return &st.Hosts[i], nil
		}
	}
	var names []string
	for _, h := range st.Hosts {
		names = append(names, h.Name)
	}
	return nil, fmt.Errorf("no host %q in this testbed (hosts: %s)", name, strings.Join(names, " "))
}

// SiteIndex returns the index of a site name.
func (st *State) SiteIndex(site string) (int, error) {
	if i := slices.Index(st.Opts.Sites, site); i >= 0 {
		return i, nil
	}
	return -1, fmt.Errorf("no site %q in this testbed (sites: %s)", site, strings.Join(st.Opts.Sites, " "))
}

// Mounts returns the mount points of the site's hosts, in host order.
func (st *State) Mounts(site string) []string {
	var out []string
	for _, h := range st.Hosts {
		if h.Site == site && h.Mount != "" {
			out = append(out, h.Mount)
		}
	}
	return out
}

// lockDir serializes testbed commands on one DIR.
func lockDir(dir string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another testbed command is running on %s", dir)
	}
	return func() { f.Close() }, nil
}
