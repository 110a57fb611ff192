package load

import (
	"math/bits"
	"time"
)

// Histogram of latencies in microseconds, log-bucketed like HDR: exact
// below 64 µs, then 32 buckets per power of two (about 3% wide). The zero
// value is empty and ready; a Histogram is a value (copying copies it) and
// not safe for concurrent use.
type Histogram struct {
	counts [histBuckets]int64
	n      int64
	maxUs  int64
}

const (
	histSubBits = 5
	histSub     = 1 << histSubBits // buckets per power of two
	histLinear  = 2 * histSub      // exact buckets below this
	histExpMax  = 40               // up to 2^45 µs: beyond any latency
	histBuckets = histLinear + histExpMax*histSub
)

func histIndex(us int64) int {
	if us < histLinear {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - (histSubBits + 1) // >= 1
	if e > histExpMax {
		return histBuckets - 1
	}
	return histLinear + (e-1)*histSub + int(us>>e) - histSub
}

// histBounds returns bucket i's lowest and highest value.
func histBounds(i int) (lo, hi int64) {
	if i < histLinear {
		return int64(i), int64(i)
	}
	e := (i-histLinear)/histSub + 1
	sub := int64((i-histLinear)%histSub + histSub)
	return sub << e, (sub+1)<<e - 1
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	us := d.Microseconds()
	h.counts[histIndex(us)]++
	h.n++
	h.maxUs = max(h.maxUs, us)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.maxUs = max(h.maxUs, o.maxUs)
}

// Sub returns the latencies recorded in h and not in earlier, an older
// copy of the same histogram: the window between the two. Its Max is the
// top of the highest bucket used, capped by h's max.
func (h *Histogram) Sub(earlier *Histogram) Histogram {
	var w Histogram
	for i := range h.counts {
		w.counts[i] = h.counts[i] - earlier.counts[i]
		if w.counts[i] > 0 {
			_, hi := histBounds(i)
			w.maxUs = min(hi, h.maxUs)
		}
	}
	w.n = h.n - earlier.n
	return w
}

// Count is the number of latencies recorded.
func (h *Histogram) Count() int64 { return h.n }

// Max is the highest latency recorded.
func (h *Histogram) Max() time.Duration { return time.Duration(h.maxUs) * time.Microsecond }

// Quantile returns the latency at quantile q in [0, 1] (the middle of its
// bucket, never above Max); 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := histBounds(i)
			return time.Duration(min((lo+hi)/2, h.maxUs)) * time.Microsecond
		}
	}
	return h.Max()
}
