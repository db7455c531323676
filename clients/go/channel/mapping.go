package channel

import (
	"container/heap"
	"fmt"
	"strconv"
	"strings"
)

// ruleKind is one of the rules rota leases.
type ruleKind int

const (
	ruleRoundRobin ruleKind = iota
	ruleRepeat
	ruleWeighted
)

// maxCycle bounds the weighted schedule, as rota bounds it (2^20 slots).
const maxCycle = 1 << 20

// leasedRule is the canonical rule of a lease ("round_robin", "repeat(n=3)", "weighted").
type leasedRule struct {
	kind ruleKind
	n    uint64 // repeat run length
}

// parseLeasedRule reads the canonical rule rota returns with a lease.
func parseLeasedRule(canonical string) (leasedRule, error) {
	switch {
	case canonical == "round_robin":
		return leasedRule{kind: ruleRoundRobin}, nil
	case canonical == "weighted":
		return leasedRule{kind: ruleWeighted}, nil
	case strings.HasPrefix(canonical, "repeat(n=") && strings.HasSuffix(canonical, ")"):
		n, err := strconv.ParseUint(canonical[len("repeat(n="):len(canonical)-1], 10, 32)
		if err != nil || n == 0 {
			return leasedRule{}, fmt.Errorf("rota: unexpected leased rule %q", canonical)
		}
		return leasedRule{kind: ruleRepeat, n: n}, nil
	case canonical == "repeat":
		return leasedRule{kind: ruleRepeat, n: 3}, nil
	}
	return leasedRule{}, fmt.Errorf("rota: rule %q cannot be mapped locally", canonical)
}

// ticketMap maps the tickets of one lease to positions in its instance list (ordered by id),
// exactly as rota's rule maps them: round_robin `t mod n`, repeat `(t / n) mod len`, weighted
// slot `t mod Σw` of the earliest-deadline-first schedule. Excluded positions are skipped the
// way rota skips a Pick's `exclude`: round_robin and repeat rotate over the accepted positions,
// weighted walks on to the next slot of an accepted instance.
type ticketMap struct {
	rule  leasedRule
	n     int
	slots []uint32 // weighted only
}

func newTicketMap(rule leasedRule, weights []uint64) *ticketMap {
	m := &ticketMap{rule: rule, n: len(weights)}
	if rule.kind == ruleWeighted {
		m.slots = weightSchedule(weights)
	}
	return m
}

// position returns the instance position for ticket, skipping positions for which excluded
// returns true; ok is false when no position is accepted. excluded may be nil.
func (m *ticketMap) position(ticket uint64, excluded func(int) bool) (int, bool) {
	switch m.rule.kind {
	case ruleWeighted:
		if len(m.slots) == 0 {
			return 0, false
		}
		start := ticket % uint64(len(m.slots))
		for step := 0; step < len(m.slots); step++ {
			p := int(m.slots[(start+uint64(step))%uint64(len(m.slots))])
			if excluded == nil || !excluded(p) {
				return p, true
			}
		}
		return 0, false
	case ruleRepeat:
		return m.rotate(ticket/m.rule.n, excluded)
	default:
		return m.rotate(ticket, excluded)
	}
}

// rotate returns the (turn mod accepted)-th accepted position.
func (m *ticketMap) rotate(turn uint64, excluded func(int) bool) (int, bool) {
	accepted := m.n
	if excluded != nil {
		for p := 0; p < m.n; p++ {
			if excluded(p) {
				accepted--
			}
		}
	}
	if accepted == 0 {
		return 0, false
	}
	k := int(turn % uint64(accepted))
	for p := 0; p < m.n; p++ {
		if excluded != nil && excluded(p) {
			continue
		}
		if k == 0 {
			return p, true
		}
		k--
	}
	return 0, false
}

// weightSchedule is rota's weighted cycle: weights reduced by their gcd (and scaled down past
// maxCycle slots), instance i's k-th slot due at (2k+1)/2wᵢ, ties to the lower position.
func weightSchedule(weights []uint64) []uint32 {
	w := normalizeWeights(weights)
	var total uint64
	h := &slotHeap{}
	for i, wi := range w {
		total += wi
		if wi > 0 {
			*h = append(*h, slot{numerator: 1, weight: wi, index: uint32(i)})
		}
	}
	heap.Init(h)
	slots := make([]uint32, 0, total)
	for h.Len() > 0 {
		s := &(*h)[0]
		slots = append(slots, s.index)
		s.numerator += 2
		if s.numerator < 2*s.weight {
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
		}
	}
	return slots
}

func normalizeWeights(weights []uint64) []uint64 {
	var divisor uint64
	for _, w := range weights {
		if w > 0 {
			divisor = gcd(divisor, w)
		}
	}
	if divisor == 0 {
		divisor = 1
	}
	reduced := make([]uint64, len(weights))
	var total, nonzero uint64
	for i, w := range weights {
		reduced[i] = w / divisor
		total += reduced[i]
		if reduced[i] > 0 {
			nonzero++
		}
	}
	if total > maxCycle {
		budget := uint64(1)
		if maxCycle > nonzero {
			budget = maxCycle - nonzero
		}
		for i, w := range reduced {
			if w > 0 {
				// w < 2^32 and budget < 2^20 after the gcd reduction of u32 weights: no overflow.
				reduced[i] = 1 + w*budget/total
			}
		}
	}
	return reduced
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

type slot struct {
	numerator uint64
	weight    uint64
	index     uint32
}

type slotHeap []slot

func (h slotHeap) Len() int { return len(h) }
func (h slotHeap) Less(i, j int) bool {
	// Deadline numerator / 2·weight, compared by cross-multiplication; ties to the lower index.
	l := h[i].numerator * h[j].weight
	r := h[j].numerator * h[i].weight
	if l != r {
		return l < r
	}
	return h[i].index < h[j].index
}
func (h slotHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *slotHeap) Push(x any)   { *h = append(*h, x.(slot)) }
func (h *slotHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
