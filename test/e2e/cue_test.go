package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// info is the JSON of the user.wheelfs.info xattr and `wheelfs info`.
type info struct {
	ID       string         `json:"id"`
	Slice    *uint32        `json:"slice"`
	Version  *uint64        `json:"version"`
	Primary  map[string]any `json:"primary"`
	Replicas []any          `json:"replicas"`
	Cues     map[string]any `json:"cues"`
}

func parseInfo(t *testing.T, what string, data []byte) info {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", what, err, data)
	}
	for _, k := range []string{"id", "slice", "version", "primary", "replicas", "cues"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("%s: key %q missing in %s", what, k, data)
		}
	}
	var in info
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, data)
	}
	return in
}

func ino(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return st.Ino
}

// dropDentries makes the kernel forget cached dentries and inodes, so the
// next path walk sends fresh LOOKUPs to the file system.
func dropDentries(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatalf("drop dentry cache: %v", err)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v (%d)", what, err, want, int(want))
	}
}

func TestCues(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	up := startUp(t, data)
	mnt := up.Mnt

	// Ordinary dot names are ordinary files and directories.
	if err := os.Mkdir(filepath.Join(mnt, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, ".git", "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, ".bashrc"), []byte("export X=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, ".bashrc")); err != nil || string(b) != "export X=1\n" {
		t.Errorf(".bashrc: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, ".git", "HEAD")); err != nil || string(b) != "ref: refs/heads/main\n" {
		t.Errorf(".git/HEAD: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "plain"), []byte("p"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}

	t.Run("ReaddirThroughCueView", func(t *testing.T) {
		want := names(t, mnt)
		if !slices.Equal(want, []string{".bashrc", ".git", "plain", "sub"}) {
			t.Errorf("ls MNT = %q, want [.bashrc .git plain sub]", want)
		}
		got := names(t, filepath.Join(mnt, ".EventualConsistency"))
		if !slices.Equal(got, want) {
			t.Errorf("ls MNT/.EventualConsistency = %q, want %q", got, want)
		}
		got = names(t, filepath.Join(mnt, ".MaxTime=5000", ".RepLevel=2"))
		if !slices.Equal(got, want) {
			t.Errorf("ls MNT/.MaxTime=5000/.RepLevel=2 = %q, want %q", got, want)
		}
		// Having looked cue components up, they still never appear.
		if got := names(t, mnt); !slices.Equal(got, want) {
			t.Errorf("ls MNT after cue lookups = %q, want %q", got, want)
		}
	})

	t.Run("MalformedCues", func(t *testing.T) {
		_, err := os.Stat(filepath.Join(mnt, ".MaxTime=abc"))
		wantErrno(t, "stat MNT/.MaxTime=abc", err, syscall.EINVAL)
		_, err = os.ReadDir(filepath.Join(mnt, ".MaxTime=abc"))
		wantErrno(t, "ls MNT/.MaxTime=abc", err, syscall.EINVAL)
		err = os.WriteFile(filepath.Join(mnt, ".RepLevel=0", "x"), []byte("x"), 0o644)
		wantErrno(t, "create MNT/.RepLevel=0/x", err, syscall.EINVAL)
		_, err = os.Stat(filepath.Join(mnt, ".RepLevel=0", "x"))
		wantErrno(t, "stat MNT/.RepLevel=0/x", err, syscall.EINVAL)
		if _, err := os.Stat(filepath.Join(mnt, "x")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("MNT/x exists after the failed create through .RepLevel=0: %v", err)
		}
	})

	// A file created through cues records them.
	cued := filepath.Join(mnt, ".RepLevel=2", ".Site=west", "cued")
	if err := os.WriteFile(cued, []byte("cued data"), 0o644); err != nil {
		t.Fatalf("create through cues: %v", err)
	}
	file := filepath.Join(mnt, "cued")
	if b, err := os.ReadFile(file); err != nil || string(b) != "cued data" {
		t.Fatalf("MNT/cued = %q, %v", b, err)
	}

	var fileIno uint64
	t.Run("Info", func(t *testing.T) {
		out := mustRun(t, "/", 30*time.Second, "getfattr", "--only-values", "-n", "user.wheelfs.info", file)
		x := parseInfo(t, "getfattr", []byte(out))
		if x.Cues["RepLevel"] != float64(2) || x.Cues["Site"] != "west" {
			t.Errorf("getfattr cues = %v, want RepLevel 2 and Site west", x.Cues)
		}
		out2 := mustRun(t, "/", 30*time.Second, wheelfsBin, "info", file)
		y := parseInfo(t, "wheelfs info", []byte(out2))
		if y.ID != x.ID || y.Cues["RepLevel"] != float64(2) || y.Cues["Site"] != "west" {
			t.Errorf("wheelfs info = %s, want id %s and the cues", out2, x.ID)
		}
		id, err := strconv.ParseUint(x.ID, 16, 64)
		if err != nil {
			t.Fatalf("info id %q is not hex: %v", x.ID, err)
		}
		fileIno = ino(t, file)
		if fileIno != id {
			t.Errorf("st_ino = %d (%x), info id = %s", fileIno, fileIno, x.ID)
		}
		// The same object through a cue view reports the same identity.
		out3 := mustRun(t, "/", 30*time.Second, "getfattr", "--only-values", "-n", "user.wheelfs.info",
			filepath.Join(mnt, ".EventualConsistency", "cued"))
		if z := parseInfo(t, "getfattr via cue view", []byte(out3)); z.ID != x.ID {
			t.Errorf("id via cue view = %s, want %s", z.ID, x.ID)
		}
	})
	if fileIno == 0 {
		fileIno = ino(t, file)
	}

	// st_ino survives rename.
	renamed := filepath.Join(mnt, "sub", "renamed")
	if err := os.Rename(file, renamed); err != nil {
		t.Fatal(err)
	}
	if got := ino(t, renamed); got != fileIno {
		t.Errorf("st_ino after rename = %d, before = %d", got, fileIno)
	}
	dropDentries(t)
	if got := ino(t, renamed); got != fileIno {
		t.Errorf("st_ino after rename and fresh lookup = %d, before = %d", got, fileIno)
	}

	// st_ino through a cue view is stable across lookups.
	view := filepath.Join(mnt, ".EventualConsistency", "sub", "renamed")
	viewIno := ino(t, view)
	dropDentries(t)
	if got := ino(t, view); got != viewIno {
		t.Errorf("st_ino via cue view changed between lookups: %d then %d", viewIno, got)
	}
	subIno := ino(t, filepath.Join(mnt, "sub"))

	// And both survive a restart of the deployment.
	up.stop()
	up2 := startUp(t, data)
	if got := ino(t, filepath.Join(up2.Mnt, "sub", "renamed")); got != fileIno {
		t.Errorf("st_ino after restart = %d, before = %d", got, fileIno)
	}
	if got := ino(t, filepath.Join(up2.Mnt, ".EventualConsistency", "sub", "renamed")); got != viewIno {
		t.Errorf("st_ino via cue view after restart = %d, before = %d", got, viewIno)
	}
	if got := ino(t, filepath.Join(up2.Mnt, "sub")); got != subIno {
		t.Errorf("directory st_ino after restart = %d, before = %d", got, subIno)
	}
	if b, err := os.ReadFile(filepath.Join(up2.Mnt, "sub", "renamed")); err != nil || string(b) != "cued data" {
		t.Errorf("contents after restart = %q, %v", b, err)
	}
}
