package rota

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// TestPipelinedPickStream sends many PickRequests on one PickStream without waiting for the
// answers, while another goroutine reads them: rota answers every one, in order, and the
// connection (with a registration stream open on it) survives.
func TestPipelinedPickStream(t *testing.T) {
	const n = 20_000
	pipelineSvc := uniqueService("go-pipeline")
	ctx := testContext(t, 60*time.Second)
	srv := startTestServer(t)
	c := dial(t, srv.addr)
	reg, err := c.Register(ctx, instance(pipelineSvc, "a", 9001), instance(pipelineSvc, "b", 9002),
		instance(pipelineSvc, "c", 9003))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	lease := reg.LeaseID()

	// A second registration stream on the same connection, driven by hand, so that its
	// liveness after the burst can be checked with an acknowledged message.
	sideSvc := uniqueService("go-pipeline-side")
	side, err := rotapb.NewRegistryClient(c.Conn()).Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	announce := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Announce{Announce: &rotapb.Announce{
		Instances: []*rotapb.Instance{{Service: sideSvc, Id: "s", Host: "127.0.0.1", Port: 9100}},
	}}}
	if err := side.Send(announce); err != nil {
		t.Fatal(err)
	}
	if resp, err := side.Recv(); err != nil || resp.GetAck().GetSeq() != 1 {
		t.Fatalf("side registration: %v, %v; want the ack of its announcement", resp, err)
	}

	stream, err := rotapb.NewBalancerClient(c.Conn()).PickStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		req := &rotapb.PickRequest{Service: pipelineSvc, Rule: "round_robin"}
		for i := range n {
			if err := stream.Send(req); err != nil {
				// The stream is broken; Recv reports why.
				sent <- fmt.Errorf("send %d: %w", i, err)
				return
			}
		}
		sent <- stream.CloseSend()
	}()

	ids := []string{"a", "b", "c"}
	counts := map[string]int{}
	start := time.Now()
	for i := range n {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d of %d responses (%s): %v\nserver log (tail):\n%s", i, n, time.Since(start), err, srv.log.String())
		}
		if resp.GetError() != nil {
			t.Fatalf("response %d carries an error: %v", i, resp.GetError())
		}
		if resp.GetTicket() != uint64(i) {
			t.Fatalf("response %d has ticket %d, want %d", i, resp.GetTicket(), i)
		}
		id := resp.GetInstance().GetId()
		if want := ids[i%len(ids)]; id != want {
			t.Fatalf("response %d (ticket %d) picked %q, want %q by round robin", i, resp.GetTicket(), id, want)
		}
		counts[id]++
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after %d responses: %v, want the end of the stream", n, err)
	}
	if err := <-sent; err != nil {
		t.Errorf("sending: %v", err)
	}
	for _, id := range ids {
		if got := counts[id]; got < n/3-1 || got > n/3+1 {
			t.Errorf("instance %s picked %d times, want %d ± 1", id, got, n/3)
		}
	}
	t.Logf("%d pipelined picks in %s", n, time.Since(start))

	// The connection lived through the burst: the side stream still answers, and the
	// client's registration kept its lease.
	update := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Update{Update: &rotapb.Update{
		Instance: &rotapb.InstanceRef{Service: sideSvc, Id: "s"}, Status: rotapb.InstanceStatus_DRAINING,
	}}}
	if err := side.Send(update); err != nil {
		t.Fatalf("side registration after the burst: %v", err)
	}
	if resp, err := side.Recv(); err != nil || resp.GetAck().GetSeq() != 2 || len(resp.GetAck().GetAccepted()) != 1 {
		t.Fatalf("side registration after the burst: %v, %v; want the ack of the update", resp, err)
	}
	if got := reg.LeaseID(); got != lease {
		t.Errorf("the registration's lease changed from %d to %d: its stream was lost", lease, got)
	}
	instances, err := c.Instances(ctx, pipelineSvc)
	if err != nil || len(instances) != 3 {
		t.Errorf("instances after the burst: %+v, %v; want a, b and c", instances, err)
	}
	_ = side.CloseSend()
}
