package experiment

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestReadApacheLog counts mod_cache_disk's lines as Apache 2.4 writes them.
func TestReadApacheLog(t *testing.T) {
	log := `[Tue Nov 24 22:32:20.837203 2026] [cache_disk:warn] [pid 1:tid 2] (2)No such file or directory: [client 10.77.1.11:41476] AH00699: rename tempfile to file failed: /c/aptmpBgkGid -> /c/t/R/x.data
[Tue Nov 24 22:32:23.063779 2026] [cache_disk:warn] [pid 1:tid 3] (20)Not a directory: [client 10.77.1.11:32802] AH00699: rename tempfile to file failed: /c/aptmpACbzCv -> /c/y/r
[Tue Nov 24 22:32:23.650021 2026] [cache_disk:warn] [pid 1:tid 4] (2)No such file or directory: [client 10.77.1.11:32814] AH00699: rename tempfile to file failed: /c/aptmpZ4xyQD -> /c/t/R/x.data
[Tue Nov 24 22:05:09.461361 2026] [cache_disk:debug] [pid 1:tid 2] mod_cache_disk.c(1361): [client 10.77.2.11:51646] AH00737: commit_entity: Headers and body for URL http://o/page/1? cached.
[Tue Nov 24 22:05:10.1 2026] [cache_disk:debug] [pid 1:tid 2] mod_cache_disk.c(1361): [client 10.77.2.11:5] AH00709: Recalled cached URL info header http://o/page/1?
[Tue Nov 24 22:05:11.1 2026] [cache_disk:debug] [pid 1:tid 2] mod_cache_disk.c(1361): [client 10.77.2.11:5] AH00710: Cached URL info header 'http://o/page/2?' didn't match body, ignoring this entry
`
	path := filepath.Join(t.TempDir(), "error.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := readApacheLog(path)
	want := apacheLog{stored: 1, renameFailed: 3, recalled: 1, mismatched: 1,
		renameErrs: "2 No such file or directory, 1 Not a directory"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestPageBody checks that pages are deterministic, distinct and sized.
func TestPageBody(t *testing.T) {
	a, b := pageBody(3, 41000), pageBody(3, 41000)
	if !bytes.Equal(a, b) || len(a) != 41000 || !bytes.HasPrefix(a, []byte("page 3\n")) {
		t.Fatal("page 3 is not deterministic or misses its header")
	}
	if bytes.Equal(a, pageBody(4, 41000)) {
		t.Fatal("pages 3 and 4 are equal")
	}
}
