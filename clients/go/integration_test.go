package rota

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// Tests against a live rota server: the shared one, or one of the test's own.

// serviceSeq makes service names unique within the test process, so that the tests can run
// repeatedly (go test -count=N) against one server, whose rotations go on between runs.
var serviceSeq atomic.Int64

func uniqueService(base string) string {
	return fmt.Sprintf("%s-%d", base, serviceSeq.Add(1))
}

func instance(service, id string, port uint32) Instance {
	return Instance{Service: service, ID: id, Host: "127.0.0.1", Port: port}
}

func pickIDs(t *testing.T, c *Client, n int, service string, opts ...PickOption) []string {
	t.Helper()
	var ids []string
	for range n {
		p, err := c.Pick(testContext(t, 5*time.Second), service, opts...)
		if err != nil {
			t.Fatalf("pick %s: %v", service, err)
		}
		if p.LocalFallback {
			t.Fatalf("pick %s answered from the local cache", service)
		}
		ids = append(ids, p.Instance.ID)
	}
	return ids
}

func TestRegisterThenPick(t *testing.T) {
	registerSvc := uniqueService("go-register")
	ctx := testContext(t, 10*time.Second)
	provider, consumer := dial(t, rotaAddr), dial(t, rotaAddr)
	reg, err := provider.Register(ctx, instance(registerSvc, "a", 9001), instance(registerSvc, "b", 9002))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	if reg.LeaseID() == 0 {
		t.Error("lease id 0")
	}
	p, err := consumer.Pick(ctx, registerSvc)
	if err != nil {
		t.Fatal(err)
	}
	want := Instance{Service: registerSvc, ID: "a", Host: "127.0.0.1", Port: 9001, Status: StatusUp, Metadata: map[string]string{}}
	if p.Instance.ID != want.ID || p.Instance.Addr() != "127.0.0.1:9001" || p.Instance.Status != StatusUp ||
		p.Ticket != 0 || p.Rule != "round_robin" || p.Fallback != "" || p.LocalFallback || p.Epoch == 0 {
		t.Errorf("first pick %+v, want a (127.0.0.1:9001, UP) with ticket 0 by round_robin", p)
	}
	if got, want := pickIDs(t, consumer, 3, registerSvc), []string{"b", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	instances, err := consumer.Instances(ctx, registerSvc)
	if err != nil || len(instances) != 2 || instances[0].ID != "a" || instances[1].ID != "b" {
		t.Errorf("Instances = %+v, %v; want a and b", instances, err)
	}
}

func TestCloseWithdraws(t *testing.T) {
	closeSvc := uniqueService("go-close")
	ctx := testContext(t, 10*time.Second)
	provider, consumer := dial(t, rotaAddr), dial(t, rotaAddr)
	keep, err := provider.Register(ctx, instance(closeSvc, "stays", 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close(ctx)
	reg, err := provider.Register(ctx, instance(closeSvc, "goes", 9002))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pickIDs(t, consumer, 2, closeSvc), []string{"goes", "stays"}; !slices.Equal(got, want) {
		t.Fatalf("picked %q, want %q", got, want)
	}
	if err := reg.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := reg.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The withdrawal is acknowledged only once picks no longer see it.
	if got, want := pickIDs(t, consumer, 3, closeSvc), []string{"stays", "stays", "stays"}; !slices.Equal(got, want) {
		t.Errorf("after Close picked %q, want %q", got, want)
	}
	if err := keep.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = consumer.Pick(ctx, closeSvc)
	var rerr *Error
	if !errors.As(err, &rerr) || rerr.Code != codes.Unavailable {
		t.Errorf("pick with every instance withdrawn: %v, want UNAVAILABLE", err)
	}
}

func TestRegisterIsAllOrNothing(t *testing.T) {
	conflictSvc := uniqueService("go-conflict")
	ctx := testContext(t, 10*time.Second)
	owner, intruder, consumer := dial(t, rotaAddr), dial(t, rotaAddr), dial(t, rotaAddr)
	reg, err := owner.Register(ctx, instance(conflictSvc, "a", 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)

	taken := instance(conflictSvc, "a", 9999)
	taken.Host = "127.0.0.2"
	fresh := instance(conflictSvc, "b", 9002)
	got, err := intruder.Register(ctx, fresh, taken, instance(conflictSvc, "zero", 0))
	var refused *RefusedError
	if got != nil || !errors.As(err, &refused) {
		t.Fatalf("Register = %v, %v; want a *RefusedError", got, err)
	}
	var reasons []string
	for _, r := range refused.Refusals {
		reasons = append(reasons, r.Instance.Service+"/"+r.Instance.ID+":"+codeName(r.Code))
	}
	slices.Sort(reasons)
	if want := []string{conflictSvc + "/a:ALREADY_EXISTS", conflictSvc + "/zero:INVALID_ARGUMENT"}; !slices.Equal(reasons, want) {
		t.Errorf("refusals %q, want %q", reasons, want)
	}
	if c := status.Code(err); c != codes.AlreadyExists && c != codes.InvalidArgument {
		t.Errorf("status.Code = %s, want the first refusal's code", c)
	}
	// Nothing of the refused registration stays, not even "b", which rota had accepted.
	instances, err := consumer.Instances(ctx, conflictSvc)
	if err != nil || len(instances) != 1 || instances[0].ID != "a" {
		t.Errorf("instances %+v, %v; want only a", instances, err)
	}
	if got, want := pickIDs(t, consumer, 2, conflictSvc), []string{"a", "a"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	p, _ := consumer.Pick(ctx, conflictSvc)
	if p == nil || p.Instance.Host != "127.0.0.1" {
		t.Errorf("picked %+v, want the owner's instance on 127.0.0.1", p)
	}
}

func TestPickErrorsCarryTheStatus(t *testing.T) {
	neverRegisteredSvc := uniqueService("go-never-registered")
	ctx := testContext(t, 10*time.Second)
	c := dial(t, rotaAddr)
	for _, tc := range []struct {
		service string
		opts    []PickOption
		code    codes.Code
		message string
	}{
		{neverRegisteredSvc, nil, codes.NotFound, neverRegisteredSvc},
		{"", nil, codes.InvalidArgument, "service"},
		{"bad service name", nil, codes.InvalidArgument, "service"},
		{neverRegisteredSvc, []PickOption{Rule("zigzag")}, codes.InvalidArgument, "round_robin"},
	} {
		_, err := c.Pick(ctx, tc.service, tc.opts...)
		var rerr *Error
		if !errors.As(err, &rerr) {
			t.Errorf("pick %q: %v, want an *Error", tc.service, err)
			continue
		}
		st, ok := status.FromError(err)
		if rerr.Code != tc.code || !ok || st.Code() != tc.code || st.Message() != rerr.Message ||
			!strings.Contains(rerr.Message, tc.message) {
			t.Errorf("pick %q: %v (status %v), want %s mentioning %q", tc.service, err, st, tc.code, tc.message)
		}
		if want := "rota: " + codeName(tc.code) + ": " + rerr.Message; err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
	}
}

func TestPickOptionsReachRota(t *testing.T) {
	optionsSvc := uniqueService("go-options")
	ctx := testContext(t, 10*time.Second)
	provider, consumer := dial(t, rotaAddr), dial(t, rotaAddr)
	v1 := instance(optionsSvc, "v1", 9101)
	v1.Version = "v1"
	reg, err := provider.Register(ctx, instance(optionsSvc, "a", 9001), instance(optionsSvc, "b", 9002),
		instance(optionsSvc, "c", 9003), v1)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	if got, want := pickIDs(t, consumer, 4, optionsSvc, Rule("repeat(n=2)")), []string{"a", "a", "b", "b"}; !slices.Equal(got, want) {
		t.Errorf("repeat(n=2) picked %q, want %q", got, want)
	}
	if got, want := pickIDs(t, consumer, 3, optionsSvc, Exclude("a"), Exclude("b")), []string{"c", "c", "c"}; !slices.Equal(got, want) {
		t.Errorf("excluding a and b picked %q, want %q", got, want)
	}
	if got, want := pickIDs(t, consumer, 2, optionsSvc, Version("v1"), Key("k"), Zone("z")), []string{"v1", "v1"}; !slices.Equal(got, want) {
		t.Errorf("version v1 picked %q, want %q", got, want)
	}
	p, err := consumer.Pick(WithVersion(ctx, "v2"), optionsSvc, Rule("repeat(n=2)"))
	if err != nil || p.Rule != "repeat(n=2)" || p.Instance.Version != "" ||
		p.Fallback != `no instance with version "v2"; picked from instances with no version` {
		t.Errorf("version v2 from the context: %+v, %v; want a fallback to the unversioned instances", p, err)
	}
}

func TestReportCountsOutcomes(t *testing.T) {
	reportSvc := uniqueService("go-report")
	reportNowhereSvc := uniqueService("go-report-nowhere")
	ctx := testContext(t, 10*time.Second)
	provider, consumer := dial(t, rotaAddr), dial(t, rotaAddr)
	reg, err := provider.Register(ctx, instance(reportSvc, "r1", 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	p, err := consumer.Pick(ctx, reportSvc)
	if err != nil {
		t.Fatal(err)
	}
	summary, err := consumer.Report(ctx,
		p.Outcome(ResultOK, 1500*time.Microsecond),
		p.Outcome(ResultError, 3*time.Millisecond),
		Outcome{Service: reportSvc, InstanceID: "r1", Result: ResultConnectFailure},
		Outcome{Service: reportSvc, InstanceID: "ghost", Result: ResultOK},
		Outcome{Service: reportNowhereSvc, InstanceID: "r1", Result: ResultOK},
	)
	if err != nil || summary != (ReportSummary{Accepted: 3, Ignored: 2}) {
		t.Errorf("Report = %+v, %v; want 3 accepted and 2 ignored", summary, err)
	}
	_, err = consumer.Report(ctx, Outcome{Service: reportSvc, InstanceID: "r1"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("an outcome without a result: %v, want INVALID_ARGUMENT", err)
	}
	// Timed passes the call's own result through.
	boom := errors.New("boom")
	if err := Timed(ctx, consumer, p, func() error { return boom }); err != boom {
		t.Errorf("Timed returned %v, want the call's error", err)
	}
	n, err := TimedValue(ctx, consumer, p, func() (int, error) { return 42, nil })
	if n != 42 || err != nil {
		t.Errorf("TimedValue = %d, %v; want 42, nil", n, err)
	}
}

func TestTimedReportsTheOutcome(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	fake := &fakeRota{}
	addr, _ := serveFake(t, fake)
	c := dial(t, addr)
	pick := &Pick{Instance: Instance{Service: "svc", ID: "a"}, Ticket: 12, Rule: "repeat(n=3)"}

	const pause = 20 * time.Millisecond
	if err := Timed(ctx, c, pick, func() error { time.Sleep(pause); return nil }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := Timed(ctx, c, pick, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Timed returned %v, want boom", err)
	}
	local := *pick
	local.LocalFallback = true
	if err := Timed(ctx, c, &local, func() error { return nil }); err != nil {
		t.Fatal(err)
	}

	_, _, reports := fake.recorded()
	if len(reports) != 2 {
		t.Fatalf("%d outcomes reported, want 2 (none for the local pick)", len(reports))
	}
	ok, failed := reports[0], reports[1]
	for _, o := range reports {
		if o.GetService() != "svc" || o.GetInstanceId() != "a" || o.GetTicket() != 12 || o.GetRule() != "repeat(n=3)" {
			t.Errorf("outcome %v does not name the pick", o)
		}
	}
	if ok.GetResult() != rotapb.CallResult_CALL_RESULT_OK || ok.GetLatencyUs() < uint64(pause.Microseconds()) || ok.GetLatencyUs() > 5_000_000 {
		t.Errorf("outcome of the good call %v, want OK with a latency of at least %s", ok, pause)
	}
	if failed.GetResult() != rotapb.CallResult_CALL_RESULT_ERROR {
		t.Errorf("outcome of the failed call %v, want ERROR", failed)
	}
}

// TestFallbackWhenRotaDies kills a server of its own and picks from the watched list.
func TestFallbackWhenRotaDies(t *testing.T) {
	fallbackSvc := uniqueService("go-fallback")
	ctx := testContext(t, 20*time.Second)
	srv := startTestServer(t)
	provider := dial(t, srv.addr)
	zlt := instance(fallbackSvc, "zlt-1", 9101)
	zlt.Version = "zlt"
	if _, err := provider.Register(ctx, instance(fallbackSvc, "p1", 9001), instance(fallbackSvc, "p2", 9002), zlt); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	consumer := dial(t, srv.addr, WithFallback(fallbackSvc), WithLogger(logs.logger()))
	if err := consumer.Follow(ctx, fallbackSvc); err != nil {
		t.Fatal(err)
	}
	if got, want := pickIDs(t, consumer, 2, fallbackSvc), []string{"p1", "p2"}; !slices.Equal(got, want) {
		t.Fatalf("with rota up picked %q, want %q", got, want)
	}

	if err := srv.kill(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		p, err := consumer.Pick(ctx, fallbackSvc)
		if err != nil {
			t.Fatalf("with rota down: %v", err)
		}
		if !p.LocalFallback {
			t.Fatalf("with rota down: %+v, want LocalFallback", p)
		}
		ids = append(ids, p.Instance.ID)
	}
	if want := []string{"p1", "p2", "p1"}; !slices.Equal(ids, want) {
		t.Errorf("with rota down picked %q, want %q", ids, want)
	}
	p, err := consumer.Pick(ctx, fallbackSvc, Version("zlt"))
	if err != nil || !p.LocalFallback || p.Instance.ID != "zlt-1" || p.Fallback != "" {
		t.Errorf("version zlt with rota down: %+v, %v; want zlt-1 from the cache", p, err)
	}
	p, err = consumer.Pick(ctx, fallbackSvc, Version("nobody"))
	if err != nil || !p.LocalFallback || p.Instance.Version != "" || p.Fallback == "" {
		t.Errorf("version nobody with rota down: %+v, %v; want an unversioned instance, with a fallback note", p, err)
	}
	if n := logs.count("rota unreachable; picking followed services locally"); n != 1 {
		t.Errorf("%d fallback log lines, want 1 for the outage", n)
	}
}

// TestHeartbeatsKeepTheRegistration registers through the client and through a raw stream
// that sends no heartbeat on a server with a 1 s heartbeat timeout: only the raw one
// expires.
func TestHeartbeatsKeepTheRegistration(t *testing.T) {
	heartbeatSvc := uniqueService("go-heartbeat")
	ctx := testContext(t, 20*time.Second)
	srv := startTestServer(t, "--heartbeat-timeout", "1s")
	c := dial(t, srv.addr)
	reg, err := c.Register(ctx, instance(heartbeatSvc, "kept", 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	if reg.live.heartbeat != time.Second/3 {
		t.Errorf("heartbeat every %s, want a third of the 1s timeout", reg.live.heartbeat)
	}
	lease := reg.LeaseID()

	silent, err := c.registry.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	announce := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Announce{Announce: &rotapb.Announce{
		Instances: []*rotapb.Instance{{Service: heartbeatSvc, Id: "silent", Host: "127.0.0.1", Port: 9002}},
	}}}
	if err := silent.Send(announce); err != nil {
		t.Fatal(err)
	}
	if resp, err := silent.Recv(); err != nil || resp.GetAck() == nil {
		t.Fatalf("silent stream: %v, %v; want an ack", resp, err)
	}
	start := time.Now()
	resp, err := silent.Recv() // bounded by ctx
	if err != nil || resp.GetClosing() == nil {
		t.Fatalf("silent stream: %v, %v; want Closing", resp, err)
	}
	if _, err := silent.Recv(); err != io.EOF {
		t.Errorf("after Closing: %v, want the end of the stream", err)
	}
	// The silent stream waited out a full timeout; the client's stream lived through it.
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("Closing after %s, before the timeout", waited)
	}
	instances, err := c.Instances(ctx, heartbeatSvc)
	if err != nil || len(instances) != 1 || instances[0].ID != "kept" {
		t.Errorf("instances %+v, %v; want only kept", instances, err)
	}
	if reg.LeaseID() != lease {
		t.Errorf("lease changed from %d to %d: the registration expired and reconnected", lease, reg.LeaseID())
	}
}

// TestRegistrationSurvivesAConnectionLoss cuts the provider's connection through a proxy:
// the client reconnects and announces its instances again.
func TestRegistrationSurvivesAConnectionLoss(t *testing.T) {
	reconnectSvc := uniqueService("go-reconnect")
	ctx := testContext(t, 20*time.Second)
	proxy := startProxy(t, rotaAddr)
	var logs logBuffer
	provider := dial(t, proxy.addr(), WithLogger(logs.logger()))
	consumer := dial(t, rotaAddr)
	reg, err := provider.Register(ctx, instance(reconnectSvc, "a", 9001), instance(reconnectSvc, "b", 9002))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	lease := reg.LeaseID()

	proxy.cut()
	eventually(t, 10*time.Second, "a new lease", func() bool { return reg.LeaseID() != lease })
	if got, want := pickIDs(t, consumer, 3, reconnectSvc), []string{"a", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("after the reconnection picked %q, want %q", got, want)
	}
	if logs.count("rota registration lost; reconnecting") < 1 || logs.count("rota registration restored") != 1 {
		t.Errorf("log:\n%s\nwant one loss and one restoration", logs.String())
	}
	if err := reg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	instances, err := consumer.Instances(ctx, reconnectSvc)
	if err != nil || len(instances) != 0 {
		t.Errorf("after Close: %+v, %v; want no instance", instances, err)
	}
}

// proxy forwards loopback TCP connections to a target, and can cut them all.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// cut closes every connection made so far.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func TestClosedClientRefusesWork(t *testing.T) {
	closedSvc := uniqueService("go-closed")
	ctx := testContext(t, 10*time.Second)
	c := dial(t, rotaAddr)
	reg, err := c.Register(ctx, instance(closedSvc, "a", 9001))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close ended the registration's stream; closing the registration afterwards is a no-op.
	if err := reg.Close(ctx); err != nil {
		t.Errorf("Registration.Close after Client.Close: %v, want nil", err)
	}
	if _, err := c.Register(ctx, instance(closedSvc, "b", 9002)); status.Code(err) != codes.Canceled {
		t.Errorf("Register after Close: %v, want CANCELED", err)
	}
	if err := c.Follow(ctx, closedSvc); status.Code(err) != codes.Canceled {
		t.Errorf("Follow after Close: %v, want CANCELED", err)
	}
	// The server drops the stream's instances when it sees the connection go.
	other := dial(t, rotaAddr)
	eventually(t, 5*time.Second, "the closed client's instance to leave", func() bool {
		instances, err := other.Instances(ctx, closedSvc)
		return err == nil && len(instances) == 0
	})
}
