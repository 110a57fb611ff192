package supervise

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// stopPrefix holds the requests that a node's process stop gracefully
// (`rejoin drain --stop`): one key per node, its value the process's
// incarnation (NodeRecord.Started in Unix nanoseconds), so that a request
// left behind never stops a later process of the same id.
const stopPrefix = keyRoot + "stop/"

// StopKey is where a stop of node id is asked for.
func StopKey(id string) string { return stopPrefix + id }

// StopValue is the value of a stop request for the process of rec.
func StopValue(rec NodeRecord) string { return strconv.FormatInt(rec.Started.UnixNano(), 10) }

// AskStop asks the process registered as rec to stop gracefully: it
// refuses new calls, answers those in flight and goes (recovery/node
// watches StopKey). The request stands until that process takes it.
func AskStop(ctx context.Context, cli *clientv3.Client, rec NodeRecord) error {
	if _, err := cli.Put(ctx, StopKey(rec.ID), StopValue(rec)); err != nil {
		return fmt.Errorf("supervise: ask %s to stop: %w", rec.ID, err)
	}
	return nil
}
