package channel

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// fakeLeases answers Lease from a counter of its own, or fails while down.
type fakeLeases struct {
	rotapb.BalancerClient
	mu     sync.Mutex
	next   uint64
	counts []uint32
	down   bool
}

func (f *fakeLeases) Lease(_ context.Context, req *rotapb.LeaseRequest, _ ...grpc.CallOption) (*rotapb.LeaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	f.counts = append(f.counts, req.GetCount())
	first := f.next
	f.next += uint64(req.GetCount())
	positions := make([]uint32, req.GetCount())
	for i := range positions {
		positions[i] = uint32((first + uint64(i)) % 2)
	}
	return &rotapb.LeaseResponse{FirstTicket: first, Count: req.GetCount(), Rule: "round_robin", Positions: positions, Instances: []*rotapb.Instance{
		{Id: "a", Host: "127.0.0.1", Port: 1}, {Id: "b", Host: "127.0.0.1", Port: 2},
	}}, nil
}

func (f *fakeLeases) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *fakeLeases) leaseCounts() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint32(nil), f.counts...)
}

func testLeaser(t *testing.T, fake *fakeLeases) (*leaser, chan struct{}) {
	t.Helper()
	l := &link{balancer: fake, service: "svc", log: quietLogger()}
	l.opts.backoff.Initial, l.opts.backoff.Max, l.opts.backoff.Factor = 1e6, 1e7, 2
	woken := make(chan struct{}, 1024)
	ls := newLeaser(l, "", func() { woken <- struct{}{} }, func(string) *leaseView { return nil })
	t.Cleanup(ls.close)
	return ls, woken
}

// takeTicket takes a ticket, waiting (bounded) for the lease when the stream asks to.
func takeTicket(t *testing.T, s *versionStream, woken chan struct{}) draw {
	t.Helper()
	for attempt := 0; attempt < 100; attempt++ {
		d, state, err := s.take(allUsable{})
		if err != nil {
			t.Fatal(err)
		}
		if state == drawn {
			return d
		}
		waitWoken(t, woken)
	}
	t.Fatal("no ticket after 100 waits")
	return draw{}
}

func TestTicketsAreConsecutiveAndLeaseSizeGrowsWithTheRate(t *testing.T) {
	fake := &fakeLeases{}
	ls, woken := testLeaser(t, fake)
	s := ls.stream("")
	// Spent as fast as a loop can: every block lasts far less than the 75 ms target.
	for want := uint64(0); want < 100_000; want++ {
		if d := takeTicket(t, s, woken); d.ticket != want || d.local {
			t.Fatalf("ticket %d (local %v), want %d", d.ticket, d.local, want)
		}
	}
	counts := fake.leaseCounts()
	if counts[0] != initialLease {
		t.Fatalf("first lease of %d tickets, want %d", counts[0], initialLease)
	}
	for i := 1; i < len(counts); i++ {
		if counts[i] > MaxLease || counts[i] > counts[i-1]*16 {
			t.Fatalf("lease sizes %v: beyond the bound or grown more than 16× at once", counts)
		}
	}
	if last := counts[len(counts)-1]; last < 4096 {
		t.Fatalf("lease sizes %v: a fast caller should lease thousands of tickets at once", counts)
	}
}

func TestUnreachableRotaFallsBackToALocalRotationAndBack(t *testing.T) {
	fake := &fakeLeases{}
	ls, woken := testLeaser(t, fake)
	s := ls.stream("")
	takeTicket(t, s, woken)
	fake.setDown(true)
	// Spend the leased tickets; once a lease fails, tickets come from the local rotation
	// over the last leased list.
	var local []draw
	for n := 0; n < 10_000 && len(local) < 4; n++ {
		if d := takeTicket(t, s, woken); d.local {
			local = append(local, d)
		}
	}
	if len(local) < 4 {
		t.Fatal("no local rotation while rota is down")
	}
	for i, d := range local {
		if d.view.ids[d.pos] != []string{"a", "b"}[(int(local[0].ticket)+i)%2] {
			t.Fatalf("local draw %d went to %s", i, d.view.ids[d.pos])
		}
	}
	fake.setDown(false)
	s.mu.Lock()
	s.startFetch() // what the retry timer does
	s.mu.Unlock()
	waitFor(t, 10*time.Second, "a leased ticket after rota answered", func() bool {
		return !takeTicket(t, s, woken).local
	})
}

// The policy config refuses a rule rota cannot lease; the rule of a lease answer is only
// reported, never read to route.
func TestThePolicyConfigTakesOnlyLeasableRules(t *testing.T) {
	if _, err := (builder{}).ParseConfig([]byte(`{"rule":"least_request"}`)); err == nil {
		t.Error("the policy accepted least_request")
	}
	for _, rule := range []string{"round_robin", "repeat(n=3)", "weighted"} {
		if c, err := (builder{}).ParseConfig([]byte(`{"rule":"` + rule + `","version":"zlt"}`)); err != nil || c.(*Config).Version != "zlt" || c.(*Config).Rule != rule {
			t.Errorf("config with %s: %v %v", rule, c, err)
		}
	}
	b, err := blockOf(&rotapb.LeaseResponse{Rule: "some_future_rule", Count: 2, Positions: []uint32{1, 0},
		Instances: []*rotapb.Instance{{Id: "a", Host: "127.0.0.1", Port: 1}, {Id: "b", Host: "127.0.0.1", Port: 2}}})
	if err != nil || b.view.rule != "some_future_rule" || !slices.Equal(b.positions, []int{1, 0}) {
		t.Fatalf("a lease of a rule the channel has never heard of: %+v, %v", b, err)
	}
}
