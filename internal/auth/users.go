// Package auth authenticates WheelFS users (paper §5.6, issue 13): the
// users file that lists them with their SSH public keys, the login
// challenge a client signs with one of those keys, and the Guard with which
// a storage server admits requests only for uids that have a valid session
// at the calling client node.
package auth

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/crypto/ssh"
)

// UsersPath is where the users file lives inside WheelFS.
const UsersPath = "/.wheelfs/users"

// User is one authorized user: a name, a uid, groups (the first is the
// primary group) and the SSH keys that may log in as it.
type User struct {
	Name   string
	UID    uint32
	Groups []uint32
	Keys   []ssh.PublicKey
}

// HasKey reports whether fingerprint (ssh.FingerprintSHA256) names one of
// u's keys.
func (u *User) HasKey(fingerprint string) bool {
	for _, k := range u.Keys {
		if ssh.FingerprintSHA256(k) == fingerprint {
			return true
		}
	}
	return false
}

// Fingerprints lists u's keys' SHA256 fingerprints.
func (u *User) Fingerprints() []string {
	out := make([]string, len(u.Keys))
	for i, k := range u.Keys {
		out[i] = ssh.FingerprintSHA256(k)
	}
	return out
}

// Users is a parsed users file.
type Users struct {
	byName map[string]*User
}

// Lookup returns the user called name, or nil.
func (us *Users) Lookup(name string) *User {
	if us == nil {
		return nil
	}
	return us.byName[name]
}

// LookupUID returns the user whose uid is uid, or nil.
func (us *Users) LookupUID(uid uint32) *User {
	if us == nil {
		return nil
	}
	for _, u := range us.byName {
		if u.UID == uid {
			return u
		}
	}
	return nil
}

// Len is the number of users.
func (us *Users) Len() int {
	if us == nil {
		return 0
	}
	return len(us.byName)
}

// ParseUsers parses a users file. Each line is
//
//	NAME UID GID[,GID...] KEYTYPE BASE64KEY [COMMENT]
//
// as in authorized_keys after three leading fields; '#' starts a comment
// line. A user with several keys has several lines, which must agree on
// uid and groups; two users may not share a uid. Keys may be ed25519,
// RSA or ECDSA.
func ParseUsers(data []byte) (*Users, error) {
	us := &Users{byName: map[string]*User{}}
	byUID := map[uint32]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 5 {
			return nil, fmt.Errorf("auth: users line %d: want NAME UID GIDS KEYTYPE KEY", n)
		}
		name := f[0]
		uid, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("auth: users line %d: uid %q: %w", n, f[1], err)
		}
		var groups []uint32
		for g := range strings.SplitSeq(f[2], ",") {
			gid, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("auth: users line %d: gid %q: %w", n, g, err)
			}
			groups = append(groups, uint32(gid))
		}
		// The rest is an authorized_keys line: type, key, comment. The
		// fields are skipped by strings.Fields' own idea of white space
		// (\v and \f too), so that at least two are left after them.
		rest := line
		for range 3 {
			rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
			rest = rest[strings.IndexFunc(rest, unicode.IsSpace):]
		}
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.TrimSpace(rest)))
		if err != nil {
			return nil, fmt.Errorf("auth: users line %d: key: %w", n, err)
		}
		switch key.Type() {
		case ssh.KeyAlgoED25519, ssh.KeyAlgoRSA, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521:
		default:
			return nil, fmt.Errorf("auth: users line %d: key type %s not accepted", n, key.Type())
		}
		if other, ok := byUID[uint32(uid)]; ok && other != name {
			return nil, fmt.Errorf("auth: users line %d: uid %d is already %s's", n, uid, other)
		}
		u := us.byName[name]
		if u == nil {
			u = &User{Name: name, UID: uint32(uid), Groups: groups}
			us.byName[name] = u
			byUID[u.UID] = name
		} else if u.UID != uint32(uid) || !slices.Equal(u.Groups, groups) {
			return nil, fmt.Errorf("auth: users line %d: %s's uid or groups differ from an earlier line", n, name)
		}
		u.Keys = append(u.Keys, key)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth: users file: %w", err)
	}
	return us, nil
}
