package node

import (
	"testing"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestReplyWhenReplicasLost: a call's reply once nothing is waited for. A
// txn that went out and lost every replica it waited for is uncertain
// (it may have run on one of them); one that reached no feed at all is a
// plain failure; a replica's result is the answer.
func TestReplyWhenReplicasLost(t *testing.T) {
	tests := []struct {
		name          string
		sent          bool
		answer        *wire.Done // from n1 before n2 is lost, if any
		wantUncertain bool
		wantErr       bool
	}{
		{name: "sent, every replica lost", sent: true, wantUncertain: true, wantErr: true},
		{name: "never sent", sent: false, wantErr: true},
		{name: "one answered, the other lost", sent: true, answer: &wire.Done{Partition: 0, ID: 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &initiator{pending: map[txnid.ID]*call{}}
			var got []*wire.Reply
			c := &call{req: &wire.Call{Req: 3}, id: 7, waiting: map[string]bool{"n1": true, "n2": true}, sent: tt.sent,
				send: func(r *wire.Reply) { got = append(got, r) }}
			in.pending[c.id] = c
			if tt.answer != nil {
				in.onDone("n1", tt.answer)
			} else {
				in.dropNode("n1")
			}
			if len(got) != 0 {
				t.Fatalf("answered while n2 is waited for: %+v", got[0])
			}
			in.dropNode("n2")
			if len(got) != 1 {
				t.Fatalf("%d replies, want 1", len(got))
			}
			r := got[0]
			if r.Uncertain != tt.wantUncertain || (r.Err != "") != tt.wantErr || r.Req != 3 || r.ID != 7 {
				t.Fatalf("reply %+v; want uncertain %v, error %v", r, tt.wantUncertain, tt.wantErr)
			}
			if len(in.pending) != 0 {
				t.Fatal("call still pending")
			}
		})
	}
}
