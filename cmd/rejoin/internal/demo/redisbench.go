package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/txnid"
)

// The Redis bench (`rejoin bench --redis`) is the yardstick beside the
// across-process bench: the same rows and the same open-loop writer, and
// in place of n2's rejoin a fresh Redis replica's full resync of every key
// from its master, in the mode the issue measured: diskless sync on the
// master, diskless load on the replica. Its figures go in a BenchSummary,
// in the fields that mean the same thing, so the two runs' JSON objects
// are read with the same names.

// RedisSettings are the servers' settings beside the loopback port and
// their own directory, master and replica alike. Redis 7.0's redis.conf:
// repl-diskless-sync streams the RDB to the replica over the socket with
// no file on the master's disk; a delay of 0 starts it at once instead of
// waiting 5 s for more replicas; repl-diskless-load on-empty-db parses
// the RDB from the socket when the replica's dataset is empty, which a
// fresh replica's is ("swapdb" would also keep a copy of the old dataset
// in memory while it loads: nothing here). No persistence, so no disk
// enters the measurement; DEBUG DIGEST allowed from loopback only.
var RedisSettings = []string{
	"repl-diskless-sync", "yes",
	"repl-diskless-sync-delay", "0",
	"repl-diskless-load", "on-empty-db",
	"save", "",
	"appendonly", "no",
	"enable-debug-command", "local",
}

// Limits of a Redis bench.
const (
	redisReadyTimeout  = 30 * time.Second // from exec to an answered PING
	redisStopGrace     = 3 * time.Second  // SIGTERM to SIGKILL at the end
	redisPollInterval  = 5 * time.Millisecond
	redisQuietTimeout  = time.Minute // writer stopped to equal offsets
	redisLoadBatchRows = 1000        // SETs per pipelined round trip
	redisLoaders       = 4           // loading connections
	redisLogTailLines  = 10          // of a server's log, in an error
	redisDigestTimeout = 5 * time.Minute
)

// RedisConfig is a Redis bench.
type RedisConfig struct {
	// Server is the redis-server binary; "" finds it in PATH.
	Server string
	// Rows are loaded into the master before the replica syncs, keys of
	// 16 bytes and values of ValueBytes, bench/load's shape.
	Rows, ValueBytes int
	// WriteRate is the writer's offered writes per second, through
	// Writers connections to the master; an offer that finds every one
	// busy is missed, not queued.
	WriteRate, Writers int
	// Before is the writer's measured interval before REPLICAOF; Timeout
	// bounds the whole run.
	Before, Timeout time.Duration
	// JSON prints one JSON object instead of text.
	JSON bool
}

// RedisRun is what only a Redis bench reports (BenchSummary.Redis).
type RedisRun struct {
	// Version is the servers' redis_version; Server the binary run.
	Version string `json:"version"`
	Server  string `json:"server"`
	// Settings are RedisSettings, "name value" each.
	Settings []string `json:"settings"`
	// ReplBytes is what the master sent its replica from REPLICAOF to in
	// sync (INFO stats total_net_repl_output_bytes): the RDB and the
	// writes since its fork. -1 if the server does not report it.
	ReplBytes int64 `json:"repl_bytes"`
	// MasterKeys and ReplicaKeys (DBSIZE) and MasterDigest and
	// ReplicaDigest (DEBUG DIGEST, over every key and value) were read
	// once the writer had stopped and both replication offsets were
	// equal.
	MasterKeys    int64  `json:"master_keys"`
	ReplicaKeys   int64  `json:"replica_keys"`
	MasterDigest  string `json:"master_digest"`
	ReplicaDigest string `json:"replica_digest"`
	Offset        int64  `json:"offset"`
}

// ErrNoRedisServer is returned when no redis-server binary is found.
var ErrNoRedisServer = errors.New("demo: redis-server not found in PATH (install it, e.g. `apt-get install redis-server`, or give its path with --redis-server)")

// FindRedisServer returns the path of the redis-server to run: server if
// set, else the one in PATH.
func FindRedisServer(server string) (string, error) {
	if server == "" {
		server = "redis-server"
	}
	p, err := exec.LookPath(server)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) && server == "redis-server" {
			return "", ErrNoRedisServer
		}
		return "", fmt.Errorf("demo: redis server %q: %w", server, err)
	}
	return p, nil
}

// Check returns cfg with its server's path, or an error if cfg cannot
// run.
func (cfg RedisConfig) Check() (RedisConfig, error) {
	switch {
	case cfg.Rows < 1:
		return cfg, fmt.Errorf("demo: --rows %d: want 1 or more", cfg.Rows)
	case cfg.ValueBytes < 1:
		return cfg, fmt.Errorf("demo: --value-bytes %d: want 1 or more", cfg.ValueBytes)
	case cfg.WriteRate <= 0:
		return cfg, fmt.Errorf("demo: --write-rate %d: the bench offers a fixed rate, so 1 or more", cfg.WriteRate)
	case cfg.Writers < 1:
		return cfg, fmt.Errorf("demo: --writers %d: want 1 or more", cfg.Writers)
	case cfg.Before <= 0:
		return cfg, fmt.Errorf("demo: --before %v: want more than 0", cfg.Before)
	case cfg.Timeout <= 0:
		return cfg, fmt.Errorf("demo: --timeout %v: want more than 0", cfg.Timeout)
	}
	var err error
	cfg.Server, err = FindRedisServer(cfg.Server)
	return cfg, err
}

// BenchRedis runs a Redis bench and prints its summary on out: text, or
// one JSON object with cfg.JSON. It starts a master and a replica, each
// in its own temporary directory, and stops both by pid and removes the
// directories before it returns, also when ctx ends. It returns ErrCheck
// (wrapped) when the replica's content differs from the master's.
func BenchRedis(ctx context.Context, cfg RedisConfig, out io.Writer) (BenchSummary, error) {
	cfg, err := cfg.Check()
	if err != nil {
		return BenchSummary{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "rejoin-bench-redis-")
	if err != nil {
		return BenchSummary{}, err
	}
	defer os.RemoveAll(dir)
	var servers []*redisProc
	defer func() {
		for _, s := range servers {
			s.stop(redisStopGrace)
		}
	}()
	for _, name := range []string{"master", "replica"} {
		s, err := startRedis(ctx, cfg.Server, filepath.Join(dir, name))
		if err != nil {
			return BenchSummary{}, err
		}
		servers = append(servers, s)
	}
	master, replica := servers[0], servers[1]
	mc, rc := newRedisClient(master.addr, cfg.Writers+redisLoaders), newRedisClient(replica.addr, 2)
	defer mc.Close()
	defer rc.Close()

	sum, err := benchRedis(ctx, cfg, master, replica, mc, rc)
	if err != nil {
		return sum, err
	}
	if cfg.JSON {
		err = WriteBenchJSON(out, sum)
	} else {
		err = WriteBenchText(out, sum)
	}
	if err == nil && !sum.DigestsMatch {
		err = fmt.Errorf("%w: the replica's content differs from the master's (%d keys, digest %s; master %d keys, %s)",
			ErrCheck, sum.Redis.ReplicaKeys, sum.Redis.ReplicaDigest, sum.Redis.MasterKeys, sum.Redis.MasterDigest)
	}
	return sum, err
}

func benchRedis(ctx context.Context, cfg RedisConfig, master, replica *redisProc, mc, rc *redis.Client) (BenchSummary, error) {
	sum := BenchSummary{OfferedWritesPerSec: float64(cfg.WriteRate)}
	sum.Nodes, sum.Partitions, sum.Replicas = 2, 1, 2
	sum.Gateway, sum.Victim = "master", "replica"
	run := &RedisRun{Server: cfg.Server, ReplBytes: -1}
	for i := 0; i < len(RedisSettings); i += 2 {
		run.Settings = append(run.Settings, RedisSettings[i]+" "+strconv.Quote(RedisSettings[i+1]))
	}
	sum.Redis = run
	info, err := redisInfo(ctx, mc, "server")
	if err != nil {
		return sum, err
	}
	run.Version = info["redis_version"]

	start := time.Now()
	if err := redisLoad(ctx, mc, cfg.Rows, cfg.ValueBytes); err != nil {
		return sum, err
	}
	sum.LoadRows = cfg.Rows
	sum.LoadRowsPerSec = float64(cfg.Rows) / time.Since(start).Seconds()

	// The bench's open-loop writer (bench/load's Generator): an offer due
	// at the fixed rate goes to a free connection or, if every one is
	// busy, is missed and not queued.
	w, err := startWriter(ctx, redisPut(mc), false, cfg.Rows, cfg.ValueBytes, cfg.WriteRate, cfg.Writers)
	if err != nil {
		return sum, err
	}
	defer w.Stop()
	if err := sleepCtx(ctx, cfg.Before); err != nil {
		return sum, err
	}
	before := w.Phase()
	sent0 := redisReplBytes(ctx, mc)

	// The resync: REPLICAOF, then the link up with no sync in progress
	// (the RDB is loaded), then the replica's offset at the master's of
	// that moment (the writes since the fork applied too): in sync.
	t0 := time.Now()
	host, port, _ := net.SplitHostPort(master.addr)
	if err := rc.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		return sum, fmt.Errorf("demo: redis bench: REPLICAOF: %w", err)
	}
	var linkUp time.Time
	var target int64
	for {
		if err := replica.exited(); err != nil {
			return sum, err
		}
		ri, err := redisInfo(ctx, rc, "replication")
		if err != nil {
			return sum, err
		}
		if linkUp.IsZero() && ri["master_link_status"] == "up" && ri["master_sync_in_progress"] == "0" {
			linkUp = time.Now()
			if sum.Rows, err = rc.DBSize(ctx).Result(); err != nil {
				return sum, err
			}
			mi, err := redisInfo(ctx, mc, "replication")
			if err != nil {
				return sum, err
			}
			target = infoInt(mi, "master_repl_offset")
		}
		if !linkUp.IsZero() && infoInt(ri, "slave_repl_offset") >= target {
			break
		}
		if err := sleepCtx(ctx, redisPollInterval); err != nil {
			return sum, fmt.Errorf("demo: redis bench: replica not in sync: %w", err)
		}
	}
	done := time.Now()
	during := w.Phase()
	if sent := redisReplBytes(ctx, mc); sent0 >= 0 && sent >= sent0 {
		run.ReplBytes = sent - sent0
	}
	w.Stop()

	sum.SnapshotRows = sum.Rows
	sum.Bytes = sum.Rows * int64(keyBytes+cfg.ValueBytes)
	sum.RejoinSeconds = done.Sub(t0).Seconds()
	sum.StreamSeconds = linkUp.Sub(t0).Seconds()
	if sum.StreamSeconds > 0 {
		sum.RowsPerSec = float64(sum.Rows) / sum.StreamSeconds
		sum.MBPerSec = float64(sum.Bytes) / 1e6 / sum.StreamSeconds
	}
	sum.WritesPerSecBefore, sum.WriteP99MsBefore = before.PerSec, ms(before.P99)
	sum.WritesPerSecDuring, sum.WriteP99MsDuring = during.PerSec, ms(during.P99)
	sum.WriteErrors = w.report.Errors
	sum.ServedRatioBefore, sum.ServedRatioDuring = before.PerSec/sum.OfferedWritesPerSec, during.PerSec/sum.OfferedWritesPerSec
	sum.WritesDuring, sum.WritesMissedDuring = during.Writes, during.Missed

	// The check, at a quiet point: the writer stopped and both offsets
	// equal (the master's pings to its replica move its offset too, so
	// both are read again until they agree).
	deadline := time.Now().Add(redisQuietTimeout)
	for {
		mi, err := redisInfo(ctx, mc, "replication")
		if err != nil {
			return sum, err
		}
		ri, err := redisInfo(ctx, rc, "replication")
		if err != nil {
			return sum, err
		}
		if off := infoInt(mi, "master_repl_offset"); off == infoInt(ri, "slave_repl_offset") && ri["master_link_status"] == "up" {
			run.Offset = off
			break
		}
		if time.Now().After(deadline) {
			return sum, fmt.Errorf("demo: redis bench: offsets not equal %v after the writer stopped", redisQuietTimeout)
		}
		if err := sleepCtx(ctx, redisPollInterval); err != nil {
			return sum, err
		}
	}
	for _, x := range []struct {
		addr   string
		keys   *int64
		digest *string
	}{{master.addr, &run.MasterKeys, &run.MasterDigest}, {replica.addr, &run.ReplicaKeys, &run.ReplicaDigest}} {
		// DEBUG DIGEST reads every key and value in one command: some
		// seconds per million keys, past the clients' default 3 s.
		opt := redisOptions(x.addr, 1)
		opt.ReadTimeout = redisDigestTimeout
		c := redis.NewClient(opt)
		err := redisCheck(ctx, c, x.keys, x.digest)
		c.Close()
		if err != nil {
			return sum, err
		}
	}
	sum.ReplicasChecked = 2
	sum.DigestsMatch = run.MasterKeys == run.ReplicaKeys && run.MasterDigest == run.ReplicaDigest
	return sum, nil
}

// redisCheck reads c's key count and its dataset's digest.
func redisCheck(ctx context.Context, c *redis.Client, keys *int64, digest *string) error {
	var err error
	if *keys, err = c.DBSize(ctx).Result(); err != nil {
		return fmt.Errorf("demo: redis bench: DBSIZE: %w", err)
	}
	if *digest, err = c.Do(ctx, "DEBUG", "DIGEST").Text(); err != nil {
		return fmt.Errorf("demo: redis bench: DEBUG DIGEST: %w", err)
	}
	return nil
}

// writeRedisBenchText prints a Redis bench's summary for a reader.
func writeRedisBenchText(w io.Writer, s BenchSummary) error {
	r := s.Redis
	verdict := "OK"
	if !s.DigestsMatch {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "\n== rejoin bench --redis: %s ==\n", verdict)
	fmt.Fprintf(w, "servers     redis %s (%s): a master and a fresh replica on loopback; %s\n", r.Version, r.Server, strings.Join(r.Settings, ", "))
	fmt.Fprintf(w, "load        %d rows at %.0f rows/s\n", s.LoadRows, s.LoadRowsPerSec)
	fmt.Fprintf(w, "resync      REPLICAOF to in sync (link up, no sync in progress, offset caught up): %d keys, %.1f MB (%.1f MB sent); %.2f s\n",
		s.Rows, float64(s.Bytes)/1e6, float64(r.ReplBytes)/1e6, s.RejoinSeconds)
	fmt.Fprintf(w, "stream      %.2f s to the link up: %.0f rows/s, %.1f MB/s\n", s.StreamSeconds, s.RowsPerSec, s.MBPerSec)
	writeBenchWrites(w, s, "before REPLICAOF", "during the resync")
	match := "equal"
	if !s.DigestsMatch {
		match = "DIFFERENT"
	}
	fmt.Fprintf(w, "content     %s at offset %d: master %d keys, digest %s; replica %d keys, digest %s\n",
		match, r.Offset, r.MasterKeys, r.MasterDigest, r.ReplicaKeys, r.ReplicaDigest)
	return nil
}

// redisProc is one redis-server process, ours: stopped by its pid.
type redisProc struct {
	name, addr, dir string
	cmd             *exec.Cmd
	done            chan struct{} // closed once Wait returned
	err             error         // Wait's, valid after done
}

// startRedis runs redis-server on a free loopback port with dir its
// working directory, and waits until it answers PING.
func startRedis(ctx context.Context, server, dir string) (*redisProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"--bind", host, "--port", port, "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no"}
	for i := 0; i < len(RedisSettings); i += 2 {
		args = append(args, "--"+RedisSettings[i], RedisSettings[i+1])
	}
	// Not CommandContext: stop ends it, by pid, and waits.
	cmd := exec.Command(server, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start %s: %w", server, err)
	}
	p := &redisProc{name: filepath.Base(dir), addr: addr, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c := newRedisClient(addr, 1)
	defer c.Close()
	deadline := time.Now().Add(redisReadyTimeout)
	for {
		if err := p.exited(); err != nil {
			return nil, err
		}
		if c.Ping(ctx).Err() == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.stop(0)
			return nil, fmt.Errorf("demo: redis %s not answering after %v%s", p.name, redisReadyTimeout, p.logTail())
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			p.stop(0)
			return nil, err
		}
	}
}

// exited is an error, with the end of its log, if p has exited.
func (p *redisProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("demo: redis %s exited (%v)%s", p.name, p.err, p.logTail())
	default:
		return nil
	}
}

func (p *redisProc) logTail() string {
	f, err := os.Open(filepath.Join(p.dir, "redis.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > redisLogTailLines {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "; its log ends:\n  " + strings.Join(lines, "\n  ")
}

// stop sends SIGTERM, then SIGKILL after grace (0: at once), and waits.
func (p *redisProc) stop(grace time.Duration) { stopChild(p.cmd, p.done, grace) }

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func newRedisClient(addr string, conns int) *redis.Client {
	return redis.NewClient(redisOptions(addr, conns))
}

// redisOptions: RESP2 and no CLIENT SETINFO or maintenance notifications,
// which Redis 7.0 does not know; conns connections at most.
func redisOptions(addr string, conns int) *redis.Options {
	return &redis.Options{Addr: addr, PoolSize: conns, Protocol: 2, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}
}

// redisInfo is INFO section as a map.
func redisInfo(ctx context.Context, c *redis.Client, section string) (map[string]string, error) {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("demo: redis bench: INFO %s: %w", section, err)
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

func infoInt(m map[string]string, k string) int64 {
	n, err := strconv.ParseInt(m[k], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// redisReplBytes is the master's replication bytes sent so far, -1 if it
// does not say.
func redisReplBytes(ctx context.Context, c *redis.Client) int64 {
	m, err := redisInfo(ctx, c, "stats")
	if err != nil {
		return -1
	}
	return infoInt(m, "total_net_repl_output_bytes")
}

// redisLoad SETs rows 0..rows-1 (load.Key, load.Value at version 0: the
// rows `rejoin bench --processes` loads) in pipelined batches.
func redisLoad(ctx context.Context, c *redis.Client, rows, valueBytes int) error {
	var next atomic.Int64
	errs := make([]error, redisLoaders)
	var wg sync.WaitGroup
	for l := range redisLoaders {
		wg.Go(func() {
			for {
				lo := int(next.Add(redisLoadBatchRows)) - redisLoadBatchRows
				if lo >= rows || ctx.Err() != nil {
					return
				}
				p := c.Pipeline()
				for i := lo; i < min(lo+redisLoadBatchRows, rows); i++ {
					p.Set(ctx, string(load.Key(uint64(i), keyBytes)), load.Value(uint64(i), 0, valueBytes), 0)
				}
				if _, err := p.Exec(ctx); err != nil {
					errs[l] = fmt.Errorf("demo: redis bench: load rows from %d: %w", lo, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("demo: redis bench: load: %w", err)
	}
	return errors.Join(errs...)
}

// redisPut is the writer's Put against a Redis master: one SET, with no
// txn ID (the run records no acknowledged writes: the digests check it).
func redisPut(c *redis.Client) load.Put {
	return func(ctx context.Context, _ string, key, value []byte) (txnid.ID, error) {
		return txnid.Zero, c.Set(ctx, string(key), value, 0).Err()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
