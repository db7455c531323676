package rota

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// TestPipelinedPickStream sends many PickRequests on PickStreams without waiting for the
// answers, while other goroutines read them: rota answers every one, in order, and the
// connection (with two registration streams open on it) survives — with one stream, and with
// several pipelining on the same connection at once (h2's budget for small DATA frames is per
// connection, so what holds for one stream must hold for all of them together).
func TestPipelinedPickStream(t *testing.T) {
	for _, streams := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("%d streams", streams), func(t *testing.T) { pipelinedPickStreams(t, streams) })
	}
}

func pipelinedPickStreams(t *testing.T, streams int) {
	const perStream = 12_000
	total := perStream * streams
	// A one-letter service and the default rule: each request is an 8-byte DATA frame, the
	// smallest a PickRequest makes and the most framing overhead per byte (this test has a
	// server of its own, so the name needs no prefix).
	const pipelineSvc = "e"
	ctx := testContext(t, 120*time.Second)
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

	ids := []string{"a", "b", "c"}
	start := time.Now()
	type result struct {
		tickets []uint64
		err     error
	}
	results := make(chan result, streams)
	for s := range streams {
		stream, err := rotapb.NewBalancerClient(c.Conn()).PickStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan error, 1)
		go func() {
			req := &rotapb.PickRequest{Service: pipelineSvc}
			for i := range perStream {
				if err := stream.Send(req); err != nil {
					// The stream is broken; Recv reports why.
					sent <- fmt.Errorf("send %d: %w", i, err)
					return
				}
			}
			sent <- stream.CloseSend()
		}()
		go func() {
			tickets := make([]uint64, 0, perStream)
			fail := func(err error) { results <- result{tickets, fmt.Errorf("stream %d: %w", s, err)} }
			for i := range perStream {
				resp, err := stream.Recv()
				if err != nil {
					fail(fmt.Errorf("after %d of %d responses (%s): %w", i, perStream, time.Since(start), err))
					return
				}
				if resp.GetError() != nil {
					fail(fmt.Errorf("response %d carries an error: %v", i, resp.GetError()))
					return
				}
				ticket := resp.GetTicket()
				if len(tickets) > 0 && ticket <= tickets[len(tickets)-1] {
					fail(fmt.Errorf("response %d has ticket %d after %d: answers out of order", i, ticket, tickets[len(tickets)-1]))
					return
				}
				if id, want := resp.GetInstance().GetId(), ids[ticket%uint64(len(ids))]; id != want {
					fail(fmt.Errorf("response %d (ticket %d) picked %q, want %q by round robin", i, ticket, id, want))
					return
				}
				tickets = append(tickets, ticket)
			}
			if _, err := stream.Recv(); err != io.EOF {
				fail(fmt.Errorf("after %d responses: %v, want the end of the stream", perStream, err))
				return
			}
			results <- result{tickets, <-sent}
		}()
	}
	seen := make(map[uint64]bool, total)
	for range streams {
		r := <-results
		if r.err != nil {
			t.Fatalf("%v\nserver log (tail):\n%s", r.err, srv.log.String())
		}
		for _, ticket := range r.tickets {
			if seen[ticket] {
				t.Fatalf("ticket %d answered twice", ticket)
			}
			seen[ticket] = true
		}
	}
	// One rotation across the streams: every ticket from 0 to total-1 answered once.
	for ticket := range uint64(total) {
		if !seen[ticket] {
			t.Fatalf("ticket %d of %d never answered", ticket, total)
		}
	}
	t.Logf("%d pipelined picks on %d streams of one connection in %s", total, streams, time.Since(start))

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
