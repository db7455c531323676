package channel

import (
	"fmt"
	"slices"
	"testing"
	"time"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// TestRotasPositionsFollowTheOracle leases from a live rota, with and without exclude, and
// checks each ticket's position against the test oracle the channel scenarios check rotations
// with; then a channel's lease stream, with one instance not READY, leases without it and
// passes no ticket over.
func TestRotasPositionsFollowTheOracle(t *testing.T) {
	srv := startRota(t, "127.0.0.1:0")
	client := dialRota(t, srv.addr)
	ctx := testContext(t, time.Minute)
	weights := []uint32{30, 10, 20, 0, 10}
	var instances []rota.Instance
	for i, w := range weights {
		instances = append(instances, rota.Instance{
			ID: fmt.Sprintf("p-%d", i), Service: "parity", Host: "127.0.0.1", Port: uint32(7000 + i), Weight: w, ZeroWeight: w == 0,
		})
	}
	reg, err := client.Register(ctx, instances...)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	stub := rotapb.NewBalancerClient(client.Conn())

	for _, rule := range []string{"round_robin", "repeat(n=3)", "weighted"} {
		for _, exclude := range [][]string{nil, {"p-2"}, {"p-0", "p-4", "gone"}} {
			resp, err := stub.Lease(ctx, &rotapb.LeaseRequest{Service: "parity", Rule: rule, Count: 40, Exclude: exclude})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			var listed []uint64
			for _, inst := range resp.GetInstances() {
				ids = append(ids, inst.GetId())
				listed = append(listed, weightOf(inst))
				if slices.Contains(exclude, inst.GetId()) {
					t.Fatalf("%s excluding %q: %s in the list %q", rule, exclude, inst.GetId(), ids)
				}
			}
			if len(ids) != len(weights)-len(slices.DeleteFunc(slices.Clone(exclude), func(id string) bool { return id == "gone" })) {
				t.Fatalf("%s excluding %q: list %q", rule, exclude, ids)
			}
			want := oraclePositions(t, rule, listed, resp.GetFirstTicket(), resp.GetCount())
			if !slices.Equal(resp.GetPositions(), want) {
				t.Fatalf("%s excluding %q over %q from ticket %d: rota's positions %v, the oracle's %v",
					rule, exclude, ids, resp.GetFirstTicket(), resp.GetPositions(), want)
			}
		}
	}

	// A channel's stream with p-1 not READY: its leases exclude it, rota leaves it out, and
	// every ticket is used (none passed over).
	l := &link{balancer: stub, service: "parity", log: quietLogger()}
	woken := make(chan struct{}, 1024)
	ls := newLeaser(l, "weighted", func() { woken <- struct{}{} }, func(string) *leaseView { return nil })
	t.Cleanup(ls.close)
	p := &picker{leases: ls, link: l, ready: map[string]readyConn{}, known: &knownInstances{}}
	for _, i := range instances {
		addr := fmt.Sprintf("%s:%d", i.Host, i.Port)
		p.known.instances = append(p.known.instances, knownInstance{info: instanceInfo{id: i.ID}, addr: addr})
		if i.ID != "p-1" {
			p.ready[subConnKey(i.ID, addr)] = readyConn{sc: &fakeSubConn{id: i.ID}, hold: &holdout{}}
		}
	}
	ls.current.Store(p)
	s := ls.stream("")
	var last uint64
	for n := 0; n < 200; n++ {
		var d draw
		for attempt := 0; ; attempt++ {
			var state takeState
			if d, state, err = s.take(p); err != nil {
				t.Fatal(err)
			} else if state == drawn {
				break
			} else if state == noneUsable || attempt == 100 {
				t.Fatalf("ticket %d: state %d", n, state)
			}
			select {
			case <-woken:
			case <-time.After(10 * time.Second):
				t.Fatal("no lease within 10s")
			}
		}
		if slices.Contains(d.view.ids, "p-1") {
			t.Fatalf("ticket %d: lease list %q holds p-1, which the channel cannot use", d.ticket, d.view.ids)
		}
		if n > 0 && d.ticket != last+1 {
			t.Fatalf("ticket %d after %d: a ticket was passed over", d.ticket, last)
		}
		last = d.ticket
	}
}
