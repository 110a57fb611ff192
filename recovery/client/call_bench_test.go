package client

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCall measures the client's side of a call: upserts of a 16-byte
// key and a 100-byte value by callers concurrent callers over one
// connection to a fake node (clienttest) in the same process, which
// answers each at once. ns/op is the inverse of the calls per second, the
// fake node's work included.
//
//	go test -run '^$' -bench BenchmarkCall -benchtime 50000x ./recovery/client/
func BenchmarkCall(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			v := newEnv(b, 4, 1, nil)
			c := v.open(b, Options{})
			ctx := testCtx(b, 5*time.Minute)
			value := string(make([]byte, 100))
			if _, err := c.Upsert(ctx, "kv", kv("warm", value)...); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprintf("key-%012d", i), value)...); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
