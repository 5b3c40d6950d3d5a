package history

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func op(client int, call, ret int64, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func TestModel(t *testing.T) {
	d := "d"
	tests := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"put then lookup and read", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Write, Obj: 7, Token: "a"}, Output{}),
			op(0, 2, 3, Input{Kind: Put, Dir: d, Name: "f", Obj: 7}, Output{}),
			op(1, 4, 5, Input{Kind: Lookup, Dir: d, Name: "f"}, Output{Obj: 7}),
			op(1, 6, 7, Input{Kind: Read, Obj: 7}, Output{Token: "a"}),
			op(1, 8, 9, Input{Kind: ReadDir, Dir: d}, Output{Names: []string{"f"}}),
		}, porcupine.Ok},
		{"stale read after a completed write", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Write, Obj: 7, Token: "a"}, Output{}),
			op(0, 2, 3, Input{Kind: Write, Obj: 7, Token: "b"}, Output{}),
			op(1, 4, 5, Input{Kind: Read, Obj: 7}, Output{Token: "a"}),
		}, porcupine.Illegal},
		{"concurrent write may be seen or not", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Write, Obj: 7, Token: "a"}, Output{}),
			op(0, 2, 10, Input{Kind: Write, Obj: 7, Token: "b"}, Output{}),
			op(1, 3, 4, Input{Kind: Read, Obj: 7}, Output{Token: "b"}),
			op(2, 5, 6, Input{Kind: Read, Obj: 7}, Output{Token: "b"}),
		}, porcupine.Ok},
		{"a name that reappears after its unlink returned", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: d, Name: "f", Obj: 7}, Output{}),
			op(0, 2, 3, Input{Kind: Unlink, Dir: d, Name: "f"}, Output{Found: true}),
			op(1, 4, 5, Input{Kind: Lookup, Dir: d, Name: "f"}, Output{Obj: 7}),
		}, porcupine.Illegal},
		{"an unknown unlink may have happened", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: d, Name: "f", Obj: 7}, Output{}),
			op(3, 2, math.MaxInt64, Input{Kind: Unlink, Dir: d, Name: "f"}, Output{Unknown: true}),
			op(1, 4, 5, Input{Kind: Lookup, Dir: d, Name: "f"}, Output{Obj: 7}),
			op(1, 6, 7, Input{Kind: Lookup, Dir: d, Name: "f"}, Output{}),
			op(1, 8, 9, Input{Kind: Unlink, Dir: d, Name: "f"}, Output{Found: false}),
		}, porcupine.Ok},
		{"ENOENT from a rename that happened", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: d, Name: "a", Obj: 7}, Output{}),
			op(0, 2, 3, Input{Kind: Rename, Dir: d, Name: "a", To: "b"}, Output{}),
			op(1, 4, 5, Input{Kind: Lookup, Dir: d, Name: "b"}, Output{Obj: 7}),
		}, porcupine.Illegal},
		{"rename moves the object", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: d, Name: "a", Obj: 7}, Output{}),
			op(0, 2, 3, Input{Kind: Put, Dir: d, Name: "b", Obj: 8}, Output{}),
			op(0, 4, 5, Input{Kind: Rename, Dir: d, Name: "a", To: "b"}, Output{Found: true}),
			op(1, 6, 7, Input{Kind: ReadDir, Dir: d}, Output{Names: []string{"b"}}),
			op(1, 8, 9, Input{Kind: Lookup, Dir: d, Name: "b"}, Output{Obj: 7}),
			op(1, 10, 11, Input{Kind: Rename, Dir: d, Name: "a", To: "c"}, Output{Found: false}),
		}, porcupine.Ok},
		{"readdir missing a renamed name", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: d, Name: "a", Obj: 7}, Output{}),
			op(0, 4, 5, Input{Kind: Rename, Dir: d, Name: "a", To: "b"}, Output{Found: true}),
			op(1, 6, 7, Input{Kind: ReadDir, Dir: d}, Output{Names: []string{"a"}}),
		}, porcupine.Illegal},
		{"directories are independent", []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Put, Dir: "x", Name: "a", Obj: 7}, Output{}),
			op(1, 2, 3, Input{Kind: Lookup, Dir: "y", Name: "a"}, Output{}),
		}, porcupine.Ok},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Check(tt.ops, 10*time.Second)
			if rep.Result != tt.want {
				t.Fatalf("got %s, want %s", rep.Summary(), tt.want)
			}
			if tt.want == porcupine.Illegal {
				if err := rep.Visualize(t.TempDir() + "/h.html"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(2)
	r.Begin(0, Input{Kind: Write, Obj: 1, Token: "a"}).End(Output{})
	r.Begin(0, Input{Kind: Put, Dir: "d", Name: "b", Obj: 1}).End(Output{})
	r.Begin(0, Input{Kind: Put, Dir: "d", Name: "a", Obj: 1}).End(Output{})
	r.Begin(1, Input{Kind: Unlink, Dir: "d", Name: "f"}).Unknown()
	r.Begin(1, Input{Kind: Read, Obj: 1}).Drop()
	r.Begin(1, Input{Kind: ReadDir, Dir: "d"}).End(Output{Names: []string{"b", "a"}})
	ops := r.Operations()
	if len(ops) != 5 {
		t.Fatalf("%d operations, want 5", len(ops))
	}
	ops = ops[2:]
	if total, unknown := r.Counts(); total != 5 || unknown != 1 {
		t.Fatalf("counts %d, %d", total, unknown)
	}
	if ops[1].ClientId != 2 || ops[1].Return <= ops[2].Return {
		t.Errorf("unknown step: client %d return %d, want a fresh client and the last return", ops[1].ClientId, ops[1].Return)
	}
	if out := ops[1].Output.(Output); !out.Unknown {
		t.Errorf("unknown unlink recorded as %+v", out)
	}
	if got := ops[2].Output.(Output).Names; got[0] != "a" || got[1] != "b" {
		t.Errorf("readdir names not sorted: %v", got)
	}
	if rep := Check(r.Operations(), time.Second); rep.Result != porcupine.Ok {
		t.Errorf("%s", rep.Summary())
	}
}

func TestExplain(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 0, 1, Input{Kind: Put, Dir: "d", Name: "f", Obj: 7}, Output{}),
		op(0, 2, 3, Input{Kind: Unlink, Dir: "d", Name: "f"}, Output{Found: true}),
		op(1, 4, 5, Input{Kind: Lookup, Dir: "d", Name: "f"}, Output{Obj: 7}),
	}
	rep := Check(ops, time.Second)
	if rep.Result != porcupine.Illegal || len(rep.Failing) != 1 || rep.Failing[0] != "dir d" {
		t.Fatalf("%s, failing %v", rep.Summary(), rep.Failing)
	}
	got := rep.Explain("dir d", 10)
	if !strings.Contains(got, "cannot place: lookup(d/f) → 7") {
		t.Errorf("explanation:\n%s", got)
	}
}
