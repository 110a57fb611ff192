package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The network faults are iptables rules on loopback, matched by the
// owner of the packet: each node process runs as a uid of its own
// (NodeUID), so the kernel can tell which node sent a packet. A fault
// between nodes a and b matches a's packets to b's listen port and b's
// packets to a's: of each connection between them, the dialler's
// segments. That is enough: a dropped dialler stalls the connection
// (its data and acks never arrive), and a reset one is reset at its next
// segment, after which its kernel answers the listener's next segment
// with a reset too (checked by hand: a listener's replies go to the
// dialler's ephemeral port, which no rule can name, and a kernel's reset
// has no owner). A cut from etcd matches the node's packets to etcd's
// client port. Packets of a process that exited are not matched either
// (an orphaned socket has no owner), so a kill's FIN still goes out.
//
// The rules live in a chain of the run's own, REJOIN-CHAOS-<pid>, jumped
// to from OUTPUT for -o lo: the run adds it at its start and removes it
// at its end, whatever the end (a FAIL, an error, SIGINT or SIGTERM);
// only a SIGKILL of chaos leaves it behind, and the next run as root
// removes chains of that name whose process is gone.

// UIDBase is the first of the uids the node processes run as under
// network faults: node n runs as UIDBase+n, gid the same. No account is
// made for them. 2,000,000,000 is above what Debian, useradd's subuid
// ranges (from 100,000) and systemd (dynamic users 61184-65519, nspawn's
// container ranges up to 1,879,048,191) hand out, below systemd's
// "foreign" range (2,147,352,576), and below 2^31, past which tools that
// print uids as signed numbers (ps) show negative ones.
const UIDBase = 2_000_000_000

// NodeUID is the uid (and gid) node id runs as under network faults.
func NodeUID(id int) uint32 { return UIDBase + uint32(id) }

// chainPrefix starts the name of every chain chaos makes.
const chainPrefix = "REJOIN-CHAOS-"

// ChainName is the iptables chain of the chaos run of process pid.
func ChainName(pid int) string { return chainPrefix + strconv.Itoa(pid) }

// iptablesWait is iptables's wait for the xtables lock (-w), in seconds.
const iptablesWait = "5"

// setupRules make chain and jump to it for every packet out on loopback.
func setupRules(chain string) [][]string {
	return [][]string{
		{"-N", chain},
		{"-I", "OUTPUT", "-o", "lo", "-j", chain},
	}
}

// teardownRules undo setupRules: the jump, then the chain's rules and
// the chain.
func teardownRules(chain string) [][]string {
	return [][]string{
		{"-D", "OUTPUT", "-o", "lo", "-j", chain},
		{"-F", chain},
		{"-X", chain},
	}
}

// healRules end the fault in chain: its rules go, the chain stays.
func healRules(chain string) [][]string { return [][]string{{"-F", chain}} }

// netTarget is the rule's verdict for kind.
func netTarget(kind NetKind) []string {
	if kind == NetReset {
		return []string{"-j", "REJECT", "--reject-with", "tcp-reset"}
	}
	return []string{"-j", "DROP"}
}

// cutRules are the rules of cut c in chain, one per (owner uid,
// destination port): uid(a) to every port of b and uid(b) to every port
// of a for each a of c.A and b of c.B; uid(e) to etcdPort for each e of
// c.Etcd.
func cutRules(chain string, kind NetKind, c Cut, uid func(id int) uint32, ports func(id int) []int, etcdPort int) [][]string {
	var out [][]string
	rule := func(from, port int) {
		out = append(out, append([]string{"-A", chain, "-o", "lo", "-p", "tcp", "-m", "owner",
			"--uid-owner", strconv.FormatUint(uint64(uid(from)), 10), "--dport", strconv.Itoa(port)}, netTarget(kind)...))
	}
	for _, a := range c.A {
		for _, b := range c.B {
			for _, p := range ports(b) {
				rule(a, p)
			}
			for _, p := range ports(a) {
				rule(b, p)
			}
		}
	}
	for _, e := range c.Etcd {
		rule(e, etcdPort)
	}
	return out
}

// iptables runs the iptables binary at path on chain.
type iptables struct {
	path  string
	chain string
}

// run runs each argument list in order, stopping at the first error.
func (t *iptables) run(ctx context.Context, lists [][]string) error {
	for _, args := range lists {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		out, err := exec.CommandContext(ctx, t.path, append([]string{"-w", iptablesWait}, args...)...).CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// teardown removes the chain; each step is tried whatever the others
// did, so that a half-made chain goes too. It is run on a fresh context:
// the run's may have ended (SIGINT).
func (t *iptables) teardown() error {
	var errs []error
	for _, args := range teardownRules(t.chain) {
		if err := t.run(context.Background(), [][]string{args}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stale lists the chains chaos made (ChainName) whose process is gone,
// in the output of `iptables -S`.
func stale(rules string, alive func(pid int) bool) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(rules))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "-N" || !strings.HasPrefix(f[1], chainPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(f[1], chainPrefix))
		if err != nil || pid <= 0 || alive(pid) {
			continue
		}
		out = append(out, f[1])
	}
	return out
}

// pidAlive reports whether process pid exists (as /proc sees it).
func pidAlive(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return err == nil
}

// netSupport says why network faults cannot run here ("" if they can),
// and the iptables binary if found: Linux, root, an iptables that can
// list the filter table, the node uids within this user namespace's map,
// and a run directory every uid can reach.
func netSupport(ctx context.Context, dir string) (string, string) {
	if runtime.GOOS != "linux" {
		return "", "they need Linux (iptables owner matches)"
	}
	if os.Geteuid() != 0 {
		return "", fmt.Sprintf("they need root (uid %d): the nodes run as uids of their own and iptables needs CAP_NET_ADMIN", os.Geteuid())
	}
	path, err := exec.LookPath("iptables")
	if err != nil {
		return "", "no iptables binary in PATH (Debian: apt-get install iptables)"
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "-w", iptablesWait, "-S", "OUTPUT").CombinedOutput(); err != nil {
		return path, fmt.Sprintf("%s -S OUTPUT failed: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	for _, m := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
		b, err := os.ReadFile(m)
		if err != nil {
			return path, err.Error()
		}
		if !idMapped(string(b), UIDBase, UIDBase+64) {
			return path, fmt.Sprintf("%s does not map ids %d..%d, which the nodes run as", m, UIDBase, UIDBase+64)
		}
	}
	if why := reachable(dir); why != "" {
		return path, why
	}
	return path, ""
}

// idMapped reports whether a user namespace's id map (the text of
// /proc/self/uid_map) covers ids lo..hi.
func idMapped(m string, lo, hi uint64) bool {
	for _, line := range strings.Split(m, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(f[0], 10, 64)
		n, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 == nil && err2 == nil && start <= lo && hi < start+n {
			return true
		}
	}
	return false
}

// reachable says why another uid cannot reach dir ("" if it can): every
// directory above it must let others through. dir itself is chaos's and
// is opened up by it.
func reachable(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err.Error()
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err.Error()
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Sprintf("the nodes' uids cannot reach the run directory %s: %s is mode %04o (give --dir under a directory others may enter, e.g. /tmp)", dir, d, fi.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// etcdPort is the port of etcd's client URL.
func etcdPort(endpoint string) (int, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return 0, err
	}
	_, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return 0, fmt.Errorf("etcd endpoint %q: %w", endpoint, err)
	}
	return strconv.Atoi(p)
}

// loopbackPorts reserves n distinct free TCP ports on 127.0.0.1: each
// node listens on its own for the whole run, restarts included, so a
// fault's rules keep naming it.
func loopbackPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// netFaults applies the network faults of a run: one at a time, as the
// rules of its chain, healed by flushing the chain.
type netFaults struct {
	ipt      *iptables
	nodes    int
	ports    func(id int) []int
	etcdPort int
}

// apply puts the cut of network step s in place.
func (nf *netFaults) apply(ctx context.Context, s Step) error {
	rules := cutRules(nf.ipt.chain, s.Net, s.Cut(nf.nodes), NodeUID, nf.ports, nf.etcdPort)
	if err := nf.ipt.run(ctx, rules); err != nil {
		// Half a cut is not the step planned: none.
		return errors.Join(err, nf.heal())
	}
	return nil
}

// heal removes every rule of the chain.
func (nf *netFaults) heal() error { return nf.ipt.run(context.Background(), healRules(nf.ipt.chain)) }
