package channel

import (
	"context"
	"errors"
	"strconv"
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

// Leases answered with rota's own picks (a service under gray release, leased without a
// version), against a scripted Lease.

// grayInstances are the instances the scripted picks name, by id: two unversioned, one v2.
var grayInstances = []*rotapb.Instance{
	{Id: "a", Host: "127.0.0.1", Port: 1}, {Id: "b", Host: "127.0.0.1", Port: 2}, {Id: "v", Host: "127.0.0.1", Port: 3, Version: "v2"},
}

// grayPattern is the positions of the scripted picks, over and over.
var grayPattern = []int{0, 2, 1, 0, 1, 2}

// grayTicket is the ticket of the n-th scripted pick (counted over every lease): the
// version's own rotation, as rota draws it, plus the lease that carried it in the high bits.
func grayTicket(lease, n int) uint64 {
	perVersion := 0
	for i := 0; i < n; i++ {
		if (grayPattern[i%len(grayPattern)] == 2) == (grayPattern[n%len(grayPattern)] == 2) {
			perVersion++
		}
	}
	return uint64(lease)<<32 | uint64(perVersion)
}

func leaseOf(ticket uint64) int { return int(ticket >> 32) }

// fakeGray answers Lease with picks (or, when tickets is set, with a ticket range over a and
// b), fails while down, and refuses with refusal (and rota's rota-error trailer) when set.
type fakeGray struct {
	rotapb.BalancerClient
	mu       sync.Mutex
	n        int // picks handed out so far
	leases   int
	tickets  bool
	down     bool
	refusal  error
	requests []*rotapb.LeaseRequest
	// instances are the instances picks name (default grayInstances).
	instances []*rotapb.Instance
	leased    chan struct{}
}

func newFakeGray() *fakeGray { return &fakeGray{leased: make(chan struct{}, 1024)} }

func (f *fakeGray) Lease(_ context.Context, req *rotapb.LeaseRequest, opts ...grpc.CallOption) (*rotapb.LeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() { f.leased <- struct{}{} }()
	f.requests = append(f.requests, req)
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	if f.refusal != nil {
		for _, o := range opts {
			if t, ok := o.(grpc.TrailerCallOption); ok {
				*t.TrailerAddr = metadata.Pairs("rota-error", "invalid_argument")
			}
		}
		return nil, f.refusal
	}
	lease := f.leases
	f.leases++
	instances := f.instances
	if instances == nil {
		instances = grayInstances
	}
	if f.tickets {
		first := uint64(f.n)
		f.n += int(req.GetCount())
		positions := make([]uint32, req.GetCount())
		for i := range positions {
			positions[i] = uint32((first + uint64(i)) % 2)
		}
		return &rotapb.LeaseResponse{FirstTicket: first, Count: req.GetCount(), Rule: "round_robin", Instances: instances[:2], Positions: positions}, nil
	}
	resp := &rotapb.LeaseResponse{Count: req.GetCount(), Rule: "round_robin", Instances: instances}
	for i := uint32(0); i < req.GetCount(); i++ {
		resp.Picks = append(resp.Picks, &rotapb.LeasedPick{Ticket: grayTicket(lease, f.n), Position: uint32(grayPattern[f.n%len(grayPattern)])})
		f.n++
	}
	return resp, nil
}

func (f *fakeGray) set(apply func(f *fakeGray)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	apply(f)
}

// firstRequest is the first Lease request received, read under the lock (the channel may be
// leasing again meanwhile).
func (f *fakeGray) firstRequest() *rotapb.LeaseRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return nil
	}
	return f.requests[0]
}

func (f *fakeGray) leaseCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// waitLeases waits (bounded) until n leases were asked for.
func (f *fakeGray) waitLeases(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for f.leaseCount() < n {
		select {
		case <-f.leased:
		case <-deadline:
			t.Fatalf("%d leases asked for within 10s, want %d", f.leaseCount(), n)
		}
	}
}

func grayLeaser(t *testing.T, fake *fakeGray) (*leaser, chan struct{}) {
	t.Helper()
	l := &link{balancer: fake, service: "svc", log: quietLogger()}
	l.opts.backoff.Initial, l.opts.backoff.Max, l.opts.backoff.Factor = time.Hour, time.Hour, 2
	woken := make(chan struct{}, 1024)
	ls := newLeaser(l, "", func() { woken <- struct{}{} }, func(string) *leaseView { return nil })
	t.Cleanup(ls.close)
	return ls, woken
}

// takeDraw takes a draw, waiting (bounded) for the lease when the stream asks to.
func takeDraw(t *testing.T, s *versionStream, woken chan struct{}) draw {
	t.Helper()
	for attempt := 0; attempt < 100; attempt++ {
		d, state, err := s.take(allUsable{})
		if err != nil {
			t.Fatal(err)
		}
		if state == drawn {
			return d
		}
		select {
		case <-woken:
		case <-time.After(10 * time.Second):
			t.Fatal("no lease within 10s")
		}
	}
	t.Fatal("no draw after 100 waits")
	return draw{}
}

func TestPicksAreUsedInOrderWithTheirTickets(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	s := ls.stream("")
	first := takeDraw(t, s, woken)
	// The next block is leased as soon as the first one is being spent.
	fake.waitLeases(t, 2)
	if got := fake.firstRequest(); got.GetVersion() != "" || got.GetCount() != initialLease {
		t.Fatalf("first lease %v, want %d picks without a version", got, initialLease)
	}
	draws := []draw{first}
	for len(draws) < 2000 {
		draws = append(draws, takeDraw(t, s, woken))
	}
	for n, d := range draws {
		if !d.picked || d.local {
			t.Fatalf("draw %d: picked %v, local %v", n, d.picked, d.local)
		}
		if want := grayPattern[n%len(grayPattern)]; d.pos != want {
			t.Fatalf("draw %d went to position %d, want %d", n, d.pos, want)
		}
		if want := grayTicket(leaseOf(d.ticket), n); d.ticket != want {
			t.Fatalf("draw %d has ticket %#x, want %#x", n, d.ticket, want)
		}
		if d.view.ids[d.pos] != grayInstances[d.pos].GetId() || d.view.rule != "round_robin" {
			t.Fatalf("draw %d: view %v, rule %q", n, d.view.ids, d.view.rule)
		}
	}
}

func TestPicksAreDroppedWhenTheInstanceListChanges(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	s := ls.stream("")
	for i := 0; i < 3; i++ {
		if d := takeDraw(t, s, woken); leaseOf(d.ticket) != 0 {
			t.Fatalf("draw %d from lease %d", i, leaseOf(d.ticket))
		}
	}
	fake.waitLeases(t, 2) // the first block and the one prefetched after it
	ls.invalidate()
	d := takeDraw(t, s, woken)
	if lease := leaseOf(d.ticket); lease < 2 {
		t.Fatalf("after the instance list changed, a draw from lease %d, leased before the change", lease)
	}
}

func TestAPicksAnswerInFlightAcrossAChangeIsNotUsed(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	s := ls.stream("")
	// A lease asked for before the change and answered after it.
	ls.mu.Lock()
	s.mu.Lock()
	s.startFetch()
	s.gen++ // what invalidate does once the answer is on its way
	s.mu.Unlock()
	ls.mu.Unlock()
	fake.waitLeases(t, 2)
	if d := takeDraw(t, s, woken); leaseOf(d.ticket) == 0 {
		t.Fatal("a draw from the lease asked for before the change")
	}
}

func TestAStreamTakesEitherShapeAsItComes(t *testing.T) {
	fake := newFakeGray()
	fake.tickets = true
	ls, woken := grayLeaser(t, fake)
	s := ls.stream("")
	if d := takeDraw(t, s, woken); d.picked || d.ticket != 0 {
		t.Fatalf("first draw %+v, want ticket 0 of a ticket range", d)
	}
	fake.set(func(f *fakeGray) { f.tickets = false }) // the operator sets a gray split
	var picked *draw
	for n := 0; n < 1000 && picked == nil; n++ {
		if d := takeDraw(t, s, woken); d.picked {
			picked = &d
		} else if d.view.ids[d.pos] != []string{"a", "b"}[d.ticket%2] {
			t.Fatalf("ticket %d went to %s, not where its position names", d.ticket, d.view.ids[d.pos])
		}
	}
	if picked == nil || picked.view.ids[picked.pos] != grayInstances[picked.pos].GetId() {
		t.Fatalf("no picks after the service went gray: %+v", picked)
	}
	fake.set(func(f *fakeGray) { f.tickets = true }) // and removes it
	for n := 0; ; n++ {
		if d := takeDraw(t, s, woken); !d.picked {
			break
		}
		if n == 1000 {
			t.Fatal("still picks after the service left gray release")
		}
	}
}

func TestTheLocalRotationReplaysTheLastPicks(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	s := ls.stream("")
	takeDraw(t, s, woken)
	fake.waitLeases(t, 2)
	fake.set(func(f *fakeGray) { f.down = true })
	var local []draw
	for n := 0; n < 10_000 && len(local) < 40; n++ {
		if d := takeDraw(t, s, woken); d.local {
			local = append(local, d)
		}
	}
	if len(local) < 40 {
		t.Fatal("no local rotation while rota is down")
	}
	s.mu.Lock()
	last := append([]int(nil), s.lastPicks...)
	s.mu.Unlock()
	if len(last) == 0 {
		t.Fatal("no picks kept for the local rotation")
	}
	for i, d := range local {
		if want := last[(int(local[0].ticket)+i)%len(last)]; !d.picked || d.pos != want {
			t.Fatalf("local draw %d at position %d (picked %v), want %d: the last picks in order", i, d.pos, d.picked, want)
		}
	}
}

// allUsable holds every instance usable, for the lease streams' own tests.
type allUsable struct{}

func (allUsable) usable(*leaseView, int) (readyConn, bool) { return readyConn{}, true }

// fakeSubConn stands for one instance's READY subchannel.
type fakeSubConn struct {
	balancer.SubConn
	id string
}

func grayPicker(ls *leaser, ready ...string) *picker {
	p := &picker{leases: ls, link: ls.link, ticket: true, ready: map[string]readyConn{}}
	for _, i := range grayInstances {
		for _, id := range ready {
			if i.GetId() == id {
				p.ready[subConnKey(id, instanceAddr(i))] = readyConn{sc: &fakeSubConn{id: id}}
			}
		}
	}
	return p
}

// pickOnce runs the picker until it answers (bounded), as gRPC re-runs a queued pick.
func pickOnce(t *testing.T, p *picker, woken chan struct{}) (balancer.PickResult, error) {
	t.Helper()
	for attempt := 0; attempt < 100; attempt++ {
		r, err := p.Pick(balancer.PickInfo{Ctx: context.Background()})
		if !errors.Is(err, balancer.ErrNoSubConnAvailable) {
			return r, err
		}
		select {
		case <-woken:
		case <-time.After(10 * time.Second):
			t.Fatal("no lease within 10s")
		}
	}
	t.Fatal("the pick waited 100 times")
	return balancer.PickResult{}, nil
}

func TestPicksOfAnInstanceNotReadyArePassedOver(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	p := grayPicker(ls, "a", "v") // b is not READY
	n := 0                        // the scripted pick the next call should get
	for call := 0; call < 300; call++ {
		r, err := pickOnce(t, p, woken)
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		for grayPattern[n%len(grayPattern)] == 1 {
			n++ // b's picks are gaps
		}
		want := grayInstances[grayPattern[n%len(grayPattern)]].GetId()
		if got := r.SubConn.(*fakeSubConn).id; got != want {
			t.Fatalf("call %d went to %s, want %s (scripted pick %d)", call, got, want, n)
		}
		ticket, _ := strconv.ParseUint(r.Metadata.Get(TicketHeader)[0], 10, 64)
		if ticket != grayTicket(leaseOf(ticket), n) {
			t.Fatalf("call %d has ticket %#x, want pick %d's", call, ticket, n)
		}
		n++
	}
}

func TestPicksWithNoInstanceReady(t *testing.T) {
	fake := newFakeGray()
	ls, woken := grayLeaser(t, fake)
	p := grayPicker(ls) // nothing READY, nothing connecting
	if _, err := pickOnce(t, p, woken); status.Code(err) != codes.Unavailable {
		t.Fatalf("pick with no instance READY: %v, want UNAVAILABLE", err)
	}
	p.connecting = true
	if _, err := p.Pick(balancer.PickInfo{Ctx: context.Background()}); !errors.Is(err, balancer.ErrNoSubConnAvailable) {
		t.Fatalf("pick with instances connecting: %v, want to wait", err)
	}
}

// rota's refusals reach the call as UNAVAILABLE with rota's message: grpc-go turns the codes
// of gRFC A54 into INTERNAL when a picker returns them.
func TestRefusalsAreLegalPickerStatuses(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.Aborted, codes.OutOfRange, codes.DataLoss} {
		fake := newFakeGray()
		fake.refusal = status.Error(code, `version: must be set: service "svc" uses gray release`)
		ls, woken := grayLeaser(t, fake)
		_, err := pickOnce(t, grayPicker(ls, "a", "b", "v"), woken)
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || st.Message() != `version: must be set: service "svc" uses gray release` {
			t.Errorf("rota refused with %s; the picker returned %v, want UNAVAILABLE with rota's message", code, err)
		}
	}
	// Codes a picker may return are passed on.
	fake := newFakeGray()
	fake.refusal = status.Error(codes.ResourceExhausted, "too many leases")
	ls, woken := grayLeaser(t, fake)
	if _, err := pickOnce(t, grayPicker(ls, "a"), woken); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("RESOURCE_EXHAUSTED became %v", err)
	}
}
