package auth

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// ErrNoKey means no available key belongs to the user.
var ErrNoKey = errors.New("auth: none of the available keys belongs to the user")

// Payload is what a login signs: a domain tag, so that a WheelFS
// challenge can never double as an SSH or other signature, then the client
// node, the uid the session is for, the user and the server's nonce, each
// length-prefixed.
func Payload(node string, uid uint32, user string, nonce []byte) []byte {
	var b bytes.Buffer
	b.WriteString("wheelfs-login-v1\x00")
	for _, f := range [][]byte{[]byte(node), binary.BigEndian.AppendUint32(nil, uid), []byte(user), nonce} {
		b.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		b.Write(f)
	}
	return b.Bytes()
}

// Signer signs login payloads with one SSH key.
type Signer interface {
	PublicKey() ssh.PublicKey
	Sign(data []byte) (*ssh.Signature, error)
}

// keySigner signs with a private key held in this process; RSA keys sign
// with SHA-256 (rsa-sha2-256), never SHA-1.
type keySigner struct{ s ssh.Signer }

func (k keySigner) PublicKey() ssh.PublicKey { return k.s.PublicKey() }

func (k keySigner) Sign(data []byte) (*ssh.Signature, error) {
	if as, ok := k.s.(ssh.AlgorithmSigner); ok && k.s.PublicKey().Type() == ssh.KeyAlgoRSA {
		return as.SignWithAlgorithm(nil, data, ssh.KeyAlgoRSASHA256)
	}
	return k.s.Sign(nil, data)
}

// NewSigner wraps an ssh.Signer (a service key read from disk).
func NewSigner(s ssh.Signer) Signer { return keySigner{s} }

// KeyFile reads an unencrypted private key file (OpenSSH or PEM format).
func KeyFile(path string) (Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("auth: key %s: %w", path, err)
	}
	return keySigner{s}, nil
}

// agentSigner signs with a key held by an SSH agent.
type agentSigner struct {
	a   agent.ExtendedAgent
	key ssh.PublicKey
}

func (s agentSigner) PublicKey() ssh.PublicKey { return s.key }

func (s agentSigner) Sign(data []byte) (*ssh.Signature, error) {
	var flags agent.SignatureFlags
	if s.key.Type() == ssh.KeyAlgoRSA {
		flags = agent.SignatureFlagRsaSha256
	}
	return s.a.SignWithFlags(s.key, data, flags)
}

// Agent is a connection to an SSH agent.
type Agent struct {
	conn net.Conn
	a    agent.ExtendedAgent
}

// DialAgent connects to the agent at sock (SSH_AUTH_SOCK when empty).
func DialAgent(sock string) (*Agent, error) {
	if sock == "" {
		sock = os.Getenv("SSH_AUTH_SOCK")
	}
	if sock == "" {
		return nil, errors.New("auth: no ssh-agent (SSH_AUTH_SOCK is not set; use --key FILE)")
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("auth: ssh-agent: %w", err)
	}
	return &Agent{conn: c, a: agent.NewClient(c)}, nil
}

// Signers lists the agent's keys.
func (a *Agent) Signers() ([]Signer, error) {
	keys, err := a.a.List()
	if err != nil {
		return nil, fmt.Errorf("auth: ssh-agent: %w", err)
	}
	out := make([]Signer, 0, len(keys))
	for _, k := range keys {
		pk, err := ssh.ParsePublicKey(k.Blob)
		if err != nil {
			continue // a key type this library does not know
		}
		out = append(out, agentSigner{a.a, pk})
	}
	return out, nil
}

// Close closes the connection to the agent.
func (a *Agent) Close() error { return a.conn.Close() }

// Pick returns the first signer whose key has one of the fingerprints.
func Pick(signers []Signer, fingerprints []string) (Signer, error) {
	for _, s := range signers {
		fp := ssh.FingerprintSHA256(s.PublicKey())
		for _, want := range fingerprints {
			if fp == want {
				return s, nil
			}
		}
	}
	return nil, ErrNoKey
}

// Verify checks that signature (SSH wire format) by pub (SSH wire format)
// signs payload and that pub is one of u's keys. It returns the key's
// fingerprint. SHA-1 RSA signatures are refused.
func Verify(u *User, pub, signature, payload []byte) (string, error) {
	key, err := ssh.ParsePublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("auth: public key: %w", err)
	}
	fp := ssh.FingerprintSHA256(key)
	if !u.HasKey(fp) {
		return "", fmt.Errorf("auth: key %s is not %s's", fp, u.Name)
	}
	var sig ssh.Signature
	if err := ssh.Unmarshal(signature, &sig); err != nil {
		return "", fmt.Errorf("auth: signature: %w", err)
	}
	if sig.Format == ssh.KeyAlgoRSA {
		return "", errors.New("auth: ssh-rsa (SHA-1) signatures are not accepted")
	}
	if err := key.Verify(payload, &sig); err != nil {
		return "", fmt.Errorf("auth: signature by %s does not verify: %w", fp, err)
	}
	return fp, nil
}
