package rota

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBackoffCeilingDoublesUpToTheCap(t *testing.T) {
	want := []time.Duration{
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 10 * time.Second, 10 * time.Second,
	}
	for attempt, w := range want {
		if got := DefaultBackoff.Ceiling(attempt); got != w {
			t.Errorf("Ceiling(%d) = %s, want %s", attempt, got, w)
		}
	}
	if got := DefaultBackoff.Ceiling(10_000); got != 10*time.Second {
		t.Errorf("Ceiling(10000) = %s, want the 10s cap", got)
	}
	if got := DefaultBackoff.Ceiling(-1); got != 100*time.Millisecond {
		t.Errorf("Ceiling(-1) = %s, want 100ms", got)
	}
}

func TestBackoffZeroValueTakesTheDefaults(t *testing.T) {
	var zero Backoff
	for attempt := range 12 {
		if got, want := zero.Ceiling(attempt), DefaultBackoff.Ceiling(attempt); got != want {
			t.Errorf("Ceiling(%d) = %s, want %s", attempt, got, want)
		}
	}
}

func TestBackoffCustomSchedule(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 5 * time.Second, Factor: 3}
	got := []time.Duration{b.Ceiling(0), b.Ceiling(1), b.Ceiling(2), b.Ceiling(3)}
	want := []time.Duration{time.Second, 3 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("ceilings %v, want %v", got, want)
	}
}

func TestBackoffFullJitterStaysWithinTheCeiling(t *testing.T) {
	b := DefaultBackoff
	b.Rand = rand.New(rand.NewPCG(1, 2))
	for attempt := range 10 {
		ceiling := b.Ceiling(attempt)
		lowest, highest := ceiling, time.Duration(0)
		for range 500 {
			d := b.Delay(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("Delay(%d) = %s, outside [0, %s]", attempt, d, ceiling)
			}
			lowest, highest = min(lowest, d), max(highest, d)
		}
		// Full jitter spreads delays over the whole range, down to nearly zero.
		if lowest > ceiling/10 || highest < ceiling*9/10 {
			t.Errorf("attempt %d: delays in [%s, %s], want them spread over [0, %s]", attempt, lowest, highest, ceiling)
		}
	}
}

func TestBackoffSeededDelaysAreReproducible(t *testing.T) {
	delays := func(seed uint64) []time.Duration {
		b := Backoff{Rand: rand.New(rand.NewPCG(seed, seed))}
		var out []time.Duration
		for attempt := range 8 {
			out = append(out, b.Delay(attempt))
		}
		return out
	}
	first, again, other := delays(7), delays(7), delays(8)
	if !slices.Equal(first, again) {
		t.Errorf("same seed, different delays: %v and %v", first, again)
	}
	if slices.Equal(first, other) {
		t.Errorf("different seeds, same delays: %v", first)
	}
}
