package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/auth"
	"github.com/wheelfs/wheelfs/internal/client"
)

// loginSocket is the mount's control socket: an abstract unix socket named
// after the mount point, so `wheelfs login --mount M` finds it with no
// file to agree on, and any local user may connect; the mount learns who
// connected from the kernel (SO_PEERCRED), never from the message.
func loginSocket(mnt string) string { return "@wheelfs-login:" + filepath.Clean(mnt) }

// loginMsg is one message on the control socket (JSON, one per line).
type loginMsg struct {
	Op      string    `json:"op,omitempty"` // challenge, login, logout
	User    string    `json:"user,omitempty"`
	Node    string    `json:"node,omitempty"`
	Uid     uint32    `json:"uid,omitempty"`
	Nonce   []byte    `json:"nonce,omitempty"`
	Keys    []string  `json:"keys,omitempty"`
	Pub     []byte    `json:"pub,omitempty"`
	Sig     []byte    `json:"sig,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
	Error   string    `json:"error,omitempty"`
}

// serveLogins answers `wheelfs login` and `logout` for the mount at mnt
// until ctx ends.
func serveLogins(ctx context.Context, mnt string, fs *client.FS, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("unix", loginSocket(mnt))
	if err != nil {
		return nil, fmt.Errorf("login socket: %w", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveLogin(ctx, c.(*net.UnixConn), fs, log)
		}
	}()
	return func() { ln.Close() }, nil
}

func serveLogin(ctx context.Context, c *net.UnixConn, fs *client.FS, log *slog.Logger) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil {
		return
	}
	in, out := bufio.NewScanner(c), json.NewEncoder(c)
	var ch *client.Challenge
	for in.Scan() {
		var m, resp loginMsg
		if err := json.Unmarshal(in.Bytes(), &m); err != nil {
			return
		}
		switch m.Op {
		case "challenge":
			ch, err = fs.LoginChallenge(ctx, cred.Uid, m.User)
			if err == nil {
				resp = loginMsg{Node: ch.Node, Uid: ch.Uid, User: ch.User, Nonce: ch.Nonce, Keys: ch.Keys}
			}
		case "login":
			if ch == nil {
				err = errors.New("no challenge")
				break
			}
			var s client.Session
			s, err = fs.Login(ctx, ch, m.Pub, m.Sig)
			resp = loginMsg{User: s.User, Uid: s.Uid, Expires: s.Expires}
		case "logout":
			err = fs.Logout(ctx, cred.Uid)
		default:
			err = fmt.Errorf("unknown request %q", m.Op)
		}
		if err != nil {
			log.Info("login request failed", "uid", cred.Uid, "op", m.Op, "err", err)
			resp = loginMsg{Error: err.Error()}
		}
		if out.Encode(resp) != nil {
			return
		}
	}
}

// ask sends m on c and reads the answer.
func ask(c net.Conn, in *bufio.Scanner, m loginMsg) (loginMsg, error) {
	if err := json.NewEncoder(c).Encode(m); err != nil {
		return loginMsg{}, err
	}
	if !in.Scan() {
		return loginMsg{}, fmt.Errorf("no answer from the mount: %v", in.Err())
	}
	var r loginMsg
	if err := json.Unmarshal(in.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

func dialMount(mnt string) (net.Conn, *bufio.Scanner, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil, nil, err
	}
	c, err := net.DialTimeout("unix", loginSocket(abs), 5*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("no WheelFS mount at %s answers (%w)", abs, err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	return c, bufio.NewScanner(c), nil
}

func newLogin() *cobra.Command {
	var keyFile, mnt, user string
	cmd := &cobra.Command{
		Use:   "login [--key FILE] [--mount MOUNTPOINT] [--user NAME]",
		Short: "Prove with an SSH key (ssh-agent by default) that your uid acts for a WheelFS user at this mount",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var signers []auth.Signer
			if keyFile != "" {
				s, err := auth.KeyFile(keyFile)
				if err != nil {
					return err
				}
				signers = []auth.Signer{s}
			} else {
				a, err := auth.DialAgent("")
				if err != nil {
					return err
				}
				defer a.Close()
				if signers, err = a.Signers(); err != nil {
					return err
				}
			}
			c, in, err := dialMount(mnt)
			if err != nil {
				return err
			}
			defer c.Close()
			ch, err := ask(c, in, loginMsg{Op: "challenge", User: user})
			if err != nil {
				return err
			}
			user = ch.User // the one named, or the users file's for this uid
			s, err := auth.Pick(signers, ch.Keys)
			if err != nil {
				return fmt.Errorf("user %s: %w", user, err)
			}
			sig, err := s.Sign(auth.Payload(ch.Node, ch.Uid, user, ch.Nonce))
			if err != nil {
				return err
			}
			r, err := ask(c, in, loginMsg{Op: "login", Pub: s.PublicKey().Marshal(), Sig: ssh.Marshal(sig)})
			if err != nil {
				return err
			}
			fmt.Printf("logged in as %s (uid %d) at %s until %s (renewed while mounted)\n", r.User, r.Uid, ch.Node, r.Expires.Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "key", "", "private key `FILE` (a service key) instead of ssh-agent")
	cmd.Flags().StringVar(&mnt, "mount", "/wfs", "the WheelFS mount `MOUNTPOINT`")
	cmd.Flags().StringVar(&user, "user", "", "WheelFS user `NAME` (default: the users file's user with your uid; root must name one)")
	return cmd
}

func newLogout() *cobra.Command {
	var mnt string
	cmd := &cobra.Command{
		Use:   "logout [--mount MOUNTPOINT]",
		Short: "End your uid's WheelFS session at this mount, at every server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, in, err := dialMount(mnt)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = ask(c, in, loginMsg{Op: "logout"})
			return err
		},
	}
	cmd.Flags().StringVar(&mnt, "mount", "/wfs", "the WheelFS mount `MOUNTPOINT`")
	return cmd
}
