package rota

import (
	"math/rand/v2"
	"time"
)

// Backoff is the schedule on which registrations and fallback watchers reconnect after
// losing their stream: exponential growth with full jitter. Retry n (counting from 0)
// waits a uniformly random duration in [0, Ceiling(n)], where Ceiling(n) is
// Initial·Factorⁿ capped at Max.
//
// Zero fields take the values of DefaultBackoff.
type Backoff struct {
	// Initial is the ceiling of the first retry.
	Initial time.Duration
	// Max caps the ceiling.
	Max time.Duration
	// Factor multiplies the ceiling after each failed retry; it must be at least 1.
	Factor float64
	// Rand, when set, is the source of the jitter (a seeded one makes delays
	// reproducible); nil uses the math/rand/v2 global source. A Client serializes its
	// calls to Delay, so the same Rand is never used concurrently by one Client.
	Rand *rand.Rand
}

// DefaultBackoff starts at 100 ms and doubles up to 10 s.
var DefaultBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Factor: 2}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Factor < 1 {
		b.Factor = DefaultBackoff.Factor
	}
	return b
}

// Ceiling returns the longest delay of retry attempt (0 for the first retry).
func (b Backoff) Ceiling(attempt int) time.Duration {
	b = b.withDefaults()
	ceiling := float64(b.Initial)
	for range max(attempt, 0) {
		ceiling *= b.Factor
		if ceiling >= float64(b.Max) {
			return b.Max
		}
	}
	return time.Duration(ceiling)
}

// Delay returns how long to wait before retry attempt (0 for the first retry): a uniformly
// random duration between 0 and Ceiling(attempt), inclusive.
func (b Backoff) Delay(attempt int) time.Duration {
	ceiling := b.Ceiling(attempt)
	if b.Rand != nil {
		return time.Duration(b.Rand.Int64N(int64(ceiling) + 1))
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}
