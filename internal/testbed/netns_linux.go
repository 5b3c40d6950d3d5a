package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bound (as `ip netns` does).
const netnsDir = "/run/netns"

// wanTable is the routing table of the router namespace that sends every
// packet arriving from a site to the TUN device of the delay router.
const wanTable = 100

// withNS runs fn on a thread moved into the named network namespace. fn
// must not start goroutines that need the namespace: only this thread is in
// it. exec.Cmd.Start forks from the calling thread, so a child started in
// fn lives in the namespace (and keeps every other namespace of ours, in
// particular the mount namespace, so its FUSE mounts are the caller's).
func withNS(name string, fn func() error) error {
	return onThread(name, func() (netns.NsHandle, error) { return netns.GetFromName(name) }, fn)
}

// createNS makes a named network namespace with its loopback up and IPv6
// off (nothing in the testbed uses it; its neighbour discovery is noise).
func createNS(name string) error {
	// NewNamed moves the calling thread into the new namespace itself.
	return onThread(name, func() (netns.NsHandle, error) { return netns.NewNamed(name) }, setupNS)
}

// onThread locks the goroutine to its thread, enters the namespace that
// enter returns, runs fn there and moves the thread back.
func onThread(name string, enter func() (netns.NsHandle, error), fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := enter()
	if err == nil {
		defer target.Close()
		err = netns.Set(target)
	}
	if err != nil {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("network namespace %s: %w", name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked and dies with this goroutine rather than
		// run other goroutines in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("leaving namespace %s: %w", name, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// setupNS runs on a thread inside a fresh namespace.
func setupNS() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for _, k := range []string{"ipv6/conf/all/disable_ipv6", "ipv6/conf/default/disable_ipv6"} {
		_ = sysctl(k, "1") // absent when the kernel has no IPv6
	}
	return nil
}

// sysctl writes a net sysctl of the calling thread's namespace.
func sysctl(key, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys/net", key), []byte(value), 0o644)
}

// deleteNS removes a named namespace; it is freed once no process and no
// open handle keeps it.
func deleteNS(name string) error {
	err := netns.DeleteNamed(name)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.EINVAL) {
		os.Remove(filepath.Join(netnsDir, name))
		return nil
	}
	return err
}

// namedNamespaces lists the namespaces whose names start with prefix.
func namedNamespaces(prefix string) []string {
	ents, _ := os.ReadDir(netnsDir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// nsInode identifies a named namespace as /proc/PID/ns/net shows it.
func nsInode(name string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(netnsDir, name), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// handle opens a netlink handle on a named namespace.
func handle(name string) (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, 0, fmt.Errorf("network namespace %s: %w", name, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, err
	}
	return h, ns, nil
}

// vethBetween creates a veth pair with one end in each namespace.
func vethBetween(aNS netns.NsHandle, aName string, bNS netns.NsHandle, bName string) error {
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName, Namespace: netlink.NsFd(aNS), TxQLen: 1000},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(bNS),
	}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s-%s: %w", aName, bName, err)
	}
	return nil
}

// addrUp gives a link an address (prefix length bits) and brings it up.
func addrUp(h *netlink.Handle, link string, a netip.Addr, bits int) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("link %s: %w", link, err)
	}
	if a.IsValid() {
		ipn := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s on %s: %w", a, link, err)
		}
	}
	return h.LinkSetUp(l)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// routeVia adds a route to dst (nil: default) through gw; congctl, if
// set, is the TCP congestion control of connections over it.
func routeVia(h *netlink.Handle, dst *net.IPNet, gw netip.Addr, congctl string) error {
	if err := h.RouteAdd(&netlink.Route{Dst: dst, Gw: gw.AsSlice(), Congctl: congctl}); err != nil {
		return fmt.Errorf("route %v via %s: %w", dst, gw, err)
	}
	return nil
}

// setUplink puts a token bucket of rate bits/s on a link's egress (0:
// remove it). The queue holds 100 ms at that rate, as a site router's would.
func setUplink(h *netlink.Handle, link string, rate uint64) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return err
	}
	qs, _ := h.QdiscList(l)
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Type() == "tbf" {
			if err := h.QdiscDel(q); err != nil {
				return err
			}
		}
	}
	if rate == 0 {
		return nil
	}
	bytesPerSec := rate / 8
	burst := max(uint32(bytesPerSec/100), 16*1024) // 10 ms, at least a few full-size packets
	limit := uint32(bytesPerSec/10) + burst
	tbf := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bytesPerSec,
		Limit:      limit,
		Buffer:     netlink.Xmittime(bytesPerSec, burst),
	}
	if err := h.QdiscAdd(tbf); err != nil {
		return fmt.Errorf("tbf %dbit/s on %s: %w", rate, link, err)
	}
	return nil
}

// startIn starts cmd inside the named network namespace.
func startIn(name string, cmd *exec.Cmd) error {
	return withNS(name, cmd.Start)
}
