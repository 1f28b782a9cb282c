// SPDX-License-Identifier: Apache-2.0
// xtime_oracle runs token-bucket traces through Go's golang.org/x/time/rate and prints its answers,
// for token_bucket_differential_test (which runs the same traces through sluice::token_bucket).
//
// Built with Debian's golang-go and golang-golang-x-time-dev, no module download:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o xtime_oracle xtime_oracle.go
//
// Input, one operation a line; times are ns from the trace's origin, intervals ns per token:
//
//	T <interval|inf> <burst>      a new limiter: NewLimiter(1e9/interval, burst)
//	A <t> <n>                     AllowN
//	R <t> <n>                     ReserveN; reservations are numbered from 0 in each trace
//	C <t> <k>                     CancelAt on reservation k
//	L <t> <interval|inf>          SetLimitAt
//	B <t> <burst> <interval|inf>  SetBurstAt, then SetLimitAt if the interval changed with the burst
//	K <t>                         TokensAt
//
// Output, one line an operation: the time it was evaluated at, then
//
//	A: t' ok tokens_before tokens_after retry_ns last   R: t' ok delay_ns tokens_before tokens_after last
//	C, L, B, K: t' tokens_before tokens_after last      T: the limiter's limit and burst
//
// retry_ns is the wait ReserveN would have given (x/time/rate's own arithmetic), -1 for never; last
// is the limiter's `last` afterwards (ns from the origin; below 0 before anything was recorded).
//
// The one tolerance applied here: time going backwards counts as no time, so an operation at t is
// given max(t, last), `last` being the limiter's own record of the latest time it changed.
package main

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/time/rate"
)

// Times are an origin plus ns; the origin is 2^62 ns after the zero Time, so that a new limiter
// (last = zero Time) starts full for every rate and burst sluice can hold (burst × interval <= 2^62).
var origin = time.Time{}.Add(time.Duration(1) << 62)

// The offset of Limiter.last, read (never written) to apply the tolerance above.
var lastOffset = func() uintptr {
	f, ok := reflect.TypeOf((*rate.Limiter)(nil)).Elem().FieldByName("last")
	if !ok || f.Type != reflect.TypeOf(time.Time{}) {
		fmt.Fprintln(os.Stderr, "xtime_oracle: rate.Limiter has no field last time.Time")
		os.Exit(2)
	}
	return f.Offset
}()

func last(l *rate.Limiter) time.Time {
	return *(*time.Time)(unsafe.Pointer(uintptr(unsafe.Pointer(l)) + lastOffset))
}

func limitOf(s string) rate.Limit {
	if s == "inf" {
		return rate.Inf
	}
	return rate.Limit(1e9 / float64(mustInt(s)))
}

func mustInt(s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xtime_oracle: bad number", s)
		os.Exit(2)
	}
	return v
}

func g(f float64) string { return strconv.FormatFloat(f, 'g', 17, 64) }

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var lim *rate.Limiter
	var reservations []*rate.Reservation
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "T" {
			lim = rate.NewLimiter(limitOf(f[1]), int(mustInt(f[2])))
			reservations = nil
			fmt.Fprintln(out, "T", g(float64(lim.Limit())), lim.Burst())
			continue
		}
		t := origin.Add(time.Duration(mustInt(f[1])))
		if l := last(lim); t.Before(l) {
			t = l
		}
		at := t.Sub(origin).Nanoseconds()
		before := lim.TokensAt(t)
		switch f[0] {
		case "A":
			n := int(mustInt(f[2]))
			ok := lim.AllowN(t, n)
			retry := int64(0)
			if !ok {
				retry = -1
				if l := lim.Limit(); n <= lim.Burst() && l > 0 {
					retry = int64(time.Duration(float64(time.Second) * (float64(n) - before) / float64(l)))
				}
			}
			fmt.Fprintln(out, "A", at, b2i(ok), g(before), g(lim.TokensAt(t)), retry, last(lim).Sub(origin).Nanoseconds())
		case "R":
			r := lim.ReserveN(t, int(mustInt(f[2])))
			reservations = append(reservations, r)
			delay := int64(-1)
			if r.OK() {
				delay = int64(r.DelayFrom(t))
			}
			fmt.Fprintln(out, "R", at, b2i(r.OK()), delay, g(before), g(lim.TokensAt(t)), last(lim).Sub(origin).Nanoseconds())
		case "C":
			reservations[mustInt(f[2])].CancelAt(t)
			fmt.Fprintln(out, "C", at, g(before), g(lim.TokensAt(t)), last(lim).Sub(origin).Nanoseconds())
		case "L":
			lim.SetLimitAt(t, limitOf(f[2]))
			fmt.Fprintln(out, "L", at, g(before), g(lim.TokensAt(t)), last(lim).Sub(origin).Nanoseconds())
		case "B":
			lim.SetBurstAt(t, int(mustInt(f[2])))
			if l := limitOf(f[3]); l != lim.Limit() {
				lim.SetLimitAt(t, l)
			}
			fmt.Fprintln(out, "B", at, g(before), g(lim.TokensAt(t)), last(lim).Sub(origin).Nanoseconds())
		case "K":
			fmt.Fprintln(out, "K", at, g(before), g(before), last(lim).Sub(origin).Nanoseconds())
		default:
			fmt.Fprintln(os.Stderr, "xtime_oracle: unknown operation", f[0])
			os.Exit(2)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
