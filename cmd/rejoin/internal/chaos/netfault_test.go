package chaos

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func join(lists [][]string) []string {
	out := make([]string, len(lists))
	for i, l := range lists {
		out[i] = strings.Join(l, " ")
	}
	return out
}

// TestCutRules: a cut between nodes matches each side's uid to the
// other's ports, both ways; a cut from etcd the node's uid to etcd's
// port; drop and reset differ only in the target.
func TestCutRules(t *testing.T) {
	ports := func(id int) []int { return []int{7000 + id} }
	uid := func(id int) uint32 { return uint32(100 + id) }
	peers := Step{Action: ActNetPeers, Node: 2, Net: NetDrop}
	got := join(cutRules("C", peers.Net, peers.Cut(3), uid, ports, 2379))
	want := []string{
		"-A C -o lo -p tcp -m owner --uid-owner 102 --dport 7001 -j DROP",
		"-A C -o lo -p tcp -m owner --uid-owner 101 --dport 7002 -j DROP",
		"-A C -o lo -p tcp -m owner --uid-owner 102 --dport 7003 -j DROP",
		"-A C -o lo -p tcp -m owner --uid-owner 103 --dport 7002 -j DROP",
	}
	if !slices.Equal(got, want) {
		t.Errorf("net-peers n2 drop:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	iso := Step{Action: ActNetIsolate, Node: 1, Net: NetReset}
	got = join(cutRules("C", iso.Net, iso.Cut(2), uid, ports, 2379))
	want = []string{
		"-A C -o lo -p tcp -m owner --uid-owner 101 --dport 7002 -j REJECT --reject-with tcp-reset",
		"-A C -o lo -p tcp -m owner --uid-owner 102 --dport 7001 -j REJECT --reject-with tcp-reset",
		"-A C -o lo -p tcp -m owner --uid-owner 101 --dport 2379 -j REJECT --reject-with tcp-reset",
	}
	if !slices.Equal(got, want) {
		t.Errorf("net-isolate n1 reset:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A bridge: n3 sees both sides, so no rule names its uid or port.
	br := Step{Action: ActNetBridge, Node: 3, Side: []int{1, 2}, Net: NetDrop}
	rules := cutRules("C", br.Net, br.Cut(5), NodeUID, ports, 2379)
	if len(rules) != 2*2*2 {
		t.Errorf("bridge {n1,n2} | {n4,n5}: %d rules, want 8", len(rules))
	}
	for _, r := range join(rules) {
		if strings.Contains(r, " 7003 ") || strings.Contains(r, itoa(NodeUID(3))) {
			t.Errorf("bridge rule names the bridge n3: %s", r)
		}
	}
	if s := (Step{Action: ActNetEtcd, Node: 4, Net: NetDrop}); !slices.Equal(join(cutRules("C", s.Net, s.Cut(5), NodeUID, ports, 2379)),
		[]string{"-A C -o lo -p tcp -m owner --uid-owner 2000000004 --dport 2379 -j DROP"}) {
		t.Error("net-etcd n4: not one rule to etcd's port")
	}
}

func itoa(u uint32) string { return strconv.FormatUint(uint64(u), 10) }

// TestChainRules: the run's chain is made, jumped to from OUTPUT for
// loopback only, flushed to heal, and undone in the reverse order.
func TestChainRules(t *testing.T) {
	ch := ChainName(4242)
	if ch != "REJOIN-CHAOS-4242" {
		t.Fatalf("ChainName(4242) = %s", ch)
	}
	if got := join(setupRules(ch)); !slices.Equal(got, []string{"-N " + ch, "-I OUTPUT -o lo -j " + ch}) {
		t.Errorf("setup: %q", got)
	}
	if got := join(teardownRules(ch)); !slices.Equal(got, []string{"-D OUTPUT -o lo -j " + ch, "-F " + ch, "-X " + ch}) {
		t.Errorf("teardown: %q", got)
	}
	if got := join(healRules(ch)); !slices.Equal(got, []string{"-F " + ch}) {
		t.Errorf("heal: %q", got)
	}
}

// TestStale: only chains of chaos runs whose process is gone are swept.
func TestStale(t *testing.T) {
	rules := `-P OUTPUT ACCEPT
-N DOCKER
-N REJOIN-CHAOS-10
-N REJOIN-CHAOS-11
-N REJOIN-CHAOS-x
-A OUTPUT -o lo -j REJOIN-CHAOS-10
-A REJOIN-CHAOS-10 -o lo -p tcp -j DROP
`
	got := stale(rules, func(pid int) bool { return pid == 11 })
	if !slices.Equal(got, []string{"REJOIN-CHAOS-10"}) {
		t.Errorf("stale = %q, want REJOIN-CHAOS-10 only", got)
	}
}

func TestIDMapped(t *testing.T) {
	full := "         0          0 4294967295\n"
	small := "         0     100000      65536\n"
	if !idMapped(full, UIDBase, UIDBase+64) {
		t.Error("the full map does not map the node uids")
	}
	if idMapped(small, UIDBase, UIDBase+64) {
		t.Error("a map of 65536 ids maps the node uids")
	}
}

func TestEtcdPort(t *testing.T) {
	if p, err := etcdPort("https://127.0.0.1:2379"); err != nil || p != 2379 {
		t.Errorf("etcdPort = %d, %v", p, err)
	}
	if _, err := etcdPort("https://127.0.0.1"); err == nil {
		t.Error("etcdPort without a port: no error")
	}
}

// TestStepStrings: the log's names of the network steps.
func TestStepStrings(t *testing.T) {
	for _, tt := range []struct {
		s    Step
		net  string
		line string
	}{
		{Step{At: 7 * time.Second, Action: ActNetPeers, Node: 2, Net: NetDrop, For: 7 * time.Second}, "drop n2<->peers", "+  7.00s net-peers drop n2 for 7.00s"},
		{Step{Action: ActNetEtcd, Node: 1, Net: NetReset}, "reset n1<->etcd", ""},
		{Step{Action: ActNetHalves, Side: []int{1, 3}, Net: NetDrop}, "drop {n1,n3}<->{n2,n4,n5}", ""},
		{Step{Action: ActNetBridge, Node: 3, Side: []int{1}, Net: NetReset}, "reset {n1}<->{n2,n4,n5} (bridge n3)", ""},
	} {
		if got := tt.s.NetString(5); got != tt.net {
			t.Errorf("NetString = %q, want %q", got, tt.net)
		}
		if got := tt.s.String(); tt.line != "" && got != tt.line {
			t.Errorf("String = %q, want %q", got, tt.line)
		}
	}
	if got := (Step{Action: ActNetBridge, Node: 3, Side: []int{1}}).CutOff(5); !slices.Equal(got, []int{1}) {
		t.Errorf("a bridge {n1} | {n2,n4,n5} cuts off %v, want the smaller side", got)
	}
	if got := (Step{Action: ActNetBridge, Node: 3, Side: []int{4, 1}}).CutOff(5); !slices.Equal(got, []int{2, 5}) {
		t.Errorf("a bridge {n1,n4} | {n2,n5} cuts off %v, want {n2,n5}, the side with the greatest node", got)
	}
	if got := (Step{Action: ActNetBridge, Node: 3, Side: []int{5, 1}}).CutOff(5); !slices.Equal(got, []int{1, 5}) {
		t.Errorf("a bridge {n1,n5} | {n2,n4} cuts off %v, want {n1,n5}, the side with the greatest node", got)
	}
	if got := (Step{Action: ActNetHalves, Side: []int{2, 4}}).CutOff(5); !slices.Equal(got, []int{2, 4}) {
		t.Errorf("halves cut off %v, want the minority", got)
	}
}
