package channel

import (
	"fmt"
	"sort"
	"testing"
	"time"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// TestTicketMapAgreesWithRotasPick draws tickets with rota's unary Pick (with and without
// exclude) and maps the same tickets locally: the instance must be the same.
func TestTicketMapAgreesWithRotasPick(t *testing.T) {
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

	for _, ruleName := range []string{"round_robin", "repeat(n=3)", "weighted"} {
		// The list a lease maps over (count 0 reserves nothing).
		resp, err := rotapb.NewBalancerClient(client.Conn()).Lease(ctx, &rotapb.LeaseRequest{Service: "parity", Rule: ruleName})
		if err != nil {
			t.Fatal(err)
		}
		view, err := viewOf(resp)
		if err != nil {
			t.Fatal(err)
		}
		if !sort.StringsAreSorted(view.ids) || len(view.ids) != len(weights) {
			t.Fatalf("lease list %v", view.ids)
		}
		position := map[string]int{}
		for i, id := range view.ids {
			position[id] = i
		}
		checked := 0
		for n := 0; n < 40; n++ {
			var opts []rota.PickOption
			var excluded func(int) bool
			if n%4 == 3 {
				skip := view.ids[n%len(view.ids)]
				opts = append(opts, rota.Exclude(skip))
				excluded = func(p int) bool { return view.ids[p] == skip }
			}
			pick, err := client.Pick(ctx, "parity", append(opts, rota.Rule(ruleName))...)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := view.m.position(pick.Ticket, excluded)
			if !ok || view.ids[got] != pick.Instance.ID {
				t.Fatalf("%s ticket %d: rota picked %s, the local map says %v", ruleName, pick.Ticket, pick.Instance.ID, view.ids[got])
			}
			checked++
		}
		if checked != 40 {
			t.Fatalf("%s: checked %d picks", ruleName, checked)
		}
	}
}
