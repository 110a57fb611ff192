package partition

import "fmt"

// checkDigest is the expensive check run after every transaction under the
// invariants build tag: each table's full structure (slots, index, arena)
// is verified, and the running digest must equal one recomputed from every
// stored row. A mismatch is a bug in the storage, so it panics.
func checkDigest(p *Partition) {
	if !invariantsEnabled {
		return
	}
	for _, t := range p.Tables() {
		if err := t.verify(); err != nil {
			panic(fmt.Sprintf("partition: invariant broken in table %q: %v", t.Schema().Name, err))
		}
	}
	if got, want := p.Digest(), p.recomputeDigest(); got != want {
		panic(fmt.Sprintf("partition: running digest %x, recomputed %x", got, want))
	}
}
