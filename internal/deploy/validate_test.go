package deploy

import (
	"strings"
	"testing"
	"time"
)

func TestValidateMemberTTL(t *testing.T) {
	for _, tc := range []struct {
		member, lock, maint time.Duration
		err                 string // substring; "" = valid
	}{
		{member: 0, lock: 2 * time.Second},                            // default: not checked
		{member: 10 * time.Second, lock: 2 * time.Minute},             // default maintenance period
		{member: 3 * time.Second, lock: 3 * time.Second},              // at the bounds
		{member: 2 * time.Second, lock: time.Minute, err: "below 3s"}, // under etcd's floor
		{member: 5 * time.Second, lock: time.Minute, maint: 2 * time.Second, err: "3 maintenance periods"},
		{member: 30 * time.Second, lock: 20 * time.Second, err: "exceeds the lock TTL"},
	} {
		c := NewConfig(t.TempDir())
		c.MemberTTL, c.LockTTL, c.Server.MaintainPeriod = tc.member, tc.lock, tc.maint
		c.withDefaults()
		err := c.Validate()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("member %s lock %s maint %s: %v", tc.member, tc.lock, tc.maint, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("member %s lock %s maint %s: err %v, want %q", tc.member, tc.lock, tc.maint, err, tc.err)
		}
	}
}

func TestValidateCertValidity(t *testing.T) {
	for _, tc := range []struct {
		v  time.Duration
		ok bool
	}{{0, true}, {time.Hour, true}, {90 * 24 * time.Hour, true}, {30 * time.Minute, false}} {
		c := NewConfig(t.TempDir())
		c.CertValidity = tc.v
		c.withDefaults()
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("validity %v: %v", tc.v, err)
		}
	}
}
