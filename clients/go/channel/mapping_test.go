package channel

import "testing"

func letters(positions []int) string {
	out := make([]byte, len(positions))
	for i, p := range positions {
		out[i] = byte('A' + p)
	}
	return string(out)
}

func sequence(t *testing.T, canonical string, weights []uint64, tickets int, excluded func(int) bool) string {
	t.Helper()
	rule, err := parseLeasedRule(canonical)
	if err != nil {
		t.Fatal(err)
	}
	m := newTicketMap(rule, weights)
	positions := make([]int, tickets)
	for ticket := range positions {
		p, ok := m.position(uint64(ticket), excluded)
		if !ok {
			t.Fatalf("%s: ticket %d maps to nothing", canonical, ticket)
		}
		positions[ticket] = p
	}
	return letters(positions)
}

// The sequences rota's own rule tests pin (src/rules/*.rs).
func TestTicketMapFollowsRotasRules(t *testing.T) {
	cases := []struct {
		rule    string
		weights []uint64
		tickets int
		want    string
	}{
		{"round_robin", []uint64{100, 100, 100}, 7, "ABCABCA"},
		{"repeat(n=3)", []uint64{100, 100, 100}, 12, "AAABBBCCCAAA"},
		{"repeat(n=5)", []uint64{100, 100}, 12, "AAAAABBBBBAA"},
		{"repeat(n=1)", []uint64{100, 100, 100}, 4, "ABCA"},
		{"weighted", []uint64{5, 1, 1}, 14, "AAABCAAAAABCAA"},
		{"weighted", []uint64{2, 1}, 3, "ABA"},
		{"weighted", []uint64{100, 100, 100}, 3, "ABC"},
		{"weighted", []uint64{3, 0, 1}, 4, "AACA"},
	}
	for _, c := range cases {
		if got := sequence(t, c.rule, c.weights, c.tickets, nil); got != c.want {
			t.Errorf("%s %v: got %s, want %s", c.rule, c.weights, got, c.want)
		}
	}
}

func TestExcludedPositionsAreSkippedAsRotaSkipsThem(t *testing.T) {
	skipB := func(p int) bool { return p == 1 }
	if got := sequence(t, "round_robin", []uint64{1, 1, 1, 1}, 6, skipB); got != "ACDACD" {
		t.Errorf("round_robin without B: %s", got)
	}
	if got := sequence(t, "repeat(n=2)", []uint64{1, 1, 1}, 8, skipB); got != "AACCAACC" {
		t.Errorf("repeat without B: %s", got)
	}
	// weighted: B's slots go to the next slot's instance; the other slots stay where they were.
	plain := sequence(t, "weighted", []uint64{3, 1, 1}, 10, nil)
	skipped := sequence(t, "weighted", []uint64{3, 1, 1}, 10, skipB)
	for i := range plain {
		if skipped[i] == 'B' || (plain[i] != 'B' && plain[i] != skipped[i]) {
			t.Fatalf("weighted without B: %s from %s", skipped, plain)
		}
	}
	rule, _ := parseLeasedRule("round_robin")
	if _, ok := newTicketMap(rule, []uint64{1, 1}).position(0, func(int) bool { return true }); ok {
		t.Error("every position excluded, yet a position was returned")
	}
}

func TestHugeWeightsAreScaledToTheCycleBound(t *testing.T) {
	slots := weightSchedule([]uint64{3_000_000, 1_000_001})
	if len(slots) > maxCycle {
		t.Fatalf("%d slots", len(slots))
	}
	a := 0
	for _, s := range slots {
		if s == 0 {
			a++
		}
	}
	ratio := float64(a) / float64(len(slots)-a)
	if ratio < 2.97 || ratio > 3.03 {
		t.Fatalf("shares %d:%d", a, len(slots)-a)
	}
}

func TestUnleasableRulesAreRefused(t *testing.T) {
	for _, rule := range []string{"random", "consistent_hash", "repeat(n=0)", "repeat(n=x)", ""} {
		if _, err := parseLeasedRule(rule); err == nil {
			t.Errorf("%q was accepted", rule)
		}
	}
	if _, err := (builder{}).ParseConfig([]byte(`{"rule":"least_request"}`)); err == nil {
		t.Error("the policy accepted least_request")
	}
	if c, err := (builder{}).ParseConfig([]byte(`{"rule":"repeat(n=3)","version":"zlt"}`)); err != nil || c.(*Config).Version != "zlt" {
		t.Errorf("config: %v %v", c, err)
	}
}
