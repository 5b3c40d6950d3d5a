package attrs

import (
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func TestApply(t *testing.T) {
	owner := perm.Cred{Uid: 1000, Gid: 1000}
	writer := perm.Cred{Uid: 1001, Gid: 1000} // in the file's group, which may write
	other := perm.Cred{Uid: 1002, Gid: 1002}
	file := func() *wire.Meta {
		return &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o6775, Uid: 1000, Gid: 1000, MtimeNs: 5}
	}
	tests := []struct {
		name     string
		c        perm.Cred
		req      *wire.SetAttrRequest
		wantErr  syscall.Errno
		wantMode uint32
	}{
		{"owner chmod", owner, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o644}, 0, 0o644},
		{"other chmod refused", other, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o777}, syscall.EPERM, 0o6775},
		{"writer drops suid/sgid before writing", writer, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0775}, 0, 0o0775},
		{"writer may not change other bits", writer, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0777}, syscall.EPERM, 0o6775},
		{"non-writer may not drop suid", other, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0775}, syscall.EPERM, 0o6775},
		{"other explicit utimens refused", other, &wire.SetAttrRequest{Valid: wire.SetMtime, MtimeNs: 9}, syscall.EPERM, 0o6775},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := file()
			err := Apply(tt.c, m, tt.req, 100)
			var got syscall.Errno
			if err != nil {
				got = fserr.Errno(err)
			}
			if got != tt.wantErr || m.Mode != tt.wantMode {
				t.Fatalf("err %v mode %o, want err %v mode %o", err, m.Mode, tt.wantErr, tt.wantMode)
			}
			if err != nil && m.MtimeNs != 5 {
				t.Fatal("meta changed on error")
			}
		})
	}
}
