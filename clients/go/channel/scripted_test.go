package channel

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// scriptedRota is a rota on a loopback port whose Watch sends one snapshot of instances and
// whose Lease is answered by a fakeGray, for channels end to end.
type scriptedRota struct {
	rotapb.UnimplementedRegistryServer
	rotapb.UnimplementedBalancerServer
	instances []*rotapb.Instance
	leases    *fakeGray
	addr      string
}

func startScriptedRota(t *testing.T, instances []*rotapb.Instance, leases *fakeGray) *scriptedRota {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedRota{instances: instances, leases: leases, addr: lis.Addr().String()}
	srv := grpc.NewServer()
	rotapb.RegisterRegistryServer(srv, s)
	rotapb.RegisterBalancerServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return s
}

func (s *scriptedRota) Watch(_ *rotapb.WatchRequest, stream rotapb.Registry_WatchServer) error {
	err := stream.Send(&rotapb.WatchEvent{Epoch: 1, Event: &rotapb.WatchEvent_Snapshot{Snapshot: &rotapb.InstanceList{Instances: s.instances}}})
	if err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (s *scriptedRota) Lease(ctx context.Context, req *rotapb.LeaseRequest) (*rotapb.LeaseResponse, error) {
	var trailer metadata.MD
	resp, err := s.leases.Lease(ctx, req, grpc.Trailer(&trailer))
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	return resp, err
}

func (s *scriptedRota) Report(_ context.Context, req *rotapb.ReportRequest) (*rotapb.ReportResponse, error) {
	return &rotapb.ReportResponse{Accepted: uint32(len(req.GetOutcomes()))}, nil
}

// grayWorld is three echo instances (a, b unversioned; v of version v2) behind a scripted
// rota answering leases with picks, and a channel to them.
type grayWorld struct {
	servers map[string]*echo.Server
	log     *echo.Log
	leases  *fakeGray
	conn    *grpc.ClientConn
}

func newGrayWorld(t *testing.T) *grayWorld {
	t.Helper()
	w := &grayWorld{servers: map[string]*echo.Server{}, log: &echo.Log{}, leases: newFakeGray()}
	var instances []*rotapb.Instance
	for _, model := range grayInstances {
		srv, err := echo.Start(model.GetId(), w.log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Kill)
		w.servers[model.GetId()] = srv
		instances = append(instances, &rotapb.Instance{Id: model.GetId(), Host: "127.0.0.1", Port: uint32(srv.Addr.Port), Version: model.GetVersion()})
	}
	// The scripted leases name the instances at their real addresses.
	w.leases.instances = instances
	scripted := startScriptedRota(t, instances, w.leases)
	conn, err := grpc.NewClient("rota:///echo", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(NewResolver(WithServer(scripted.addr), WithLogger(quietLogger()), WithTicketHeader(true),
			WithBackoff(rota.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, Factor: 2}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w.conn = conn
	return w
}

// A channel without a version of a service under gray release: each call goes where rota's
// pick sends it, with the pick's ticket; a killed instance's picks are passed over as gaps,
// with no failed call.
func TestGrayChannelFollowsRotasPicks(t *testing.T) {
	w := newGrayWorld(t)
	ctx := testContext(t, time.Minute)
	for i, r := range echo.Calls(ctx, w.conn, 60, "", 5*time.Second) {
		if r.Err != nil {
			t.Fatalf("call %d: %v", i, r.Err)
		}
	}
	calls := w.log.Calls()
	if len(calls) != 60 {
		t.Fatalf("%d calls answered, want 60", len(calls))
	}
	for n, c := range calls {
		want := grayInstances[grayPattern[n%len(grayPattern)]].GetId()
		if c.Instance != want || uint64(c.Ticket) != grayTicket(leaseOf(uint64(c.Ticket)), n) {
			t.Fatalf("call %d reached %s with ticket %#x; pick %d is %s with ticket %#x", n, c.Instance, c.Ticket,
				n, want, grayTicket(leaseOf(uint64(c.Ticket)), n))
		}
	}
	if req := w.leases.firstRequest(); req.GetVersion() != "" || req.GetService() != "echo" {
		t.Fatalf("leased %v, want the service without a version", req)
	}

	w.servers["b"].Kill()
	// The channel has seen b's death once a whole pattern's worth of calls in a row
	// succeeds: those calls span a pick of b, which they can only have passed over.
	// Until then a call routed to b's closing connection may fail.
	succeeded := 0
	for i := 0; i < 10*len(grayPattern) && succeeded < len(grayPattern); i++ {
		if echo.Calls(ctx, w.conn, 1, "", 5*time.Second)[0].Err == nil {
			succeeded++
		} else {
			succeeded = 0
		}
	}
	if succeeded < len(grayPattern) {
		t.Fatalf("%d calls in a row did not succeed after b was killed", len(grayPattern))
	}
	before := w.log.Len()
	for i, r := range echo.Calls(ctx, w.conn, 60, "", 5*time.Second) {
		if r.Err != nil {
			t.Fatalf("call %d after b was killed: %v", i, r.Err)
		}
	}
	after := w.log.Calls()[before:]
	// The calls follow the scripted picks in order; the only picks passed over are b's.
	last := pickIndex(t, after[0])
	for i, c := range after[1:] {
		n := pickIndex(t, c)
		if n <= last {
			t.Fatalf("call %d followed pick %d, after pick %d", i+1, n, last)
		}
		for gap := last + 1; gap < n; gap++ {
			if id := grayInstances[grayPattern[gap%len(grayPattern)]].GetId(); id != "b" {
				t.Fatalf("call %d followed pick %d, passing over pick %d of %s, which is up", i+1, n, gap, id)
			}
		}
		last = n
	}
	if w.servers["a"].Count() == 0 || w.servers["v"].Count() == 0 {
		t.Fatal("the instances still up did not share the calls")
	}
}

// pickIndex is the scripted pick a call followed, from its instance and ticket.
func pickIndex(t *testing.T, c echo.Call) int {
	t.Helper()
	for n := 0; n < 1_000_000; n++ {
		if grayInstances[grayPattern[n%len(grayPattern)]].GetId() == c.Instance && uint64(c.Ticket) == grayTicket(leaseOf(uint64(c.Ticket)), n) {
			return n
		}
	}
	t.Fatalf("a call to %s with ticket %#x follows no scripted pick", c.Instance, c.Ticket)
	return -1
}

// rota's refusal of a lease fails the channel's calls with UNAVAILABLE and rota's message,
// not with grpc-go's INTERNAL "illegal status" for a picker's INVALID_ARGUMENT.
func TestARefusedLeaseFailsCallsAsUnavailable(t *testing.T) {
	w := newGrayWorld(t)
	const message = `version: must be set: service "echo" uses gray release, which assigns versions per pick`
	w.leases.set(func(f *fakeGray) { f.refusal = status.Error(codes.InvalidArgument, message) })
	r := echo.Calls(testContext(t, time.Minute), w.conn, 1, "", 5*time.Second)[0]
	if st := status.Convert(r.Err); st.Code() != codes.Unavailable || st.Message() != message {
		t.Fatalf("the call failed with %v, want UNAVAILABLE: %s", r.Err, message)
	}
}
