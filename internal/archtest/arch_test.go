package archtest

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/wheelfs/wheelfs"

type pkg struct {
	ImportPath  string
	Doc         string
	Imports     []string
	TestImports []string
	Deps        []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "-deps=false", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestEveryPackageIsDocumented(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

// TestDependencyDirection checks the boundaries of docs/ARCHITECTURE.md.
func TestDependencyDirection(t *testing.T) {
	rules := []struct {
		dep     string // import path prefix
		allowed []string
		direct  bool // check direct imports only
	}{
		// Only the FUSE adapter speaks FUSE (and the bench's loopback, the
		// comparator); the client core must not even depend on it
		// transitively.
		{dep: "github.com/hanwen/go-fuse", allowed: []string{module + "/internal/fusefs", module + "/internal/loopbackfs", module + "/internal/cli", module + "/internal/cluster", module + "/cmd/wheelfs", module + "/test/"}},
		// Only the embedded member starts an etcd server.
		{dep: "go.etcd.io/etcd/server", allowed: []string{module + "/internal/configsvc/embedded", module + "/internal/deploy", module + "/internal/deploy/", module + "/internal/cli", module + "/internal/cluster", module + "/cmd/wheelfs", module + "/test/"}},
	}
	for _, p := range listPackages(t) {
		for _, r := range rules {
			if allowedPkg(p.ImportPath, r.allowed) {
				continue
			}
			for _, d := range p.Deps {
				if strings.HasPrefix(d, r.dep) {
					t.Errorf("%s depends on %s", p.ImportPath, d)
					break
				}
			}
		}
		// The FUSE adapter speaks the client core's types (client.Attr,
		// client.Entry), never the storage protocol's: errno mapping and
		// attributes stay at the edge, the wire format behind the core.
		if p.ImportPath == module+"/internal/fusefs" {
			for _, d := range append(p.Imports, p.TestImports...) {
				if d == module+"/internal/wire" {
					t.Errorf("internal/fusefs imports %s; use the client core's types", d)
				}
			}
		}
		// The wire types import nothing internal.
		if p.ImportPath == module+"/internal/wire" {
			for _, d := range p.Imports {
				if strings.HasPrefix(d, module) {
					t.Errorf("internal/wire imports %s", d)
				}
			}
		}
	}
}

func allowedPkg(path string, allowed []string) bool {
	for _, a := range allowed {
		if path == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(path, a)) {
			return true
		}
	}
	return false
}
