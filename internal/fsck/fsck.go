// Package fsck checks a live WheelFS deployment and repairs what it finds
// (wheelfs fsck): replicas of a slice that disagree at the same stream
// position, directory entries naming missing objects, link counts that
// differ from the entries naming an object, objects no entry names
// (leaked by an interrupted two-step create or a remove in backup mode),
// and copies of slices kept by servers no longer in their replica lists.
//
// It reads every server's copies through the Peer service's fsck RPCs
// (internal/server/fsck.go), which admit only registered servers and the
// CA key's holder. The deployment stays online, so a finding counts only
// if a second scan after Options.Settle shows it again (in-flight
// replication and two-step creates look like damage for a moment).
// Repairs go to the primary concerned, whose update path replicates them
// and revokes leases like any mutation.
package fsck

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Deployment is what fsck needs of a deployment: its slice table and its
// servers' Peer services (Remote).
type Deployment interface {
	Table(ctx context.Context) (*configsvc.Table, error)
	Peer(ctx context.Context, server string) (wire.PeerClient, error)
}

// Options configure a run. Zero fields take the defaults given.
type Options struct {
	// Repair fixes every finding (see Kind for how).
	Repair bool
	// Settle is how long to wait before the scan that confirms findings
	// (default 2 s).
	Settle time.Duration
	// CallTimeout bounds each call to a server (default 30 s).
	CallTimeout time.Duration
	// Young: an object changed (ctime) less than this before the scan is
	// not called leaked, whatever the scans show — a two-step create may
	// be slow to add its name (default 1 minute; negative: no grace).
	// Servers' clocks are compared with this host's.
	Young time.Duration
	// Progress, if set, hears how far the scans are.
	Progress func(Progress)
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Progress is how far a run is: Done of Total steps of Phase ("scan",
// "rescan", "repair").
type Progress struct {
	Phase       string
	Done, Total int
}

// Kind is a kind of damage.
type Kind string

// The kinds of damage, and how each is repaired.
const (
	// ReplicaDiffers: a backup's copy of a slice differs from the
	// primary's at the same stream position. Repair: the primary sends it
	// a snapshot (as anti-entropy would, sooner).
	ReplicaDiffers Kind = "replica-differs"
	// Dangling: an entry names an object that does not exist. Repair: the
	// entry is removed (as rmdir/unlink would, tombstone included).
	Dangling Kind = "dangling-entry"
	// LinkCount: an object's link count differs from the number of
	// entries naming it (2 + subdirectories for a directory), e.g. after
	// links changed in backup mode or a crash in a rename between servers.
	// Repair: the count is set.
	LinkCount Kind = "link-count"
	// Leaked: no entry names the object, which is neither the root nor
	// an orphan kept open. Repair: it is named /lost+found/#<id> (made if
	// missing), never deleted: it may be the only copy of some data.
	Leaked Kind = "leaked-object"
	// StaleCopy: a server keeps a copy of a slice whose replica list does
	// not name it. Repair: the server deletes its copy.
	StaleCopy Kind = "stale-copy"
)

// Finding is one piece of damage.
type Finding struct {
	Kind   Kind   `json:"kind"`
	Slice  uint32 `json:"slice"`
	Server string `json:"server,omitempty"` // replica-differs, stale-copy
	ID     string `json:"id,omitempty"`     // the object (oid.ID form)
	Dir    string `json:"dir,omitempty"`    // dangling-entry
	Name   string `json:"name,omitempty"`   // dangling-entry
	Nlink  uint32 `json:"nlink,omitempty"`  // link-count: stored
	Want   uint32 `json:"want,omitempty"`   // link-count: counted
	Detail string `json:"detail"`
	// Repaired: the repair was applied; RepairError says why not.
	Repaired    bool   `json:"repaired"`
	RepairError string `json:"repair_error,omitempty"`

	id, dir oid.ID
	typ     wire.Type
	version uint64
	differ  []oid.ID // replica-differs: the objects
}

// key identifies a finding across the two scans.
func (f *Finding) key() string {
	return fmt.Sprintf("%s/%d/%s/%v/%v/%s/%d/%d", f.Kind, f.Slice, f.Server, f.id, f.dir, f.Name, f.version, f.Want)
}

// Report is the outcome of a run.
type Report struct {
	Servers  int       `json:"servers"`
	Slices   int       `json:"slices"`
	Objects  int       `json:"objects"`
	Entries  int       `json:"entries"`
	Findings []Finding `json:"findings"`
	// Errors are the calls that failed (an unreachable server, refused
	// credentials): what they would have read is not checked.
	Errors []string `json:"errors"`
	// Unchecked says what was left unjudged, and why (replicas that kept
	// moving, unreconciled eventual changes, objects too young).
	Unchecked []string `json:"unchecked"`
	Repair    bool     `json:"repair"`
}

// Unrepaired counts the findings left as they were.
func (r *Report) Unrepaired() int {
	n := 0
	for _, f := range r.Findings {
		if !f.Repaired {
			n++
		}
	}
	return n
}

// Check scans deployment d and, with opts.Repair, repairs what it finds.
// An error means the run could not be made (no slice table); servers that
// cannot be reached are listed in Report.Unchecked.
func Check(ctx context.Context, d Deployment, opts Options) (*Report, error) {
	if opts.Settle <= 0 {
		opts.Settle = 2 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Young == 0 {
		opts.Young = time.Minute
	}
	r := &run{d: d, opts: opts, log: opts.Logger.With("component", "fsck")}
	first, err := r.scan(ctx, "scan")
	if err != nil {
		return nil, err
	}
	found := analyze(first)
	rep := &Report{Repair: opts.Repair, Findings: []Finding{}}
	final := first
	if len(found) > 0 {
		select {
		case <-time.After(opts.Settle):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		second, err := r.scan(ctx, "rescan")
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, f := range found {
			seen[f.key()] = true
		}
		var again []Finding
		for _, f := range analyze(second) {
			if seen[f.key()] {
				again = append(again, f)
			}
		}
		found, final = again, second
	}
	rep.Servers, rep.Slices = len(final.table.Servers), len(final.table.Slices)
	rep.Unchecked = append([]string{}, final.unchecked...)
	rep.Errors = append([]string{}, final.errors...)
	for _, l := range final.auth {
		rep.Objects += len(l.objs)
		for _, o := range l.objs {
			rep.Entries += len(o.Entries)
		}
	}
	if opts.Repair {
		r.repair(ctx, final, found)
	}
	rep.Findings = append(rep.Findings, found...)
	return rep, nil
}

// run is one fsck run.
type run struct {
	d    Deployment
	opts Options
	log  *slog.Logger
}

// listing is one server's copy of one slice.
type listing struct {
	server string
	objs   []*wire.FsckObject // in ID order
	byID   map[oid.ID]*wire.FsckObject
	epoch  int64
	seq    uint64
	// stable: every page was read at the same stream position.
	stable   bool
	diverged bool
}

// scanned is what one scan read.
type scanned struct {
	table *configsvc.Table
	// lists holds every replica's listing of every slice.
	lists map[oid.Slice]map[string]*listing
	// auth is each slice's listing the namespace is checked against: the
	// lock holder's, else the first replica's that answered.
	auth map[oid.Slice]*listing
	// held is which slices each reachable server keeps a copy of.
	held      map[string][]oid.Slice
	errors    []string
	unchecked []string
	// young: objects changed after this (ns) are not called leaked.
	young int64
}

func (r *run) progress(phase string, done, total int) {
	if r.opts.Progress != nil {
		r.opts.Progress(Progress{Phase: phase, Done: done, Total: total})
	}
}

// scan reads the slice table, which slices every server keeps, and every
// replica's copy of every slice.
func (r *run) scan(ctx context.Context, phase string) (*scanned, error) {
	tctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	t, err := r.d.Table(tctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("fsck: read the slice table: %w", err)
	}
	sc := &scanned{table: t, lists: map[oid.Slice]map[string]*listing{}, auth: map[oid.Slice]*listing{},
		held: map[string][]oid.Slice{}, young: time.Now().Add(-r.opts.Young).UnixNano()}
	servers := make([]string, 0, len(t.Servers))
	for id := range t.Servers {
		servers = append(servers, id)
	}
	slices.Sort(servers)
	ids := make([]oid.Slice, 0, len(t.Slices))
	total := len(servers)
	for id, e := range t.Slices {
		ids = append(ids, id)
		total += len(replicasOf(e))
	}
	slices.Sort(ids)
	done := 0
	r.progress(phase, done, total)
	for _, sv := range servers {
		held, err := r.heldSlices(ctx, sv)
		if err != nil {
			sc.errors = append(sc.errors, fmt.Sprintf("server %s: which slices it keeps: %v", sv, err))
		} else {
			sc.held[sv] = held
		}
		done++
		r.progress(phase, done, total)
	}
	for _, id := range ids {
		e := t.Slices[id]
		sc.lists[id] = map[string]*listing{}
		for _, sv := range replicasOf(e) {
			if _, ok := t.Servers[sv]; !ok {
				sc.errors = append(sc.errors, fmt.Sprintf("slice %d at %s: server not registered", id, sv))
			} else if l, err := r.list(ctx, sv, id); err != nil {
				sc.errors = append(sc.errors, fmt.Sprintf("slice %d at %s: %v", id, sv, err))
			} else {
				sc.lists[id][sv] = l
			}
			done++
			r.progress(phase, done, total)
		}
		if l := sc.lists[id][e.Holder]; l != nil {
			sc.auth[id] = l
			continue
		}
		for _, sv := range e.Replicas {
			if l := sc.lists[id][sv]; l != nil {
				sc.auth[id] = l
				break
			}
		}
	}
	return sc, nil
}

// replicasOf lists a slice's replicas and its lock holder if not among them.
func replicasOf(e configsvc.Slice) []string {
	out := slices.Clone(e.Replicas)
	if e.Holder != "" && !slices.Contains(out, e.Holder) {
		out = append(out, e.Holder)
	}
	return out
}

func (r *run) heldSlices(ctx context.Context, sv string) ([]oid.Slice, error) {
	p, err := r.d.Peer(ctx, sv)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	resp, err := p.FsckSlices(cctx, &wire.FsckSlicesRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]oid.Slice, len(resp.Slices))
	for i, s := range resp.Slices {
		out[i] = oid.Slice(s)
	}
	return out, nil
}

// list reads server sv's copy of slice sl, page by page.
func (r *run) list(ctx context.Context, sv string, sl oid.Slice) (*listing, error) {
	p, err := r.d.Peer(ctx, sv)
	if err != nil {
		return nil, err
	}
	l := &listing{server: sv, byID: map[oid.ID]*wire.FsckObject{}, stable: true}
	req := &wire.FsckListRequest{Slice: uint32(sl)}
	for first := true; ; first = false {
		cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
		resp, err := p.FsckList(cctx, req)
		cancel()
		if err != nil {
			return nil, err
		}
		if first {
			l.epoch, l.seq = resp.Epoch, resp.Seq
		} else if resp.Epoch != l.epoch || resp.Seq != l.seq {
			l.stable = false
		}
		l.diverged = l.diverged || resp.Diverged
		for _, o := range resp.Objects {
			id := oid.ID(o.Id)
			if prev := l.byID[id]; prev != nil { // the rest of a directory
				prev.Entries = append(prev.Entries, o.Entries...)
				continue
			}
			l.byID[id] = o
			l.objs = append(l.objs, o)
		}
		if resp.Eof {
			return l, nil
		}
		if resp.NextId == req.AfterId && resp.NextName == req.AfterName {
			return nil, fmt.Errorf("fsck: listing of slice %d at %s does not advance", sl, sv)
		}
		req.AfterId, req.AfterName = resp.NextId, resp.NextName
	}
}

// analyze finds the damage one scan shows.
func analyze(sc *scanned) []Finding {
	var out []Finding
	out = append(out, replicaFindings(sc)...)
	out = append(out, namespaceFindings(sc)...)
	out = append(out, staleCopies(sc)...)
	return out
}

// replicaFindings compares every backup's copy with the primary's, when
// both were read at one stream position and the backup has no eventual
// changes waiting to be reconciled (which legitimately differ).
func replicaFindings(sc *scanned) []Finding {
	var out []Finding
	for _, id := range sortedSlices(sc.lists) {
		e := sc.table.Slices[id]
		a := sc.lists[id][e.Holder]
		if a == nil {
			if len(sc.lists[id]) > 1 {
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("slice %d: replicas not compared (no primary answered)", id))
			}
			continue
		}
		for _, sv := range e.Replicas {
			b := sc.lists[id][sv]
			if b == nil || sv == e.Holder {
				continue
			}
			if b.diverged || a.diverged {
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("slice %d at %s: eventual changes not yet reconciled", id, sv))
				continue
			}
			if !a.stable || !b.stable || a.epoch != b.epoch || a.seq != b.seq {
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("slice %d at %s: not compared (position %d/%d, primary's %d/%d)",
					id, sv, b.epoch, b.seq, a.epoch, a.seq))
				continue
			}
			var differ []oid.ID
			for _, o := range a.objs {
				p := b.byID[oid.ID(o.Id)]
				if p == nil || p.Version != o.Version || p.Sum != o.Sum || !sameEntries(o.Entries, p.Entries) {
					differ = append(differ, oid.ID(o.Id))
				}
			}
			for _, o := range b.objs {
				if a.byID[oid.ID(o.Id)] == nil {
					differ = append(differ, oid.ID(o.Id))
				}
			}
			if len(differ) == 0 {
				continue
			}
			slices.Sort(differ)
			out = append(out, Finding{Kind: ReplicaDiffers, Slice: uint32(id), Server: sv,
				Detail: fmt.Sprintf("%d objects differ from the primary %s's at position %d/%d (first %v)",
					len(differ), e.Holder, a.epoch, a.seq, differ[0]),
				differ: differ})
		}
	}
	return out
}

func sameEntries(a, b []*wire.Entry) bool {
	return slices.EqualFunc(a, b, func(x, y *wire.Entry) bool {
		return x.Name == y.Name && x.Id == y.Id && x.Type == y.Type && x.Version == y.Version
	})
}

// namespaceFindings checks the namespace against the authoritative
// listings: dangling entries, link counts, leaked objects. Without a
// listing of every slice it checks nothing: an object of an unread slice
// might be the one naming another.
func namespaceFindings(sc *scanned) []Finding {
	for id := range sc.table.Slices {
		if sc.auth[id] == nil {
			sc.unchecked = append(sc.unchecked, fmt.Sprintf("namespace not checked: no copy of slice %d could be read", id))
			return nil
		}
	}
	type ref struct {
		dir  oid.ID
		name string
	}
	refs := map[oid.ID][]ref{}
	var out []Finding
	exists := func(id oid.ID) bool {
		l := sc.auth[id.Slice()]
		return l != nil && l.byID[id] != nil
	}
	for _, sl := range sortedSlices(sc.auth) {
		for _, d := range sc.auth[sl].objs {
			for _, e := range d.Entries {
				id := oid.ID(e.Id)
				if exists(id) {
					refs[id] = append(refs[id], ref{oid.ID(d.Id), e.Name})
					continue
				}
				out = append(out, Finding{Kind: Dangling, Slice: uint32(oid.ID(d.Id).Slice()), ID: id.String(),
					Dir: oid.ID(d.Id).String(), Name: e.Name,
					Detail: fmt.Sprintf("entry %q of %v names %v, which does not exist", e.Name, oid.ID(d.Id), id),
					id:     id, dir: oid.ID(d.Id), typ: e.Type})
			}
		}
	}
	// An object named only in some backup's copy (a create in backup mode
	// not yet reconciled) is not leaked.
	elsewhere := map[oid.ID]bool{}
	for _, ls := range sc.lists {
		for _, l := range ls {
			for _, d := range l.objs {
				for _, e := range d.Entries {
					elsewhere[oid.ID(e.Id)] = true
				}
			}
		}
	}
	for _, sl := range sortedSlices(sc.auth) {
		for _, o := range sc.auth[sl].objs {
			id := oid.ID(o.Id)
			n := len(refs[id])
			want := uint32(n)
			if o.Type == wire.Type_TYPE_DIR {
				want = 2 + subdirs(o)
			}
			switch {
			case id == oid.Root:
			case n == 0 && o.Orphan:
				continue // unlinked while open
			case n == 0 && elsewhere[id]:
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("object %v: named only in a backup's unreconciled copy", id))
				continue
			case n == 0 && o.CtimeNs > sc.young:
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("object %v: named by no entry, but changed too recently to call it leaked", id))
				continue
			case n == 0:
				nl := want
				if o.Type != wire.Type_TYPE_DIR {
					nl = 1
				}
				out = append(out, Finding{Kind: Leaked, Slice: uint32(sl), ID: id.String(), Nlink: o.Nlink, Want: nl,
					Detail: fmt.Sprintf("%s %v (link count %d) is named by no entry", typeName(o.Type), id, o.Nlink),
					id:     id, typ: o.Type, version: o.Version})
				continue
			case o.Type == wire.Type_TYPE_DIR && n > 1:
				// Not repaired: which name to keep is a person's choice.
				sc.unchecked = append(sc.unchecked, fmt.Sprintf("directory %v is named %d times", id, n))
			}
			if o.Nlink != want {
				out = append(out, Finding{Kind: LinkCount, Slice: uint32(sl), ID: id.String(), Nlink: o.Nlink, Want: want,
					Detail: fmt.Sprintf("%s %v has link count %d, named by %d entries", typeName(o.Type), id, o.Nlink, n),
					id:     id, typ: o.Type, version: o.Version})
			}
		}
	}
	return out
}

// subdirs counts a directory's entries that name directories (".." of
// each counts a link), dangling ones included: dropping one decrements
// the count as rmdir would.
func subdirs(o *wire.FsckObject) uint32 {
	n := uint32(0)
	for _, e := range o.Entries {
		if e.Type == wire.Type_TYPE_DIR {
			n++
		}
	}
	return n
}

// staleCopies finds copies of slices kept by servers not in their
// replica lists.
func staleCopies(sc *scanned) []Finding {
	var out []Finding
	servers := make([]string, 0, len(sc.held))
	for sv := range sc.held {
		servers = append(servers, sv)
	}
	slices.Sort(servers)
	for _, sv := range servers {
		for _, sl := range sc.held[sv] {
			e, ok := sc.table.Slices[sl]
			if ok && (slices.Contains(e.Replicas, sv) || e.Holder == sv) {
				continue
			}
			detail := fmt.Sprintf("server %s keeps a copy of slice %d; its replicas are %v", sv, sl, e.Replicas)
			if !ok {
				detail = fmt.Sprintf("server %s keeps a copy of slice %d, which is not in the slice table", sv, sl)
			}
			out = append(out, Finding{Kind: StaleCopy, Slice: uint32(sl), Server: sv, Detail: detail})
		}
	}
	return out
}

func sortedSlices[V any](m map[oid.Slice]V) []oid.Slice {
	out := make([]oid.Slice, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func typeName(t wire.Type) string {
	switch t {
	case wire.Type_TYPE_DIR:
		return "directory"
	case wire.Type_TYPE_SYMLINK:
		return "symlink"
	case wire.Type_TYPE_FILE:
		return "file"
	}
	return "object"
}
