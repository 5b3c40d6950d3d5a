// Package history records the operations concurrent clients perform on a
// WheelFS namespace and checks the recorded history for linearizability
// with porcupine (DESIGN.md, principle 6) against a close-to-open model.
//
// The model. Each directory is a map name → object ID; each file object
// is a register holding one contents token. A client operation on a path
// is a composition of steps that are each atomic in WheelFS, so the
// recorder logs each step as its own operation on one object:
//
//	get(name)       = Lookup(dir, name) → obj | absent,  then Read(obj) → token
//	overwrite(name) = Lookup(dir, name) → obj,           then Write(obj, token)   (commit at close)
//	put(name)       = create tmp obj, Write(obj, token) at its close, then Put(dir, name, obj) (the rename over name)
//	unlink(name)    = Unlink(dir, name) → ok | ENOENT
//	rename(a, b)    = Rename(dir, a, b) → ok | ENOENT     (same directory)
//	readdir(dir)    = ReadDir(dir) → sorted names
//
// Every operation touches one object (a directory's name map or a file's
// contents), so linearizability being a local property, the checker
// partitions the history per directory and per file object and checks each
// partition on its own: the history is linearizable if and only if every
// partition is.
//
// Unknown outcomes. A mutation that fails other than with a definite
// answer (a timeout, an unreachable primary, EIO during a fault) may or may
// not have taken effect; it is recorded with Output.Unknown and a return
// time after every other operation, so porcupine may place it anywhere
// after its call, or effectively never. An observation that fails (a read
// or lookup that timed out) changes nothing and is dropped. A step that
// failed before it could change anything (an open that failed before the
// commit) is dropped too.
//
// Temporary names (those with TempPrefix) are the recorder's own business
// (put writes its new contents under one) and are left out of ReadDir
// results by the caller.
package history

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// TempPrefix starts the names of temporary files, which the model ignores.
const TempPrefix = "tmp."

// Kind is the kind of a recorded step.
type Kind uint8

const (
	// Lookup observes which object a name maps to (Output.Obj, 0: absent).
	Lookup Kind = iota + 1
	// Put makes Name map to Obj (a rename of a temporary name over Name).
	Put
	// Unlink removes Name (Output.Found false: it reported ENOENT).
	Unlink
	// Rename moves Name to To (Output.Found false: it reported ENOENT).
	Rename
	// ReadDir observes the set of names (Output.Names, sorted).
	ReadDir
	// Write sets object Obj's contents to Token (one commit).
	Write
	// Read observes object Obj's contents (Output.Token).
	Read
)

var kindNames = [...]string{Lookup: "lookup", Put: "put", Unlink: "unlink", Rename: "rename",
	ReadDir: "readdir", Write: "write", Read: "read"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Input describes a step: on directory Dir for namespace steps, on file
// object Obj for Read and Write.
type Input struct {
	Kind  Kind
	Dir   string
	Name  string
	To    string // Rename's new name
	Obj   uint64 // Put's object; Read's and Write's object
	Token string // Write's contents
}

// Output is a step's outcome.
type Output struct {
	// Unknown: the step may or may not have taken effect.
	Unknown bool
	// Found is false when Unlink or Rename reported ENOENT (a retry of a
	// step that took effect answers as its first attempt did: the
	// servers execute mutations exactly once, server/once.go).
	Found bool
	Obj   uint64   // Lookup's result, 0 when absent
	Token string   // Read's result
	Names []string // ReadDir's result, sorted
}

// Recorder collects steps from concurrent clients. Its methods are safe
// for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	start   time.Time
	ops     []porcupine.Operation
	clients int // next client ID for an abandoned (unknown) step
	now     func() time.Time
}

// NewRecorder returns an empty recorder; clients number themselves from 0
// to nclients-1.
func NewRecorder(nclients int) *Recorder {
	return &Recorder{start: time.Now(), clients: nclients, now: time.Now}
}

// Step is one step in progress, begun by Begin and finished by exactly one
// of End, Unknown or Drop.
type Step struct {
	r      *Recorder
	client int
	in     Input
	call   int64
}

// Begin records the invocation of a step by client.
func (r *Recorder) Begin(client int, in Input) *Step {
	if in.Kind == ReadDir {
		in.Name = ""
	}
	return &Step{r: r, client: client, in: in, call: r.stamp()}
}

func (r *Recorder) stamp() int64 { return int64(r.now().Sub(r.start)) }

// End records the step's definite outcome.
func (s *Step) End(out Output) {
	if s.in.Kind == ReadDir {
		out.Names = slices.Clone(out.Names)
		sort.Strings(out.Names)
	}
	ret := s.r.stamp()
	if ret <= s.call {
		ret = s.call + 1
	}
	s.r.add(porcupine.Operation{ClientId: s.client, Input: s.in, Call: s.call, Output: out, Return: ret})
}

// Unknown records that the step's outcome is unknown: it may or may not
// have happened. Its client is considered gone (as a crashed process in
// Jepsen's terms), so the step gets a client ID of its own; the caller
// keeps using its ID for its next steps.
func (s *Step) Unknown() {
	s.r.mu.Lock()
	id := s.r.clients
	s.r.clients++
	s.r.ops = append(s.r.ops, porcupine.Operation{ClientId: id, Input: s.in, Call: s.call,
		Output: Output{Unknown: true}, Return: math.MaxInt64})
	s.r.mu.Unlock()
}

// Drop forgets a step that certainly had no effect (a failed observation,
// or a mutation that failed before it could be sent).
func (s *Step) Drop() {}

func (r *Recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Operations returns a copy of the recorded history; unknown steps return
// one nanosecond after the last known event, so that visualizations stay
// readable.
func (r *Recorder) Operations() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := slices.Clone(r.ops)
	var last int64
	for _, op := range ops {
		if op.Return != math.MaxInt64 {
			last = max(last, op.Return, op.Call)
		}
	}
	for i := range ops {
		if ops[i].Return == math.MaxInt64 {
			ops[i].Return = last + 1
		}
	}
	return ops
}

// Counts reports how many steps were recorded, and how many of them have an
// unknown outcome.
func (r *Recorder) Counts() (total, unknown int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.ops {
		if op.Output.(Output).Unknown {
			unknown++
		}
	}
	return len(r.ops), unknown
}

// state is the model's state, as a canonical string so that states compare
// with == and hash cheaply: a directory's sorted "name=obj" pairs joined by
// "/", or a file object's token.
type state = string

func decodeDir(s state) map[string]uint64 {
	m := map[string]uint64{}
	if s == "" {
		return m
	}
	for _, kv := range strings.Split(s, "/") {
		k, v, _ := strings.Cut(kv, "=")
		var obj uint64
		fmt.Sscan(v, &obj)
		m[k] = obj
	}
	return m
}

func encodeDir(m map[string]uint64) state {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('/')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

func names(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// step is the sequential specification.
func step(st any, input, output any) (bool, any) {
	s, in, out := st.(state), input.(Input), output.(Output)
	switch in.Kind {
	case Write:
		return true, in.Token
	case Read:
		return out.Unknown || out.Token == s, s
	}
	m := decodeDir(s)
	switch in.Kind {
	case Lookup:
		return out.Unknown || m[in.Name] == out.Obj, s
	case ReadDir:
		return out.Unknown || slices.Equal(names(m), out.Names), s
	case Put:
		m[in.Name] = in.Obj
		return true, encodeDir(m)
	case Unlink:
		_, ok := m[in.Name]
		if !ok {
			return out.Unknown || !out.Found, s
		}
		delete(m, in.Name)
		return out.Unknown || out.Found, encodeDir(m)
	case Rename:
		obj, ok := m[in.Name]
		if !ok {
			return out.Unknown || !out.Found, s
		}
		if in.Name != in.To {
			delete(m, in.Name)
			m[in.To] = obj
		}
		return out.Unknown || out.Found, encodeDir(m)
	}
	return false, s
}

// key names the object a step touches: its partition.
func key(in Input) string {
	if in.Kind == Read || in.Kind == Write {
		return fmt.Sprintf("obj %d", in.Obj)
	}
	return "dir " + in.Dir
}

func partition(ops []porcupine.Operation) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range ops {
		k := key(op.Input.(Input))
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], op)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}

func describe(input, output any) string {
	in, out := input.(Input), output.(Output)
	res := ""
	switch {
	case out.Unknown:
		res = "?"
	case in.Kind == Lookup && out.Obj == 0:
		res = "absent"
	case in.Kind == Lookup:
		res = fmt.Sprint(out.Obj)
	case in.Kind == Read:
		res = fmt.Sprintf("%q", out.Token)
	case in.Kind == ReadDir:
		res = fmt.Sprint(out.Names)
	case in.Kind == Unlink || in.Kind == Rename:
		res = map[bool]string{true: "ok", false: "ENOENT"}[out.Found]
	default:
		res = "ok"
	}
	switch in.Kind {
	case Lookup, Unlink:
		return fmt.Sprintf("%s(%s/%s) → %s", in.Kind, in.Dir, in.Name, res)
	case Put:
		return fmt.Sprintf("put(%s/%s := %d) → %s", in.Dir, in.Name, in.Obj, res)
	case Rename:
		return fmt.Sprintf("rename(%s/%s → %s) → %s", in.Dir, in.Name, in.To, res)
	case ReadDir:
		return fmt.Sprintf("readdir(%s) → %s", in.Dir, res)
	case Write:
		return fmt.Sprintf("write(%d, %q) → %s", in.Obj, in.Token, res)
	case Read:
		return fmt.Sprintf("read(%d) → %s", in.Obj, res)
	}
	return fmt.Sprint(in, out)
}

// Model is the close-to-open namespace model described in the package
// comment, partitioned per directory and per file object.
var Model = porcupine.Model{
	Partition: partition,
	Init:      func() any { return "" },
	Step:      step,
	Equal:     func(a, b any) bool { return a.(state) == b.(state) },
	Hash: func(s any) uint64 {
		h := fnv.New64a()
		h.Write([]byte(s.(state)))
		return h.Sum64()
	},
	DescribeOperation: describe,
	DescribeState: func(s any) string {
		if s.(state) == "" {
			return "{}"
		}
		return s.(state)
	},
}

// Report summarises one check.
type Report struct {
	Result     porcupine.CheckResult
	Ops        int   // steps checked
	Unknown    int   // of which with an unknown outcome
	Partitions []int // steps per partition (history), sorted
	Took       time.Duration
	Info       porcupine.LinearizationInfo
	// Failing names the partitions that are not linearizable ("dir d0",
	// "obj 4398046511105"), when Result is Illegal.
	Failing []string

	ops []porcupine.Operation
}

// Summary is the report as one line: partitions and their sizes.
func (r Report) Summary() string {
	p := r.Partitions
	if len(p) == 0 {
		return fmt.Sprintf("%s: no operations", r.Result)
	}
	return fmt.Sprintf("%s in %v: %d steps (%d unknown) in %d histories; steps per history min %d, median %d, max %d",
		r.Result, r.Took.Round(time.Millisecond), r.Ops, r.Unknown, len(p), p[0], p[len(p)/2], p[len(p)-1])
}

// Check checks ops against Model within timeout.
func Check(ops []porcupine.Operation, timeout time.Duration) Report {
	rep := Report{Ops: len(ops), ops: ops}
	for _, op := range ops {
		if op.Output.(Output).Unknown {
			rep.Unknown++
		}
	}
	for _, p := range partition(ops) {
		rep.Partitions = append(rep.Partitions, len(p))
	}
	slices.SortFunc(rep.Partitions, cmp.Compare)
	began := time.Now()
	// Verbose only to explain a failure: it also keeps partial
	// linearizations, memory a passing check does not need. (Either way a
	// 15-minute "spread" history outgrows 24 GiB: docs/BENCHMARKS.md,
	// "Linearizability under faults".)
	rep.Result = porcupine.CheckOperationsTimeout(Model, ops, timeout)
	rep.Took = time.Since(began)
	if rep.Result == porcupine.Illegal {
		_, rep.Info = porcupine.CheckOperationsVerbose(Model, ops, timeout)
		one := Model
		one.Partition = nil
		for _, p := range partition(ops) {
			if porcupine.CheckOperationsTimeout(one, p, timeout) == porcupine.Illegal {
				rep.Failing = append(rep.Failing, key(p[0].Input.(Input)))
			}
		}
	}
	return rep
}

// Explain describes a failing partition k of a checked history for a test
// log: the earliest-returning step that porcupine's longest partial
// linearization of k could not include, and every step that overlaps the
// stretch from within before it to its return, one a line.
func (r Report) Explain(k string, within time.Duration) string {
	parts := r.Info.PartialLinearizationsOperations()
	var all []porcupine.Operation
	var longest []porcupine.Operation
	for _, part := range parts {
		if len(part) == 0 || len(part[0]) == 0 || key(part[0][0].Input.(Input)) != k {
			continue
		}
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	type id struct {
		client int
		call   int64
	}
	in := map[id]bool{}
	for _, op := range longest {
		in[id{op.ClientId, op.Call}] = true
	}
	for _, op := range r.ops {
		if key(op.Input.(Input)) == k {
			all = append(all, op)
		}
	}
	var stuck *porcupine.Operation
	for i, op := range all {
		if !in[id{op.ClientId, op.Call}] && (stuck == nil || op.Return < stuck.Return) {
			stuck = &all[i]
		}
	}
	if stuck == nil {
		return "no step left out of the longest partial linearization"
	}
	st := *stuck // the sort below moves what stuck points at
	stuck = &st
	from, to := stuck.Call-int64(within), stuck.Return
	slices.SortStableFunc(all, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	var b strings.Builder
	fmt.Fprintf(&b, "longest partial linearization: %d of %d steps; the first step it cannot place: %s\n",
		len(longest), len(all), describe(stuck.Input, stuck.Output))
	for _, op := range all {
		if op.Call > to || op.Return < from {
			continue
		}
		ret := "?"
		if !op.Output.(Output).Unknown {
			ret = time.Duration(op.Return).Round(time.Microsecond).String()
		}
		mark := " "
		if op.ClientId == stuck.ClientId && op.Call == stuck.Call {
			mark = ">"
		}
		fmt.Fprintf(&b, "%s client %d [%v, %s] %s\n", mark, op.ClientId, time.Duration(op.Call).Round(time.Microsecond), ret,
			describe(op.Input, op.Output))
	}
	return b.String()
}

// Visualize writes porcupine's HTML view of a checked history to path.
func (r Report) Visualize(path string) error {
	return porcupine.VisualizePath(Model, r.Info, path)
}
