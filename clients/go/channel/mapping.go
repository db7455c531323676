package channel

import (
	"container/heap"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
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

	// bySlot groups the weighted schedule's slots by instance, built on the first call that
	// needs spread; calls whose instance is usable never do.
	bySlotOnce sync.Once
	bySlot     slotGroups
}

// slotGroups lists the slots of each instance in increasing order: instance p's are
// slots[offsets[p]:offsets[p+1]].
type slotGroups struct {
	offsets []int
	slots   []uint32
}

func (g *slotGroups) of(p int) []uint32 { return g.slots[g.offsets[p]:g.offsets[p+1]] }

// below is the number of instance p's slots before slot s.
func (g *slotGroups) below(p int, s uint64) uint64 {
	group := g.of(p)
	return uint64(sort.Search(len(group), func(i int) bool { return uint64(group[i]) >= s }))
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

// spread maps a ticket whose instance is unusable to a usable instance, so that the usable
// instances keep the rule's shares among themselves; unusable lists the unusable positions in
// increasing order. With the rule's cycle of slots S (round_robin and repeat: the positions,
// unit u = t, or ⌊t / n⌋ for repeat, so a run stays on one instance; weighted: the slots of
// the schedule, u = t), j = ⌊u / |S|⌋, D the unusable slots of S in order, i the rank of slot
// u mod |S| among them and A the usable slots in order, the ticket goes to the instance of
// slot A[(j·|D| + i) mod |A|]: over |A| cycles every usable slot takes exactly |D| of the
// unusable slots' tickets. ok is false when no slot is usable. A ticket whose own slot is
// usable keeps it. The cost is O(len(unusable)·log²|S|) for weighted, O(n) otherwise.
func (m *ticketMap) spread(ticket uint64, unusable []int) (int, bool) {
	if m.rule.kind == ruleWeighted {
		return m.spreadWeighted(ticket, unusable)
	}
	if m.n == 0 {
		return 0, false
	}
	u := ticket
	if m.rule.kind == ruleRepeat {
		u = ticket / m.rule.n
	}
	n := uint64(m.n)
	s, j := int(u%n), u/n
	rank := -1
	for r, p := range unusable {
		if p == s {
			rank = r
			break
		}
	}
	if rank < 0 {
		return s, true
	}
	d := uint64(len(unusable))
	a := n - d
	if a == 0 {
		return 0, false
	}
	k := ((j%a)*(d%a) + uint64(rank)) % a
	next := 0 // the next unusable position to pass
	for p := 0; p < m.n; p++ {
		if next < len(unusable) && unusable[next] == p {
			next++
			continue
		}
		if k == 0 {
			return p, true
		}
		k--
	}
	return 0, false
}

func (m *ticketMap) spreadWeighted(ticket uint64, unusable []int) (int, bool) {
	size := uint64(len(m.slots))
	if size == 0 {
		return 0, false
	}
	m.bySlotOnce.Do(func() { m.bySlot = groupSlots(m.slots, m.n) })
	g := &m.bySlot
	s, j := ticket%size, ticket/size
	own := int(m.slots[s])
	var d, rank uint64
	inD := false
	for _, p := range unusable {
		d += uint64(len(g.of(p)))
		rank += g.below(p, s)
		inD = inD || p == own
	}
	if !inD {
		return own, true
	}
	a := size - d
	if a == 0 {
		return 0, false
	}
	k := ((j%a)*(d%a) + rank) % a
	// The k-th usable slot: the first slot x with k+1 usable slots in [0, x].
	usableBelow := func(y uint64) uint64 {
		below := y
		for _, p := range unusable {
			below -= g.below(p, y)
		}
		return below
	}
	x := sort.Search(int(size), func(x int) bool { return usableBelow(uint64(x)+1) > k })
	if x >= int(size) {
		return 0, false
	}
	return int(m.slots[x]), true
}

// groupSlots lists the slots of each of n instances, in increasing order.
func groupSlots(slots []uint32, n int) slotGroups {
	g := slotGroups{offsets: make([]int, n+1), slots: make([]uint32, len(slots))}
	for _, p := range slots {
		g.offsets[p+1]++
	}
	for p := 0; p < n; p++ {
		g.offsets[p+1] += g.offsets[p]
	}
	fill := append([]int(nil), g.offsets[:n]...)
	for s, p := range slots {
		g.slots[fill[p]] = uint32(s)
		fill[p]++
	}
	return g
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
