package node

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
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
		{"POST", "/fault/pause-holder?partition=0&for=1s", true},
	} {
		gotOff := get(tc.method, "http://"+off.HTTP+tc.path)
		gotOn := get(tc.method, "http://"+on.HTTP+tc.path)
		if tc.gated && gotOff != http.StatusNotFound {
			t.Errorf("%s %s without the flag: %d, want 404", tc.method, tc.path, gotOff)
		}
		if !tc.gated && gotOff != http.StatusOK {
			t.Errorf("%s %s: %d, want 200", tc.method, tc.path, gotOff)
		}
		// Enabled, the route exists: asked without the admin's
		// certificate it is a 403 (TestAdminEndpointsNeedAdmin), not a 404.
		if gotOn == http.StatusNotFound {
			t.Errorf("%s %s with the flag: 404", tc.method, tc.path)
		}
	}
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
		{"0.0.0.0:0", "", "[::1]:7000", ""},
		{"0.0.0.0:0", "", "fd00::1", ""},
		{"0.0.0.0:0", "", "a b", `--advertise "a b": want HOST or HOST:PORT`},
		{"0.0.0.0:0", "", "node1:http", `--advertise "node1:http"`},
		{"0.0.0.0:0", "", "node1:70000", `--advertise "node1:70000"`},
		{"0.0.0.0:0", "", "node1:", `--advertise "node1:"`},
		{"0.0.0.0:0", "", "node_1", `--advertise "node_1"`},
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

// TestAdminHTTPBounds (issue 24, 1): the admin HTTP holds at most its
// connection cap at once, closes a connection that does not finish its
// request header within its timeout, and one left idle after a request.
func TestAdminHTTPBounds(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) {
		cfg.knobs.adminConnsMax = 2
		cfg.knobs.adminTimeout = 300 * time.Millisecond
	})
	dial := func() net.Conn {
		nc, err := net.DialTimeout("tcp", a.HTTP, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	// closed reports whether the node closed nc: a read finds EOF (or a
	// reset) rather than its deadline.
	closed := func(nc net.Conn, within time.Duration) bool {
		if err := nc.SetReadDeadline(time.Now().Add(within)); err != nil {
			t.Fatal(err)
		}
		_, err := io.Copy(io.Discard, nc)
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}
	var held []net.Conn
	for range 2 {
		nc := dial()
		if _, err := nc.Write([]byte("GET /status HTTP/1.1\r\nHost: x\r\n")); err != nil { // no end of header
			t.Fatal(err)
		}
		held = append(held, nc)
	}
	third := dial()
	if _, err := third.Write([]byte("GET /status HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := third.SetReadDeadline(time.Now().Add(15 * time.Second)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(third)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("third connection, with two half-sent headers holding the cap of 2: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status: %s", resp.Status)
	}
	// It was served only once a held one was dropped: over the cap, a
	// connection waits in the listen queue.
	if !closed(held[0], 100*time.Millisecond) && !closed(held[1], 100*time.Millisecond) {
		t.Errorf("a third connection was served while both connections of the cap of 2 were open")
	}
	// Kept alive after its request and left idle, it is closed.
	if !closed(third, 10*time.Second) {
		t.Errorf("an idle keep-alive connection to the admin HTTP still open 10 s past an idle timeout of 300 ms")
	}
}

// adminClient is an HTTP client with the credentials of id, for the admin
// HTTP over TLS.
func adminClient(t testing.TB, id certs.Identity) *http.Client {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: testCreds(t, id).DialConfig("")}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// TestAdminEndpointsNeedAdmin (issue 24, 8): fault points and profiles,
// enabled, answer only a client certificate of the admin identity, on
// loopback too; /status and /metrics answer as before.
func TestAdminEndpointsNeedAdmin(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, nil) // the tests' nodes have both
	do := func(hc *http.Client, method, url string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	defer plain.CloseIdleConnections()
	other, root := adminClient(t, certs.ClientID("test")), adminClient(t, certs.ClientID(certs.AdminName))
	for _, tc := range []struct{ method, path string }{
		{"POST", "/fault/release?partition=0"},
		{"GET", "/debug/pprof/cmdline"},
	} {
		if code, body := do(plain, tc.method, "http://"+a.HTTP+tc.path); code != http.StatusForbidden || !strings.Contains(body, certs.AdminName) {
			t.Errorf("%s %s without a certificate: %d %q, want 403 naming the admin identity", tc.method, tc.path, code, body)
		}
		if code, body := do(other, tc.method, "https://"+a.HTTP+tc.path); code != http.StatusForbidden {
			t.Errorf("%s %s as client:test: %d %q, want 403", tc.method, tc.path, code, body)
		}
		if code, body := do(root, tc.method, "https://"+a.HTTP+tc.path); code != http.StatusOK {
			t.Errorf("%s %s as the admin: %d %q, want 200", tc.method, tc.path, code, body)
		}
	}
	for _, hc := range []*http.Client{plain, other} {
		scheme := "http://"
		if hc != plain {
			scheme = "https://"
		}
		if code, body := do(hc, "GET", scheme+a.HTTP+"/status"); code != http.StatusOK {
			t.Errorf("GET %s/status: %d %q", scheme, code, body)
		}
	}
}
