package channel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// The picker routes by rota's positions and takes the next ticket when one's instance is
// unusable, against scripted Lease answers that carry positions (computed by the test oracle
// of conformance_test.go, or written out).

func letters(positions []int) string {
	out := make([]byte, len(positions))
	for i, p := range positions {
		out[i] = byte('A' + p)
	}
	return string(out)
}

// The oracle pins the sequences rota's own rule tests pin (src/rules/*.rs).
func TestTheRuleOracleFollowsRotasRules(t *testing.T) {
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
		{"weighted", []uint64{300, 100, 100}, 5, "AABCA"},
	}
	for _, c := range cases {
		var got []int
		for _, p := range oraclePositions(t, c.rule, c.weights, 0, uint32(c.tickets)) {
			got = append(got, int(p))
		}
		if letters(got) != c.want {
			t.Errorf("%s %v: got %s, want %s", c.rule, c.weights, letters(got), c.want)
		}
	}
	if _, err := ruleOracle("least_request", []uint64{1}); err == nil {
		t.Error("the oracle mapped least_request")
	}
}

// scriptedLeases answers Lease with ticket ranges of a counter of its own over instances (by
// id), with positions by the oracle for rule over the weights of the instances it answers with,
// or by answer when set. With honour set it leaves the request's exclude out of the list (as
// rota does) and refuses, with rota's trailer, a request that excludes all of them.
type scriptedLeases struct {
	rotapb.BalancerClient
	t         *testing.T
	mu        sync.Mutex
	next      uint64
	rule      string
	instances []*rotapb.Instance
	honour    bool
	down      bool
	answer    func(first uint64, count uint32) []uint32
	requests  []*rotapb.LeaseRequest
}

func (f *scriptedLeases) Lease(_ context.Context, req *rotapb.LeaseRequest, opts ...grpc.CallOption) (*rotapb.LeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	var list []*rotapb.Instance
	var weights []uint64
	for _, i := range f.instances {
		if f.honour && slices.Contains(req.GetExclude(), i.GetId()) {
			continue
		}
		list = append(list, i)
		weights = append(weights, weightOf(i))
	}
	if len(list) == 0 {
		for _, o := range opts {
			if t, ok := o.(grpc.TrailerCallOption); ok {
				*t.TrailerAddr = metadata.Pairs("rota-error", "unavailable")
			}
		}
		return nil, status.Error(codes.Unavailable, "service has no eligible instance for a lease that is not excluded")
	}
	first := f.next
	f.next += uint64(req.GetCount())
	var positions []uint32
	if f.answer != nil {
		positions = f.answer(first, req.GetCount())
	} else {
		positions = oraclePositions(f.t, f.rule, weights, first, req.GetCount())
	}
	return &rotapb.LeaseResponse{FirstTicket: first, Count: req.GetCount(), Rule: f.rule, Instances: list, Positions: positions}, nil
}

func (f *scriptedLeases) set(apply func(f *scriptedLeases)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	apply(f)
}

// excludes lists the exclude of every request so far.
func (f *scriptedLeases) excludes() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, r := range f.requests {
		out = append(out, r.GetExclude())
	}
	return out
}

var threeInstances = []*rotapb.Instance{
	{Id: "a", Host: "127.0.0.1", Port: 1}, {Id: "b", Host: "127.0.0.1", Port: 2}, {Id: "c", Host: "127.0.0.1", Port: 3},
}

func weighted(weights ...uint32) []*rotapb.Instance {
	var out []*rotapb.Instance
	for i, w := range weights {
		out = append(out, &rotapb.Instance{Id: string(rune('a' + i)), Host: "127.0.0.1", Port: uint32(i + 1), Weight: &w})
	}
	return out
}

// scriptedPicker is a picker over fake's instances (those of ready READY), each with a hold of
// its own, on the clock *now, published to its leaser as the balancer publishes it (so that
// leases exclude what it finds unusable), with the instances as the resolver's list.
func scriptedPicker(t *testing.T, fake *scriptedLeases, now *time.Time, ready ...string) (*picker, map[string]*holdout, chan struct{}) {
	t.Helper()
	fake.t = t
	if fake.instances == nil {
		fake.instances = threeInstances
	}
	l := &link{balancer: fake, service: "svc", log: quietLogger()}
	l.opts.backoff.Initial, l.opts.backoff.Max, l.opts.backoff.Factor = time.Hour, time.Hour, 2
	woken := make(chan struct{}, 1024)
	known := &knownInstances{}
	var ids, addrs []string
	for _, i := range fake.instances {
		known.instances = append(known.instances, knownInstance{info: instanceInfo{id: i.GetId(), weight: weightOf(i)}, addr: instanceAddr(i)})
		ids, addrs = append(ids, i.GetId()), append(addrs, instanceAddr(i))
	}
	local := func(string) *leaseView { return newLeaseView("", ids, addrs) }
	ls := newLeaser(l, fake.rule, func() { woken <- struct{}{} }, local)
	t.Cleanup(ls.close)
	p := &picker{leases: ls, link: l, ticket: true, ready: map[string]readyConn{}, known: known, clock: func() time.Time { return *now }}
	holds := map[string]*holdout{}
	for _, i := range fake.instances {
		holds[i.GetId()] = &holdout{}
		if slices.Contains(ready, i.GetId()) {
			p.ready[subConnKey(i.GetId(), instanceAddr(i))] = readyConn{sc: &fakeSubConn{id: i.GetId()}, hold: holds[i.GetId()]}
		}
	}
	ls.current.Store(p)
	return p, holds, woken
}

// waitWoken waits (bounded) for the picker to be republished.
func waitWoken(t *testing.T, woken chan struct{}) {
	t.Helper()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the picker was not republished within 10s")
	}
}

// pickedCall is one call the picker routed: the instance and its x-rota-ticket.
type pickedCall struct {
	id     string
	ticket string
	done   func(balancer.DoneInfo)
}

func (c pickedCall) number(t *testing.T) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimPrefix(c.ticket, "L"), 10, 64)
	if err != nil {
		t.Fatalf("ticket %q", c.ticket)
	}
	return n
}

func pickCall(t *testing.T, p *picker, woken chan struct{}) pickedCall {
	t.Helper()
	r, err := pickOnce(t, p, woken)
	if err != nil {
		t.Fatal(err)
	}
	return pickedCall{id: r.SubConn.(*fakeSubConn).id, ticket: r.Metadata.Get(TicketHeader)[0], done: r.Done}
}

// instanceOf is the id of the instance the oracle maps ticket to over fake's instances.
func instanceOf(t *testing.T, fake *scriptedLeases, ticket uint64) string {
	t.Helper()
	var weights []uint64
	for _, i := range fake.instances {
		weights = append(weights, weightOf(i))
	}
	return fake.instances[oraclePositions(t, fake.rule, weights, ticket, 1)[0]].GetId()
}

// A lease's positions are followed exactly, whatever they are: here not the rule's t mod n.
func TestPositionsAreFollowedExactly(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	script := func(ticket uint64) uint32 { return uint32((ticket*ticket + 3*ticket/2 + 1) % 3) }
	fake := &scriptedLeases{rule: "round_robin", answer: func(first uint64, count uint32) []uint32 {
		out := make([]uint32, count)
		for i := range out {
			out[i] = script(first + uint64(i))
		}
		return out
	}}
	p, _, woken := scriptedPicker(t, fake, &now, "a", "b", "c")
	var got, mod []int
	for call := 0; call < 200; call++ {
		c := pickCall(t, p, woken)
		if c.number(t) != uint64(call) {
			t.Fatalf("call %d has ticket %s: tickets are consecutive while every instance is usable", call, c.ticket)
		}
		if want := threeInstances[script(uint64(call))].GetId(); c.id != want {
			t.Fatalf("ticket %d went to %s, its position names %s", call, c.id, want)
		}
		got, mod = append(got, int(c.id[0]-'a')), append(mod, call%3)
	}
	if letters(got) == letters(mod) {
		t.Fatal("the script is t mod n: this test would not see a channel that maps by itself")
	}
}

// An answer whose positions do not fit is refused like an answer the channel cannot use:
// UNAVAILABLE naming the problem, no call sent.
func TestMalformedPositionsAreRefused(t *testing.T) {
	cases := []struct {
		name   string
		answer func(first uint64, count uint32) []uint32
		want   string
	}{
		{"too few", func(_ uint64, count uint32) []uint32 { return make([]uint32, count-1) }, "positions for"},
		{"too many", func(_ uint64, count uint32) []uint32 { return make([]uint32, count+1) }, "positions for"},
		{"none", func(uint64, uint32) []uint32 { return nil }, "0 positions for 16 tickets"},
		{"out of range", func(first uint64, count uint32) []uint32 {
			out := make([]uint32, count)
			out[5] = 3
			return out
		}, "ticket 5 at position 3 of 3 instances"},
	}
	for _, c := range cases {
		now := time.Unix(1_000_000, 0)
		p, _, woken := scriptedPicker(t, &scriptedLeases{rule: "round_robin", answer: c.answer}, &now, "a", "b", "c")
		r, err := pickOnce(t, p, woken)
		if st := status.Convert(err); err == nil || st.Code() != codes.Unavailable || !strings.Contains(st.Message(), c.want) {
			t.Errorf("%s: the pick returned %v (%v), want UNAVAILABLE mentioning %q", c.name, r.SubConn, err, c.want)
		}
	}
}

// callsOf makes n calls and returns them; with done set, each is answered.
func callsOf(t *testing.T, p *picker, woken chan struct{}, n int) []pickedCall {
	t.Helper()
	out := make([]pickedCall, n)
	for i := range out {
		out[i] = pickCall(t, p, woken)
	}
	return out
}

func countsOf(calls []pickedCall) map[string]int {
	out := map[string]int{}
	for _, c := range calls {
		out[c.id]++
	}
	return out
}

// checkSkipped: the calls took, in order, exactly the tickets from the first whose instance (by
// the oracle) is not in unusable; the others were passed over.
func checkSkipped(t *testing.T, fake *scriptedLeases, calls []pickedCall, unusable ...string) {
	t.Helper()
	ticket := calls[0].number(t)
	for n, c := range calls {
		for slices.Contains(unusable, instanceOf(t, fake, ticket)) {
			ticket++
		}
		if c.number(t) != ticket || c.id != instanceOf(t, fake, ticket) {
			t.Fatalf("call %d: ticket %d to %s, want ticket %d to %s", n, c.number(t), c.id, ticket, instanceOf(t, fake, ticket))
		}
		ticket++
	}
}

// round_robin over three, c not READY (and leases that do not leave it out): its tickets are
// passed over, and a and b get equal calls.
func TestTheNextTicketIsTakenForAnUnusableInstance(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin"}
	p, _, woken := scriptedPicker(t, fake, &now, "a", "b")
	calls := callsOf(t, p, woken, 90)
	checkSkipped(t, fake, calls, "c")
	if got := countsOf(calls); got["a"] != 45 || got["b"] != 45 {
		t.Fatalf("round_robin without c: %v", got)
	}
}

// repeat(n=3) without c: c's runs are passed over whole, the others' runs stay whole.
func TestRepeatRunsStayWholeWhenAnInstanceIsUnusable(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "repeat(n=3)"}
	p, _, woken := scriptedPicker(t, fake, &now, "a", "b")
	calls := callsOf(t, p, woken, 90)
	checkSkipped(t, fake, calls, "c")
	runs := map[uint64][]string{}
	for _, c := range calls {
		runs[c.number(t)/3] = append(runs[c.number(t)/3], c.id)
	}
	for run, ids := range runs {
		if len(ids) != 3 || ids[0] != ids[1] || ids[1] != ids[2] {
			t.Fatalf("run %d (tickets %d..%d): %v", run, 3*run, 3*run+2, ids)
		}
	}
	if got := countsOf(calls); got["a"] != 45 || got["b"] != 45 {
		t.Fatalf("repeat(n=3) without c: %v", got)
	}
}

// weighted: the usable instances keep their proportions among themselves.
func TestWeightedKeepsItsProportionsAmongTheUsable(t *testing.T) {
	cases := []struct {
		weights []uint32
		ready   []string
		calls   int
		want    map[string]int
	}{
		{[]uint32{5, 1, 1}, []string{"a", "c"}, 60, map[string]int{"a": 50, "c": 10}},
		{[]uint32{3, 2, 1}, []string{"b", "c"}, 30, map[string]int{"b": 20, "c": 10}},
		{[]uint32{100, 99, 1}, []string{"a", "c"}, 202, map[string]int{"a": 200, "c": 2}},
	}
	for _, c := range cases {
		now := time.Unix(1_000_000, 0)
		fake := &scriptedLeases{rule: "weighted", instances: weighted(c.weights...)}
		p, _, woken := scriptedPicker(t, fake, &now, c.ready...)
		calls := callsOf(t, p, woken, c.calls)
		var unusable []string
		for _, i := range fake.instances {
			if !slices.Contains(c.ready, i.GetId()) {
				unusable = append(unusable, i.GetId())
			}
		}
		checkSkipped(t, fake, calls, unusable...)
		if got := countsOf(calls); !mapsEqual(got, c.want) {
			t.Errorf("weighted %v with %v usable: %v, want %v", c.weights, c.ready, got, c.want)
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Every Lease names the instances unusable when it is sent, in id order, and at most 1000.
func TestLeasesExcludeTheUnusableInstances(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin", honour: true}
	p, holds, woken := scriptedPicker(t, fake, &now, "a", "b") // c is not READY
	for _, c := range callsOf(t, p, woken, 20) {
		if c.id == "c" {
			t.Fatal("a call went to c, which is not READY")
		}
	}
	// rota left c out of the list: no ticket was passed over.
	calls := callsOf(t, p, woken, 30)
	checkSkipped(t, &scriptedLeases{rule: "round_robin", instances: threeInstances[:2]}, calls)
	for i, exclude := range fake.excludes() {
		if !slices.Equal(exclude, []string{"c"}) {
			t.Fatalf("lease %d excluded %q, want [c]", i, exclude)
		}
	}
	// b held out too: the next leases exclude b and c.
	timeouts(holds["b"], holdTimeouts, now)
	leases := len(fake.excludes())
	for n := 0; ; n++ {
		if c := pickCall(t, p, woken); c.id != "a" {
			t.Fatalf("a call went to %s while only a is usable", c.id)
		}
		if later := fake.excludes()[leases:]; len(later) > 0 && slices.Equal(later[len(later)-1], []string{"b", "c"}) {
			break
		}
		if n == 300_000 {
			t.Fatalf("leases after b's hold excluded %q, want [b c]", fake.excludes()[leases:])
		}
	}
	// More than 1000 unusable: the first 1000 in id order.
	many := &scriptedLeases{rule: "round_robin"}
	for i := 1500; i > 0; i-- {
		many.instances = append(many.instances, &rotapb.Instance{Id: fmt.Sprintf("i%04d", i), Host: "127.0.0.1", Port: uint32(i)})
	}
	mp, _, _ := scriptedPicker(t, many, &now, "i0001")
	got, _ := mp.leases.exclude(nil, nil)
	if len(got) != maxExclude || got[0] != "i0002" || got[maxExclude-1] != "i1001" || !slices.IsSorted(got) {
		t.Fatalf("1499 unusable instances: excluded %d, from %q to %q", len(got), got[0], got[len(got)-1])
	}
}

// rota refuses a lease that excludes every eligible instance; the channel then leases over all
// of them, and its calls wait while one is connecting, else fail as with nothing usable.
func TestALeaseExcludingEverythingIsAskedAgainWithoutExclusions(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin", honour: true}
	p, _, woken := scriptedPicker(t, fake, &now) // nothing READY
	p.connecting = true
	for attempt := 0; ; attempt++ {
		_, err := p.Pick(balancer.PickInfo{Ctx: context.Background()})
		if !errors.Is(err, balancer.ErrNoSubConnAvailable) {
			t.Fatalf("nothing usable, all connecting: %v, want to wait", err)
		}
		if len(fake.excludes()) >= 2 {
			break
		}
		if attempt == 100 {
			t.Fatal("no second lease")
		}
		waitWoken(t, woken)
	}
	if got := fake.excludes(); !slices.Equal(got[0], []string{"a", "b", "c"}) || got[1] != nil {
		t.Fatalf("leases excluded %q, want [a b c] then nothing", got)
	}
	p.connecting = false
	if _, err := pickOnce(t, p, woken); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no instance of \"svc\" is reachable") {
		t.Fatalf("nothing usable, nothing connecting: %v", err)
	}
}

// When neither the current nor the next block holds a ticket of a usable instance, the call
// waits for the next lease rather than looping; that lease leaves the unusable one out.
func TestSkippingStopsAtTheBlocksHeld(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin", answer: func(_ uint64, count uint32) []uint32 {
		out := make([]uint32, count)
		for i := range out {
			out[i] = 2 // c's, every one
		}
		return out
	}}
	p, _, woken := scriptedPicker(t, fake, &now, "a", "b")
	waits := 0
	for ; waits < 5; waits++ {
		if _, err := p.Pick(balancer.PickInfo{Ctx: context.Background()}); !errors.Is(err, balancer.ErrNoSubConnAvailable) {
			t.Fatalf("every held ticket is c's: %v, want to wait for a lease", err)
		}
		waitWoken(t, woken)
	}
	fake.set(func(f *scriptedLeases) { f.answer, f.honour = nil, true })
	c := pickCall(t, p, woken)
	if c.id == "c" {
		t.Fatal("a call went to c")
	}
	excludes := fake.excludes()
	if len(excludes) < waits || !slices.Equal(excludes[len(excludes)-1], []string{"c"}) {
		t.Fatalf("leases excluded %q", excludes)
	}
}

// While rota is unreachable: a plain rotation over the usable instances, one call each in id
// order, with L tickets; neither weights nor repeat runs are kept.
func TestTheLocalRotationIsPlainOverTheUsableInstances(t *testing.T) {
	for _, rule := range []string{"weighted", "repeat(n=3)"} {
		now := time.Unix(1_000_000, 0)
		fake := &scriptedLeases{rule: rule, instances: weighted(5, 3, 1, 1)}
		p, _, woken := scriptedPicker(t, fake, &now, "a", "c", "d") // b is not READY
		leased := callsOf(t, p, woken, 10)
		checkSkipped(t, fake, leased, "b")
		fake.set(func(f *scriptedLeases) { f.down = true })
		var local []pickedCall
		for n := 0; n < 100_000 && len(local) < 30; n++ {
			if c := pickCall(t, p, woken); strings.HasPrefix(c.ticket, "L") {
				local = append(local, c)
			}
		}
		if len(local) < 30 {
			t.Fatalf("%s: no local rotation while rota is down", rule)
		}
		order := []string{"a", "c", "d"}
		start := slices.Index(order, local[0].id)
		for i, c := range local {
			if want := order[(start+i)%3]; c.id != want {
				t.Fatalf("%s: local call %d (%s) went to %s, want %s: one each in id order", rule, i, c.ticket, c.id, want)
			}
		}
		if got := countsOf(local); got["a"] != 10 || got["c"] != 10 || got["d"] != 10 {
			t.Fatalf("%s: local rotation %v", rule, got)
		}
	}
	// Before any lease: over the channel's list.
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin", down: true}
	p, _, woken := scriptedPicker(t, fake, &now, "b", "c")
	for i, c := range callsOf(t, p, woken, 6) {
		if want := []string{"b", "c"}[i%2]; c.id != want || !strings.HasPrefix(c.ticket, "L") {
			t.Fatalf("local call %d: %s with ticket %s, want %s with an L ticket", i, c.id, c.ticket, want)
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

func TestAHungInstanceIsHeldOutThenTriedAgain(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin"}
	p, holds, woken := scriptedPicker(t, fake, &now, "a", "b", "c")
	timeout := balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "context deadline exceeded"), BytesSent: true}
	// c's first three calls time out; a's and b's are answered.
	cCalls := 0
	var ticket uint64
	for cCalls < 3 {
		c := pickCall(t, p, woken)
		if c.number(t) != ticket || c.id != instanceOf(t, fake, ticket) {
			t.Fatalf("call %s to %s before any hold, want ticket %d to %s", c.ticket, c.id, ticket, instanceOf(t, fake, ticket))
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
	// Held: c's tickets are passed over, a and b share the calls equally.
	held := callsOf(t, p, woken, 60)
	checkSkipped(t, fake, held, "c")
	if got := countsOf(held); got["a"] != 30 || got["b"] != 30 {
		t.Fatalf("while c is held: %v", got)
	}
	// 10 s later c's next ticket tries it again; three more timeouts hold it for 20 s.
	now = now.Add(firstHold)
	for cCalls = 0; cCalls < 3; {
		c := pickCall(t, p, woken)
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

// reaches reports whether one of the next three calls goes to id (a whole cycle while every
// instance is usable).
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
	p, holds, woken := scriptedPicker(t, &scriptedLeases{rule: "round_robin"}, &now, "a")
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
