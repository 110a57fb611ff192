package node

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// TestAdminGating (issue 13): the fault points and Go's profiles answer
// 404 unless the node is started with them; /status and /metrics always
// answer.
func TestAdminGating(t *testing.T) {
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	off := c.startCfg(1, func(cfg *Config) { cfg.FaultPoints, cfg.Pprof = false, false })
	on := c.startCfg(2, nil) // the tests' nodes have both
	get := func(method, url string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		method, path string
		gated        bool
	}{
		{"GET", "/status", false},
		{"GET", "/metrics", false},
		{"GET", "/debug/pprof/", true},
		{"GET", "/debug/pprof/cmdline", true},
		{"GET", "/debug/pprof/goroutine?debug=1", true},
		{"POST", "/fault/hold?partition=0&rows=1", true},
		{"POST", "/fault/release?partition=0", true},
		{"POST", "/fault/cut-link?partition=0", true},
		{"POST", "/fault/pause-executor?partition=0&for=1s", true},
	} {
		gotOff := get(tc.method, "http://"+off.HTTP+tc.path)
		gotOn := get(tc.method, "http://"+on.HTTP+tc.path)
		if tc.gated && gotOff != http.StatusNotFound {
			t.Errorf("%s %s without the flag: %d, want 404", tc.method, tc.path, gotOff)
		}
		if !tc.gated && gotOff != http.StatusOK {
			t.Errorf("%s %s: %d, want 200", tc.method, tc.path, gotOff)
		}
		// Enabled, the route exists: a fault on a replica with no rejoin
		// is a 409, not a 404.
		if gotOn == http.StatusNotFound {
			t.Errorf("%s %s with the flag: 404", tc.method, tc.path)
		}
	}
	// Release the hold the enabled node took.
	_ = get("POST", "http://"+on.HTTP+"/fault/release?partition=0")
}

// TestAdminHTTPTLSOffLoopback: an admin HTTP off loopback is TLS with the
// node's certificate and wants a client certificate of the cluster's CA;
// /metrics answers a scraper that has one. (The tests bind loopback only:
// knobs.adminTLS makes it count as off loopback.)
func TestAdminHTTPTLSOffLoopback(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.knobs.adminTLS = true })
	if !strings.HasPrefix(a.HTTP, "https://") {
		t.Fatalf("admin HTTP registered as %q, want https://", a.HTTP)
	}
	scraper := testCreds(t, certs.ClientID("prometheus"))
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: scraper.DialConfig("n1")}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(a.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "rejoin_conns_unauthorized_total") {
		t.Fatalf("/metrics with a client certificate: %s %.200s", resp.Status, body)
	}
	noCert := scraper.DialConfig("n1")
	noCert.Certificates = nil
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: noCert}}
	defer plain.CloseIdleConnections()
	if _, err := plain.Get(a.HTTP + "/metrics"); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("/metrics without a client certificate: %v, want a refusal", err)
	}
}

// TestAdvertiseConfig (issue 13): a wildcard listen address without
// --advertise is refused with what to do; with it, the advertised host is
// registered with the bound port.
func TestAdvertiseConfig(t *testing.T) {
	base := Config{ID: 1, Etcd: []string{"x"}, DataDir: "d", Insecure: true}
	for _, tc := range []struct {
		listen, http, advertise string
		err                     string
	}{
		{"0.0.0.0:0", "", "", "--listen 0.0.0.0:0 is a wildcard address, which peers cannot dial: give --advertise"},
		{":7000", "", "", "--listen :7000 is a wildcard"},
		{"[::]:7000", "", "", "--listen [::]:7000 is a wildcard"},
		{"127.0.0.1:0", "0.0.0.0:0", "", "--http 0.0.0.0:0 is a wildcard"},
		{"0.0.0.0:0", "", "0.0.0.0", "--advertise 0.0.0.0 is a wildcard"},
		{"0.0.0.0:0", "", "10.1.2.3", ""},
		{"0.0.0.0:0", "", "node1.example:7000", ""},
	} {
		cfg := base
		cfg.Listen, cfg.HTTP, cfg.Advertise = tc.listen, tc.http, tc.advertise
		err := cfg.defaults()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("listen %q http %q advertise %q: %v, want %q", tc.listen, tc.http, tc.advertise, err, tc.err)
		}
	}
	cfg := base
	cfg.Listen, cfg.Advertise = "0.0.0.0:0", "10.1.2.3"
	if got := cfg.advertised(cfg.Listen, "[::]:4567", true); got != "10.1.2.3:4567" {
		t.Errorf("advertised %q", got)
	}
	cfg.Advertise = "node1.example:7000"
	if got := cfg.advertised(cfg.Listen, "[::]:4567", true); got != "node1.example:7000" {
		t.Errorf("advertised %q", got)
	}
	if got := cfg.advertised("0.0.0.0:0", "[::]:8080", false); got != "node1.example:8080" {
		t.Errorf("advertised HTTP %q", got)
	}
	if got := cfg.advertised("127.0.0.1:0", "127.0.0.1:8080", false); got != "127.0.0.1:8080" {
		t.Errorf("advertised loopback HTTP %q", got)
	}
}
