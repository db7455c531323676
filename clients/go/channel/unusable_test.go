package channel

import (
	"context"
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// spreadByTheBook is the mapping of a ticket whose instance is unusable as docs/channels.md
// states it, built literally: the cycle of slots S, the unusable slots D and the usable slots
// A in order, and A[(j·|D| + i) mod |A|] computed without overflow.
func spreadByTheBook(t *testing.T, m *ticketMap, ticket uint64, unusable map[int]bool) (int, bool) {
	t.Helper()
	var cycle []int // the instance of each slot
	u := ticket
	switch m.rule.kind {
	case ruleWeighted:
		for _, p := range m.slots {
			cycle = append(cycle, int(p))
		}
	case ruleRepeat:
		u = ticket / m.rule.n
		fallthrough
	default:
		for p := 0; p < m.n; p++ {
			cycle = append(cycle, p)
		}
	}
	if len(cycle) == 0 {
		return 0, false
	}
	s := int(u % uint64(len(cycle)))
	if !unusable[cycle[s]] {
		return cycle[s], true
	}
	var d, a []int
	i := -1
	for slot, p := range cycle {
		if unusable[p] {
			if slot == s {
				i = len(d)
			}
			d = append(d, slot)
		} else {
			a = append(a, slot)
		}
	}
	if len(a) == 0 {
		return 0, false
	}
	j := new(big.Int).SetUint64(u / uint64(len(cycle)))
	k := j.Mul(j, big.NewInt(int64(len(d))))
	k.Add(k, big.NewInt(int64(i)))
	k.Mod(k, big.NewInt(int64(len(a))))
	return cycle[a[k.Int64()]], true
}

func positionsOf(set map[int]bool, n int) []int {
	var out []int
	for p := 0; p < n; p++ {
		if set[p] {
			out = append(out, p)
		}
	}
	return out
}

func mapOf(t *testing.T, canonical string, weights []uint64) *ticketMap {
	t.Helper()
	rule, err := parseLeasedRule(canonical)
	if err != nil {
		t.Fatal(err)
	}
	return newTicketMap(rule, weights)
}

// The mapping agrees with the specification's construction for every rule, every set of
// unusable instances of up to five, the first tickets and tickets near 2⁶⁴.
func TestSpreadFollowsTheSpecification(t *testing.T) {
	cases := []struct {
		rule    string
		weights []uint64
	}{
		{"round_robin", []uint64{1, 1, 1}},
		{"round_robin", []uint64{1, 1, 1, 1, 1}},
		{"repeat(n=3)", []uint64{1, 1, 1}},
		{"repeat(n=2)", []uint64{1, 1, 1, 1, 1}},
		{"weighted", []uint64{5, 1, 1}},
		{"weighted", []uint64{30, 10, 20, 0, 10}},
		{"weighted", []uint64{7, 3, 11, 2}},
		{"weighted", []uint64{1000, 999, 1}},
	}
	for _, c := range cases {
		m := mapOf(t, c.rule, c.weights)
		n := len(c.weights)
		for mask := 1; mask < 1<<n; mask++ {
			unusable := map[int]bool{}
			for p := 0; p < n; p++ {
				if mask&(1<<p) != 0 {
					unusable[p] = true
				}
			}
			list := positionsOf(unusable, n)
			tickets := []uint64{}
			for ticket := uint64(0); ticket < 300; ticket++ {
				tickets = append(tickets, ticket)
			}
			for back := uint64(0); back < 50; back++ {
				tickets = append(tickets, math.MaxUint64-back)
			}
			for _, ticket := range tickets {
				want, wantOK := spreadByTheBook(t, m, ticket, unusable)
				got, ok := m.spread(ticket, list)
				if ok != wantOK || (ok && got != want) {
					t.Fatalf("%s %v, unusable %v, ticket %d: spread gives %d (%v), the specification %d (%v)",
						c.rule, c.weights, list, ticket, got, ok, want, wantOK)
				}
				if ok && unusable[got] {
					t.Fatalf("%s %v: ticket %d went to unusable %d", c.rule, c.weights, ticket, got)
				}
			}
		}
	}
}

// usableSequence maps tickets 0..count-1: by the rule when the instance is usable, else
// spread, as the picker does.
func usableSequence(t *testing.T, m *ticketMap, count int, unusable ...int) string {
	t.Helper()
	out := make([]int, count)
	for ticket := range out {
		p, ok := m.position(uint64(ticket), nil)
		for _, u := range unusable {
			if ok && p == u {
				p, ok = m.spread(uint64(ticket), unusable)
			}
		}
		if !ok {
			t.Fatalf("ticket %d maps to nothing", ticket)
		}
		out[ticket] = p
	}
	return letters(out)
}

func shares(seq string) map[byte]int {
	out := map[byte]int{}
	for i := 0; i < len(seq); i++ {
		out[seq[i]]++
	}
	return out
}

func TestOneUnusableRoundRobinInstanceIsSharedEqually(t *testing.T) {
	m := mapOf(t, "round_robin", []uint64{1, 1, 1})
	// C's tickets go to A and B in turn; A's and B's own tickets stay theirs.
	if got := usableSequence(t, m, 18, 2); got != "ABAABBABAABBABAABB" {
		t.Fatalf("round_robin without C: %s", got)
	}
	for down := 0; down < 3; down++ {
		got := shares(usableSequence(t, m, 18, down)) // 6 cycles
		for p := 0; p < 3; p++ {
			want := 9
			if p == down {
				want = 0
			}
			if got[byte('A'+p)] != want {
				t.Errorf("round_robin without %c over 6 cycles: %v", 'A'+down, got)
			}
		}
	}
	// Two of five down: over |A| = 3 cycles each of the three takes exactly |D| = 2 more.
	five := mapOf(t, "round_robin", []uint64{1, 1, 1, 1, 1})
	got := shares(usableSequence(t, five, 15, 1, 3))
	if got['A'] != 5 || got['C'] != 5 || got['E'] != 5 || got['B'] != 0 || got['D'] != 0 {
		t.Errorf("round_robin without B and D over 3 cycles: %v", got)
	}
}

func TestRepeatKeepsItsRunsWhenAnInstanceIsUnusable(t *testing.T) {
	m := mapOf(t, "repeat(n=3)", []uint64{1, 1, 1})
	got := usableSequence(t, m, 36, 2) // 4 cycles of 3 runs of 3
	if got != "AAABBBAAAAAABBBBBBAAABBBAAAAAABBBBBB" {
		t.Fatalf("repeat(n=3) without C: %s", got)
	}
	for run := 0; run < len(got); run += 3 {
		if got[run] != got[run+1] || got[run] != got[run+2] {
			t.Fatalf("run at %d split: %s", run, got)
		}
	}
	if s := shares(got); s['A'] != 18 || s['B'] != 18 {
		t.Fatalf("repeat(n=3) without C: %v", s)
	}
}

func TestWeightedKeepsItsProportionsWhenAnInstanceIsUnusable(t *testing.T) {
	// Schedule AAABCAA (5:1:1): without B, A and C keep 5:1.
	m := mapOf(t, "weighted", []uint64{5, 1, 1})
	if s := shares(usableSequence(t, m, 7*6, 1)); s['A'] != 35 || s['C'] != 7 || s['B'] != 0 {
		t.Fatalf("weighted 5:1:1 without B over |A| = 6 cycles: %v", s)
	}
	// 3:2:1 without A: B and C keep 2:1 over |A| = 3 cycles of 6 slots.
	m = mapOf(t, "weighted", []uint64{3, 2, 1})
	if s := shares(usableSequence(t, m, 6*3, 0)); s['B'] != 12 || s['C'] != 6 || s['A'] != 0 {
		t.Fatalf("weighted 3:2:1 without A: %v", s)
	}
	// 100:99:1 without B (200 slots, |D| = 99, |A| = 101): A and C keep 100:1 over 101 cycles.
	m = mapOf(t, "weighted", []uint64{100, 99, 1})
	if s := shares(usableSequence(t, m, 200*101, 1)); s['A'] != 20000 || s['C'] != 200 || s['B'] != 0 {
		t.Fatalf("weighted 100:99:1 without B over 101 cycles: %v", s)
	}
}

func TestSpreadWithNothingUsable(t *testing.T) {
	for _, rule := range []string{"round_robin", "repeat(n=2)", "weighted"} {
		if _, ok := mapOf(t, rule, []uint64{1, 2}).spread(1, []int{0, 1}); ok {
			t.Errorf("%s: every instance unusable, yet a position was returned", rule)
		}
	}
}

// timeouts feeds n DEADLINE_EXCEEDED outcomes of sent calls picked now to h.
func timeouts(h *holdout, n int, at time.Time) {
	for i := 0; i < n; i++ {
		h.record(balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "deadline"), BytesSent: true}, h.callEpoch(), at)
	}
}

func TestAnInstanceIsHeldOutAfterThreeTimeoutsInARow(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	at := func(d time.Duration) func() time.Time { return func() time.Time { return start.Add(d) } }
	h := &holdout{}
	answer := balancer.DoneInfo{Err: status.Error(codes.NotFound, "no such order"), BytesSent: true, BytesReceived: true}

	timeouts(h, 2, start)
	h.record(answer, h.callEpoch(), start) // an application error is an answer: the count ends
	timeouts(h, 2, start)
	if h.held(at(0)) {
		t.Fatal("held after 2 timeouts since an answer")
	}
	// Neither a cancelled call, nor a connect failure, nor a call never sent ends or adds to it.
	h.record(balancer.DoneInfo{Err: status.Error(codes.Canceled, "canceled"), BytesSent: true}, h.callEpoch(), start)
	h.record(balancer.DoneInfo{Err: status.Error(codes.Unavailable, "connection refused")}, h.callEpoch(), start)
	h.record(balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "deadline")}, h.callEpoch(), start)
	if h.held(at(0)) {
		t.Fatal("held after 2 timeouts and calls that say nothing of the instance")
	}
	stale := h.callEpoch()
	timeouts(h, 1, start)
	if !h.held(at(0)) || !h.held(at(firstHold-time.Nanosecond)) {
		t.Fatal("not held for 10 s after 3 timeouts in a row")
	}
	// Calls picked before the hold began time out too: they add nothing.
	for i := 0; i < 5; i++ {
		h.record(balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "deadline"), BytesSent: true}, stale, start.Add(time.Second))
	}
	if h.held(at(firstHold)) {
		t.Fatal("still held when 10 s are over")
	}
	// Each further 3 timeouts in a row double the hold, up to 60 s.
	now := start.Add(firstHold)
	for _, hold := range []time.Duration{20 * time.Second, 40 * time.Second, 60 * time.Second, 60 * time.Second} {
		timeouts(h, 2, now)
		if h.held(func() time.Time { return now }) {
			t.Fatalf("held after 2 further timeouts")
		}
		timeouts(h, 1, now)
		if !h.held(func() time.Time { return now.Add(hold - time.Nanosecond) }) {
			t.Fatalf("not held for %s", hold)
		}
		now = now.Add(hold)
		if h.held(func() time.Time { return now }) {
			t.Fatalf("held past %s", hold)
		}
	}
	// An answer brings the next hold back to 10 s.
	h.record(balancer.DoneInfo{BytesSent: true, BytesReceived: true}, h.callEpoch(), now)
	timeouts(h, 3, now)
	if !h.held(func() time.Time { return now.Add(firstHold - time.Nanosecond) }) || h.held(func() time.Time { return now.Add(firstHold) }) {
		t.Fatal("after an answer, the next hold is not 10 s")
	}
	var none *holdout
	if none.held(time.Now) {
		t.Fatal("a nil holdout is held")
	}
}

// threeLeases answers Lease with ticket ranges over a, b and c.
type threeLeases struct {
	rotapb.BalancerClient
	mu   sync.Mutex
	next uint64
	rule string
	down bool
}

var threeInstances = []*rotapb.Instance{
	{Id: "a", Host: "127.0.0.1", Port: 1}, {Id: "b", Host: "127.0.0.1", Port: 2}, {Id: "c", Host: "127.0.0.1", Port: 3},
}

func (f *threeLeases) Lease(_ context.Context, req *rotapb.LeaseRequest, _ ...grpc.CallOption) (*rotapb.LeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	first := f.next
	f.next += uint64(req.GetCount())
	return &rotapb.LeaseResponse{FirstTicket: first, Count: req.GetCount(), Rule: f.rule, Instances: threeInstances}, nil
}

// threePicker is a picker over a, b and c (those of ready READY), each with a hold of its
// own, on the clock *now.
func threePicker(t *testing.T, fake *threeLeases, now *time.Time, ready ...string) (*picker, map[string]*holdout, chan struct{}) {
	t.Helper()
	l := &link{balancer: fake, service: "svc", log: quietLogger()}
	l.opts.backoff.Initial, l.opts.backoff.Max, l.opts.backoff.Factor = time.Hour, time.Hour, 2
	woken := make(chan struct{}, 1024)
	local := func(string) *leaseView {
		v, err := viewOf(&rotapb.LeaseResponse{Rule: fake.rule, Instances: threeInstances})
		if err != nil {
			t.Error(err)
		}
		return v
	}
	ls := newLeaser(l, fake.rule, func() { woken <- struct{}{} }, local)
	t.Cleanup(ls.close)
	p := &picker{leases: ls, link: l, ticket: true, ready: map[string]readyConn{}, clock: func() time.Time { return *now }}
	holds := map[string]*holdout{}
	for _, i := range threeInstances {
		holds[i.GetId()] = &holdout{}
		for _, id := range ready {
			if i.GetId() == id {
				p.ready[subConnKey(id, instanceAddr(i))] = readyConn{sc: &fakeSubConn{id: id}, hold: holds[id]}
			}
		}
	}
	return p, holds, woken
}

// pickedCall is one call the picker routed: the instance and its x-rota-ticket.
type pickedCall struct {
	id     string
	ticket string
	done   func(balancer.DoneInfo)
}

func pickCall(t *testing.T, p *picker, woken chan struct{}) pickedCall {
	t.Helper()
	r, err := pickOnce(t, p, woken)
	if err != nil {
		t.Fatal(err)
	}
	return pickedCall{id: r.SubConn.(*fakeSubConn).id, ticket: r.Metadata.Get(TicketHeader)[0], done: r.Done}
}

// wantOfTicket is where the picker must send a ticket when the instances of unusable are
// unusable: its own instance, else the spread one.
func wantOfTicket(t *testing.T, rule string, ticket uint64, unusable ...int) string {
	t.Helper()
	m := mapOf(t, rule, []uint64{100, 100, 100})
	p, _ := m.position(ticket, nil)
	for _, u := range unusable {
		if p == u {
			p, _ = m.spread(ticket, unusable)
		}
	}
	return threeInstances[p].GetId()
}

func TestTheTicketOfAnInstanceNotReadyGoesToAUsableOneItself(t *testing.T) {
	for _, rule := range []string{"round_robin", "repeat(n=3)"} {
		now := time.Unix(1_000_000, 0)
		p, _, woken := threePicker(t, &threeLeases{rule: rule}, &now, "a", "b") // c is not READY
		count := map[string]int{}
		for call := 0; call < 90; call++ {
			c := pickCall(t, p, woken)
			ticket, err := strconv.ParseUint(c.ticket, 10, 64)
			if err != nil {
				t.Fatalf("%s call %d: ticket %q", rule, call, c.ticket)
			}
			// Tickets are consecutive: none is passed over.
			if ticket != uint64(call) {
				t.Fatalf("%s call %d has ticket %d", rule, call, ticket)
			}
			if want := wantOfTicket(t, rule, ticket, 2); c.id != want {
				t.Fatalf("%s ticket %d went to %s, want %s", rule, ticket, c.id, want)
			}
			count[c.id]++
		}
		if count["a"] != 45 || count["b"] != 45 {
			t.Fatalf("%s without c: %v", rule, count)
		}
	}
}

func TestALocalRotationSpreadsAnUnusableInstanceLikeLeases(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p, _, woken := threePicker(t, &threeLeases{rule: "round_robin", down: true}, &now, "b", "c") // a is not READY
	count := map[string]int{}
	for call := 0; call < 60; call++ {
		c := pickCall(t, p, woken)
		ticket, err := strconv.ParseUint(strings.TrimPrefix(c.ticket, "L"), 10, 64)
		if !strings.HasPrefix(c.ticket, "L") || err != nil {
			t.Fatalf("call %d: ticket %q, want a local one", call, c.ticket)
		}
		if want := wantOfTicket(t, "round_robin", ticket, 0); c.id != want {
			t.Fatalf("local ticket %d went to %s, want %s", ticket, c.id, want)
		}
		count[c.id]++
	}
	if count["b"] != 30 || count["c"] != 30 {
		t.Fatalf("local rotation without a: %v", count)
	}
}

func TestAHungInstanceIsHeldOutThenTriedAgain(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p, holds, woken := threePicker(t, &threeLeases{rule: "round_robin"}, &now, "a", "b", "c")
	timeout := balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "context deadline exceeded"), BytesSent: true}
	// c's first three calls time out; a's and b's are answered.
	cCalls := 0
	var ticket uint64
	for cCalls < 3 {
		c := pickCall(t, p, woken)
		if want := wantOfTicket(t, "round_robin", ticket); c.id != want {
			t.Fatalf("ticket %d went to %s before any hold, want %s", ticket, c.id, want)
		}
		if c.id == "c" {
			cCalls++
			c.done(timeout)
		} else {
			c.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		}
		ticket++
	}
	if !holds["c"].held(p.now) {
		t.Fatal("c not held after 3 timeouts in a row")
	}
	// Held: c's tickets go to a and b, each ticket used once.
	count := map[string]int{}
	for call := 0; call < 60; call++ {
		c := pickCall(t, p, woken)
		if c.ticket != strconv.FormatUint(ticket, 10) {
			t.Fatalf("call has ticket %s, want %d", c.ticket, ticket)
		}
		if want := wantOfTicket(t, "round_robin", ticket, 2); c.id != want {
			t.Fatalf("ticket %d went to %s while c is held, want %s", ticket, c.id, want)
		}
		count[c.id]++
		c.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		ticket++
	}
	if count["a"] != 30 || count["b"] != 30 {
		t.Fatalf("while c is held: %v", count)
	}
	// 10 s later the next ticket of c tries it again; three more timeouts hold it for 20 s.
	now = now.Add(firstHold)
	for cCalls = 0; cCalls < 3; ticket++ {
		c := pickCall(t, p, woken)
		if want := wantOfTicket(t, "round_robin", ticket); c.id != want {
			t.Fatalf("ticket %d went to %s after the hold, want %s", ticket, c.id, want)
		}
		if c.id == "c" {
			cCalls++
			c.done(timeout)
		}
	}
	now = now.Add(2*firstHold - time.Nanosecond)
	if reaches(t, p, woken, "c") {
		t.Fatal("c tried again within 20 s of its second hold")
	}
	now = now.Add(time.Nanosecond)
	if !reaches(t, p, woken, "c") {
		t.Fatal("c not tried again after its second hold")
	}
}

// reaches reports whether one of the next three calls (a whole cycle) goes to id.
func reaches(t *testing.T, p *picker, woken chan struct{}, id string) bool {
	t.Helper()
	reached := false
	for i := 0; i < 3; i++ {
		reached = pickCall(t, p, woken).id == id || reached
	}
	return reached
}

func TestNothingUsableWaitsWhileConnectingElseFails(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p, holds, woken := threePicker(t, &threeLeases{rule: "round_robin"}, &now, "a")
	timeouts(holds["a"], 3, now)
	// a is held and b and c are not READY: nothing is usable.
	if _, err := pickOnce(t, p, woken); status.Code(err) != codes.Unavailable {
		t.Fatalf("nothing usable, nothing connecting: %v, want UNAVAILABLE", err)
	}
	p.connecting = true
	if _, err := p.Pick(balancer.PickInfo{Ctx: context.Background()}); !errors.Is(err, balancer.ErrNoSubConnAvailable) {
		t.Fatalf("nothing usable, something connecting: %v, want to wait", err)
	}
}
