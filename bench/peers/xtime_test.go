// SPDX-License-Identifier: Apache-2.0
// The same cases as bench/core_benchmark.cpp, on Go's golang.org/x/time/rate, for `make bench-peers`.
package peers

import (
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Admitted path, time passed in: 10^9 per second, now advancing 1 ns per check.
func BenchmarkAllowNowPassedIn(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e9), 1000)
	now := time.Now()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Nanosecond)
		lim.AllowN(now, 1)
	}
}

func BenchmarkAllowRefused(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1), 1)
	now := time.Now()
	lim.AllowN(now, 1)
	for i := 0; i < b.N; i++ {
		lim.AllowN(now, 1)
	}
}

func BenchmarkAllowClockRead(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e9), 1000000)
	for i := 0; i < b.N; i++ {
		lim.Allow()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for i := 0; i < b.N; i++ {
		_ = time.Now()
	}
}

// One limiter per key in a mutex-guarded map, random keys formatted into a local buffer (as the C++
// benchmark does), time passed in.
func keyed(b *testing.B, n int) {
	var mu sync.Mutex
	users := make(map[string]*rate.Limiter, n)
	buf := []byte("user:")
	for i := 0; i < n; i++ {
		users[string(strconv.AppendInt(buf[:5], int64(i), 10))] = rate.NewLimiter(rate.Limit(1), 1000000)
	}
	order := make([]int, 1<<20)
	r := rand.New(rand.NewSource(7))
	for i := range order {
		order[i] = r.Intn(n)
	}
	now := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := strconv.AppendInt(buf[:5], int64(order[i&(len(order)-1)]), 10)
		mu.Lock()
		lim, ok := users[string(key)]
		if !ok {
			lim = rate.NewLimiter(rate.Limit(1), 1000000)
			users[string(key)] = lim
		}
		lim.AllowN(now, 1)
		mu.Unlock()
	}
}

func BenchmarkKeyed100k(b *testing.B) { keyed(b, 100000) }
func BenchmarkKeyed1M(b *testing.B)   { keyed(b, 1000000) }
