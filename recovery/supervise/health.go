package supervise

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// HealthLimits configure the health task (DESIGN.md step 10).
type HealthLimits struct {
	// NotRespondingAfter: a node whose last activity is older is marked
	// not-responding. Several activity intervals, so one slow update does
	// not flap it.
	NotRespondingAfter time.Duration
	// RemoveAfter: a node record whose last activity is older is removed
	// (DESIGN.md step 10: a day by default). Its lease is still alive, or the record would be
	// gone already, so this catches a process that keeps its lease but
	// does nothing else.
	RemoveAfter time.Duration
	// StaleAfter is passed to claim.ResetStale: a running task not touched
	// for this long is put back to pending even if its claim stands.
	// Executors touch their task when it makes progress, so this is the
	// time without progress after which a rejoin counts as stuck; it must
	// exceed the executors' own stall window plus their touch interval (a
	// claim window), or a rejoin that moves on would be reset under its
	// executor (recovery/node sets the stall window plus two claim
	// windows).
	StaleAfter time.Duration
}

// HealthKind is what the health task does to a node record.
type HealthKind uint8

const (
	// HealthMarkNotResponding sets the record's status to not-responding.
	HealthMarkNotResponding HealthKind = iota + 1
	// HealthRemove deletes the record (and revokes its lease).
	HealthRemove
)

// HealthAction is one decision of the health task about one node.
type HealthAction struct {
	Kind   HealthKind
	Node   NodeRecord
	Reason string
}

func (a HealthAction) String() string {
	k := "mark-not-responding"
	if a.Kind == HealthRemove {
		k = "remove"
	}
	return fmt.Sprintf("%s %s: %s", k, a.Node.ID, a.Reason)
}

// CheckHealth is the node part of the health task, pure: nodes whose last
// activity is older than RemoveAfter are removed, those older than
// NotRespondingAfter and still ready are marked not-responding. The other
// two parts (expired claims, unprotected interim tasks) are
// claim.ResetStale, which the driver runs after this.
func CheckHealth(nodes []NodeRecord, now time.Time, lim HealthLimits) []HealthAction {
	var out []HealthAction
	for _, n := range nodes {
		idle := now.Sub(n.LastActive)
		switch {
		case idle > lim.RemoveAfter:
			out = append(out, HealthAction{Kind: HealthRemove, Node: n, Reason: fmt.Sprintf("last active %s ago (> %s)", idle, lim.RemoveAfter)})
		case idle > lim.NotRespondingAfter && n.Status != NodeNotResponding:
			out = append(out, HealthAction{Kind: HealthMarkNotResponding, Node: n, Reason: fmt.Sprintf("last active %s ago (> %s)", idle, lim.NotRespondingAfter)})
		}
	}
	slices.SortFunc(out, func(x, y HealthAction) int { return strings.Compare(x.Node.ID, y.Node.ID) })
	return out
}
