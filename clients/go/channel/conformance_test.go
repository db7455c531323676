package channel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/internal/rotaproc"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// scenario is one file of clients/conformance/channel (format in its README.md).
type scenario struct {
	Name      string `json:"name"`
	Rule      string `json:"rule"`
	Service   string `json:"service"`
	Instances []struct {
		ID      string  `json:"id"`
		Version string  `json:"version"`
		Weight  *uint32 `json:"weight"`
		// Unreachable: registered at a loopback port where nothing listens, with no server.
		Unreachable bool `json:"unreachable"`
	} `json:"instances"`
	// Policy is a rota.v1.Policy in proto JSON, without service, set before the channel opens.
	Policy json.RawMessage `json:"policy"`
	Steps  []step          `json:"steps"`
}

type step struct {
	Calls       int         `json:"calls"`
	Consumers   int         `json:"consumers"`
	Version     string      `json:"version"`
	DeadlineMS  int         `json:"deadline_ms"`
	Expect      *expectInfo `json:"expect"`
	Withdraw    string      `json:"withdraw"`
	WithinMS    int         `json:"within_ms"`
	Kill        string      `json:"kill"`
	Hang        string      `json:"hang"`
	StopRota    bool        `json:"stop_rota"`
	RestartRota bool        `json:"restart_rota"`
	AwaitLeases bool        `json:"await_leases"`
	// Draw: tickets the runner leases out of band, with rota's own stub, before later steps.
	Draw int `json:"draw"`
}

type expectInfo struct {
	Failures      *int     `json:"failures"`
	ErrorContains string   `json:"error_contains"`
	Leased        *bool    `json:"leased"`
	Rotation      []string `json:"rotation"`
	Runs          uint64   `json:"runs"`
	Only          []string `json:"only"`
	Never         []string `json:"never"`
	Spread        bool     `json:"spread"`
	// Counts: exactly this many calls reached each id, and none reached another.
	Counts map[string]int `json:"counts"`
	// Balanced: every id in Only answered, and the counts differ by at most max(2, N/10).
	Balanced bool `json:"balanced"`
	// Reported: rota's admin API shows, for every instance, as many calls as its echo server
	// answered since the scenario started, and no error (checked after the other keys).
	Reported bool `json:"reported"`
}

const scenarioDir = "../../conformance/channel"

func TestChannelScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(scenarioDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s: %v", scenarioDir, err)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := decodeScenario(raw)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		t.Run(strings.TrimSuffix(filepath.Base(file), ".json"), func(t *testing.T) { runScenario(t, sc) })
	}
}

// decodeScenario reads a scenario file, refusing unknown keys anywhere (the policy's too).
func decodeScenario(raw []byte) (scenario, error) {
	var sc scenario
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return sc, err
	}
	if sc.Policy != nil {
		if err := protojson.Unmarshal(sc.Policy, &rotapb.Policy{}); err != nil {
			return sc, fmt.Errorf("policy: %w", err)
		}
	}
	return sc, nil
}

// run is one scenario's world: rota, the echo instances, their registrations, consumer 1.
type run struct {
	t       *testing.T
	sc      scenario
	rota    *rotaServer
	client  *rota.Client
	servers map[string]*echo.Server
	regs    map[string]*rota.Registration
	log     *echo.Log
	conn    *grpc.ClientConn
	target  string
	service string
	// drawn: the tickets drawn out of band (draw steps) so far in this scenario.
	drawn uint64
}

func runScenario(t *testing.T, sc scenario) {
	r := &run{t: t, sc: sc, servers: map[string]*echo.Server{}, regs: map[string]*rota.Registration{}, log: &echo.Log{}}
	r.rota = startAdminRota(t)
	r.client = dialRota(t, r.rota.addr)
	ctx := testContext(t, 2*time.Minute)
	for _, inst := range sc.Instances {
		var port int
		if inst.Unreachable {
			port = closedPort(t)
		} else {
			srv, err := echo.Start(inst.ID, r.log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Kill)
			r.servers[inst.ID] = srv
			port = srv.Addr.Port
		}
		instance := rota.Instance{ID: inst.ID, Service: "echo", Host: "127.0.0.1", Port: uint32(port), Version: inst.Version}
		if inst.Weight != nil {
			instance.Weight, instance.ZeroWeight = *inst.Weight, *inst.Weight == 0
		}
		reg, err := r.client.Register(ctx, instance)
		if err != nil {
			t.Fatal(err)
		}
		r.regs[inst.ID] = reg
	}
	service := sc.Service
	if service == "" {
		service = "echo"
	}
	if sc.Policy != nil {
		var policy rotapb.Policy
		if err := protojson.Unmarshal(sc.Policy, &policy); err != nil {
			t.Fatalf("policy: %v", err)
		}
		if policy.GetService() != "" {
			t.Fatalf("policy names service %q; a scenario's policy is for its own service", policy.GetService())
		}
		policy.Service = service
		if _, err := rotapb.NewPoliciesClient(r.client.Conn()).SetPolicy(ctx, &rotapb.SetPolicyRequest{Policy: &policy}); err != nil {
			t.Fatalf("setting the policy of %s: %v", service, err)
		}
	}
	r.service = service
	r.target = "rota:///" + service
	conn, err := grpc.NewClient(r.target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(NewResolver(WithServer(r.rota.addr), WithRule(sc.Rule), WithLogger(quietLogger()), WithTicketHeader(true),
			WithBackoff(rota.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond, Factor: 2}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r.conn = conn
	for i, s := range sc.Steps {
		r.step(ctx, i, s)
		if t.Failed() {
			return
		}
	}
}

func (r *run) step(ctx context.Context, i int, s step) {
	t := r.t
	switch {
	case s.Calls > 0:
		r.calls(ctx, i, s)
	case s.Withdraw != "":
		reg := r.regs[s.Withdraw]
		if reg == nil {
			t.Fatalf("step %d: no instance %q", i, s.Withdraw)
		}
		if err := reg.Close(ctx); err != nil {
			t.Fatalf("step %d: withdrawing %s: %v", i, s.Withdraw, err)
		}
		delete(r.regs, s.Withdraw)
		withdrawn := time.Now()
		bound := time.Duration(s.WithinMS) * time.Millisecond
		var late []string
		after := 0
		for time.Since(withdrawn) <= bound || after < 20 {
			started := time.Now()
			results := echo.Calls(ctx, r.conn, 1, "", 5*time.Second)
			if results[0].Err != nil {
				t.Fatalf("step %d: call failed after the withdrawal: %v", i, results[0].Err)
			}
			if started.Sub(withdrawn) > bound {
				after++
				if results[0].Instance == s.Withdraw {
					late = append(late, started.Sub(withdrawn).String())
				}
			}
		}
		if len(late) > 0 {
			t.Fatalf("step %d: %s still received calls started %v after its withdrawal", i, s.Withdraw, late)
		}
	case s.Kill != "":
		srv := r.servers[s.Kill]
		if srv == nil {
			t.Fatalf("step %d: no server for %q", i, s.Kill)
		}
		srv.Kill()
		// Settled once as many calls in a row succeed as there are instances: such a run
		// spans a pick of the killed one, which the channel can only have passed over.
		want, succeeded := len(r.sc.Instances), 0
		for n := 0; n < 10*want && succeeded < want; n++ {
			if echo.Calls(ctx, r.conn, 1, "", 5*time.Second)[0].Err == nil {
				succeeded++
			} else {
				succeeded = 0
			}
		}
		if succeeded < want {
			t.Fatalf("step %d: %d calls in a row did not succeed after %s was killed", i, want, s.Kill)
		}
	case s.Hang != "":
		srv := r.servers[s.Hang]
		if srv == nil {
			t.Fatalf("step %d: no server for %q", i, s.Hang)
		}
		srv.Hang()
	case s.StopRota:
		r.rota.stop()
	case s.RestartRota:
		r.rota = restartRota(t, r.rota)
		open := len(r.regs)
		waitFor(t, 20*time.Second, "every registration back in the restarted rota", func() bool {
			list, err := r.client.Instances(ctx, "echo")
			return err == nil && len(list) == open
		})
	case s.AwaitLeases:
		before := r.log.Len()
		waitFor(t, time.Duration(s.WithinMS)*time.Millisecond, "leased call", func() bool {
			echo.Calls(ctx, r.conn, 1, "", 5*time.Second)
			for _, c := range r.log.Calls()[before:] {
				if c.Ticket >= 0 {
					return true
				}
			}
			return false
		})
	case s.Draw > 0:
		if err := r.draw(ctx, s.Draw); err != nil {
			t.Fatalf("step %d: drawing %d tickets out of band: %v", i, s.Draw, err)
		}
	default:
		t.Fatalf("step %d: no action", i)
	}
}

// draw leases n tickets of the channel's service and rule, without a version, over a
// connection of its own with the generated Balancer stub: neither the client library nor the
// channel takes part. The channel's later tickets must come after them.
func (r *run) draw(ctx context.Context, n int) error {
	conn, err := grpc.NewClient(r.rota.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := rotapb.NewBalancerClient(conn).Lease(ctx, &rotapb.LeaseRequest{Service: r.service, Rule: r.sc.Rule, Count: uint32(n)})
	if err != nil {
		return err
	}
	if resp.GetCount() != uint32(n) || len(resp.GetPicks()) > 0 {
		return fmt.Errorf("rota leased %d tickets from %d (%d picks), want a range of %d", resp.GetCount(), resp.GetFirstTicket(), len(resp.GetPicks()), n)
	}
	r.drawn += uint64(n)
	return nil
}

// calls runs a calls step: consumer 1 here, the others as processes, at the same time.
func (r *run) calls(ctx context.Context, i int, s step) {
	t := r.t
	deadline := 5 * time.Second
	if s.DeadlineMS > 0 {
		deadline = time.Duration(s.DeadlineMS) * time.Millisecond
	}
	before := r.log.Len()
	var processes []*consumerProcess
	for c := 1; c < max(s.Consumers, 1); c++ {
		p, err := startConsumerProcess(ctx, consumerSpec{
			Target: "rota://" + r.rota.addr + "/" + strings.TrimPrefix(r.target, "rota:///"),
			Rule:   r.sc.Rule, Version: s.Version, Calls: s.Calls, DeadlineMS: int(deadline / time.Millisecond),
		})
		if err != nil {
			t.Fatal(err)
		}
		processes = append(processes, p)
	}
	var wg sync.WaitGroup
	var results []echo.Result
	wg.Add(1)
	go func() {
		defer wg.Done()
		results = echo.Calls(ctx, r.conn, s.Calls, s.Version, deadline)
	}()
	wg.Wait()
	for _, p := range processes {
		more, err := p.wait()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(more) != s.Calls {
			t.Fatalf("step %d: a consumer process made %d calls, want %d", i, len(more), s.Calls)
		}
		results = append(results, more...)
	}
	calls := r.log.Calls()[before:]
	weights := map[string]uint64{}
	for _, inst := range r.sc.Instances {
		if inst.Weight != nil {
			weights[inst.ID] = uint64(*inst.Weight)
		}
	}
	answered, failed := map[string]int{}, 0
	for _, res := range results {
		if res.Err != nil {
			failed++
		} else {
			answered[res.Instance]++
		}
	}
	t.Logf("step %d: %d calls, %d failed, answered %v", i, len(results), failed, answered)
	if err := checkExpect(r.sc.Rule, s.Expect, weights, r.drawn, results, calls); err != nil {
		t.Fatalf("step %d (%d calls by %d consumers): %v", i, s.Calls, max(s.Consumers, 1), err)
	}
	if s.Expect != nil && s.Expect.Reported {
		reported, err := r.checkReported(ctx)
		if err != nil {
			t.Fatalf("step %d (%d calls by %d consumers): reported: %v", i, s.Calls, max(s.Consumers, 1), err)
		}
		t.Logf("step %d: rota reports calls %v, no error", i, reported)
	}
}

// startAdminRota runs the scenario's `rota serve` on a free loopback port with its admin
// listener on a free loopback port too (for reported), stopped when the test ends.
func startAdminRota(t *testing.T) *rotaServer {
	t.Helper()
	proc, err := rotaproc.StartWith(rotaproc.Binary(filepath.Join("..", "..", "..")), "127.0.0.1:0", rotaproc.Options{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Stop)
	return &rotaServer{addr: proc.Addr, proc: proc}
}

// Bounds of reported's poll of rota's admin API.
const (
	reportedWithin = 10 * time.Second
	reportedEvery  = 75 * time.Millisecond
)

// reportedCounts is one instance in rota's admin view of a service.
type reportedCounts struct {
	ID     string `json:"id"`
	Calls  uint64 `json:"calls"`
	Errors uint64 `json:"errors"`
}

// checkReported polls rota's admin API (GET /api/services/echo) until every instance of the
// scenario shows as many calls as its echo server answered since the scenario started, and no
// error, and returns those counts; after reportedWithin it fails with both numbers per id.
func (r *run) checkReported(ctx context.Context) (map[string]uint64, error) {
	admin := r.rota.proc.Admin
	if admin == "" {
		return nil, fmt.Errorf("rota's admin listener is off")
	}
	want := map[string]uint64{}
	for _, inst := range r.sc.Instances {
		want[inst.ID] = 0
	}
	for _, c := range r.log.Calls() {
		want[c.Instance]++
	}
	client := &http.Client{Timeout: 2 * time.Second}
	url := "http://" + admin + "/api/services/echo"
	fetch := func() (map[string]reportedCounts, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
		}
		var view struct {
			Instances []reportedCounts `json:"instances"`
		}
		if err := json.Unmarshal(body, &view); err != nil {
			return nil, fmt.Errorf("GET %s: %w", url, err)
		}
		got := map[string]reportedCounts{}
		for _, inst := range view.Instances {
			got[inst.ID] = inst
		}
		return got, nil
	}
	matches := func(got map[string]reportedCounts) bool {
		for id, calls := range want {
			inst, ok := got[id]
			if !ok || inst.Calls != calls || inst.Errors != 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(reportedWithin)
	tick := time.NewTicker(reportedEvery)
	defer tick.Stop()
	for {
		got, err := fetch()
		if err == nil && matches(got) {
			return want, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("after %s: %w", reportedWithin, err)
			}
			ids := make([]string, 0, len(want))
			for id := range want {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			var lines []string
			for _, id := range ids {
				inst, ok := got[id]
				if !ok {
					lines = append(lines, fmt.Sprintf("%s: not in rota's view, its echo server answered %d calls", id, want[id]))
					continue
				}
				lines = append(lines, fmt.Sprintf("%s: rota counts %d calls and %d errors, its echo server answered %d calls (errors want 0)", id, inst.Calls, inst.Errors, want[id]))
			}
			return nil, fmt.Errorf("rota's admin API did not match within %s: %s", reportedWithin, strings.Join(lines, "; "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// checkExpect checks a calls step's expectations against what the consumers saw (results)
// and what the instances answered (calls); drawn is the number of tickets drawn out of band
// before the step.
func checkExpect(ruleName string, e *expectInfo, weights map[string]uint64, drawn uint64, results []echo.Result, calls []echo.Call) error {
	if e == nil {
		return nil
	}
	failures := 0
	var reached []string
	for _, r := range results {
		if r.Err != nil {
			failures++
			if e.ErrorContains != "" && !strings.Contains(status.Convert(r.Err).Message(), e.ErrorContains) {
				return fmt.Errorf("a call failed with %v, which does not mention %q", r.Err, e.ErrorContains)
			}
			continue
		}
		reached = append(reached, r.Instance)
	}
	if e.Failures != nil && failures != *e.Failures {
		// Each distinct error once, with how many calls it failed.
		counts := map[string]int{}
		var msgs []string
		for _, r := range results {
			if r.Err != nil {
				if counts[r.Err.Error()]++; counts[r.Err.Error()] == 1 {
					msgs = append(msgs, r.Err.Error())
				}
			}
		}
		for i, m := range msgs {
			msgs[i] = fmt.Sprintf("%d× %s", counts[m], m)
		}
		return fmt.Errorf("%d calls failed, want %d: %s", failures, *e.Failures, strings.Join(msgs, "; "))
	}
	if len(calls) != len(reached) {
		return fmt.Errorf("the instances answered %d calls, the consumers saw %d answers", len(calls), len(reached))
	}
	in := func(id string, ids []string) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
	for _, id := range reached {
		if len(e.Only) > 0 && !in(id, e.Only) {
			return fmt.Errorf("a call reached %s, outside %v", id, e.Only)
		}
		if in(id, e.Never) {
			return fmt.Errorf("a call reached %s", id)
		}
	}
	if e.Counts != nil {
		got := map[string]int{}
		for _, id := range reached {
			got[id]++
		}
		for id, n := range got {
			if _, listed := e.Counts[id]; !listed {
				return fmt.Errorf("%d calls reached %s, which counts does not list: %v", n, id, got)
			}
		}
		for id, want := range e.Counts {
			if got[id] != want {
				return fmt.Errorf("%d calls reached %s, want %d: %v", got[id], id, want, got)
			}
		}
	}
	if e.Spread {
		for _, id := range e.Only {
			if !in(id, reached) {
				return fmt.Errorf("%s answered no call: %v", id, reached)
			}
		}
	}
	if e.Leased != nil {
		for _, c := range calls {
			if (c.Ticket >= 0) != *e.Leased {
				return fmt.Errorf("call to %s has ticket %d, want leased=%v", c.Instance, c.Ticket, *e.Leased)
			}
		}
	}
	if len(e.Rotation) > 0 {
		if err := checkRotation(ruleName, e.Rotation, weights, drawn, calls); err != nil {
			return err
		}
	}
	if e.Runs > 0 {
		groups := map[uint64]map[string]bool{}
		sizes := map[uint64]uint64{}
		for _, c := range calls {
			g := uint64(c.Ticket) / e.Runs
			if groups[g] == nil {
				groups[g] = map[string]bool{}
			}
			groups[g][c.Instance] = true
			sizes[g]++
		}
		complete := 0
		for g, members := range groups {
			if sizes[g] == e.Runs {
				complete++
				if len(members) != 1 {
					return fmt.Errorf("tickets %d..%d reached %v", g*e.Runs, g*e.Runs+e.Runs-1, members)
				}
			}
		}
		if complete == 0 {
			return fmt.Errorf("no complete run of %d tickets among %d calls", e.Runs, len(calls))
		}
	}
	if e.Balanced {
		if err := checkBalanced(e.Only, reached); err != nil {
			return err
		}
	}
	return nil
}

// checkBalanced: every id of only answered, and the most calls one answered exceed the fewest
// by at most max(2, N/10), N the answered calls.
func checkBalanced(only, reached []string) error {
	if len(only) == 0 {
		return fmt.Errorf("balanced needs only")
	}
	got := map[string]int{}
	for _, id := range reached {
		got[id]++
	}
	most, fewest := 0, len(reached)
	for _, id := range only {
		if got[id] == 0 {
			return fmt.Errorf("%s answered no call: %v", id, got)
		}
		most, fewest = max(most, got[id]), min(fewest, got[id])
	}
	if bound := max(2, len(reached)/10); most-fewest > bound {
		return fmt.Errorf("calls per instance %v differ by %d, more than %d", got, most-fewest, bound)
	}
	return nil
}

// closedPort is a loopback port where nothing listens: one bound, noted and closed again.
func closedPort(t *testing.T) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// checkRotation: every call has a distinct ticket, none of the tickets drawn out of band before
// the step (0..drawn-1), and reached the instance the rule maps its ticket to.
func checkRotation(ruleName string, ids []string, weightOf map[string]uint64, drawn uint64, calls []echo.Call) error {
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	canonical := ruleName
	if canonical == "repeat" {
		canonical = "repeat(n=3)"
	}
	weights := make([]uint64, len(sorted))
	for i, id := range sorted {
		weights[i] = 100
		if w, ok := weightOf[id]; ok {
			weights[i] = w
		}
	}
	rule, err := ruleOracle(canonical, weights)
	if err != nil {
		return err
	}
	seen := map[int64]string{}
	for _, c := range calls {
		if c.Ticket < 0 {
			return fmt.Errorf("a call to %s carried no ticket", c.Instance)
		}
		if uint64(c.Ticket) < drawn {
			return fmt.Errorf("a call to %s carried ticket %d, one of the %d tickets drawn out of band before the step", c.Instance, c.Ticket, drawn)
		}
		if other, dup := seen[c.Ticket]; dup {
			return fmt.Errorf("ticket %d was used twice (%s and %s): the consumers do not share one rotation", c.Ticket, other, c.Instance)
		}
		seen[c.Ticket] = c.Instance
		if p := rule(uint64(c.Ticket)); sorted[p] != c.Instance {
			return fmt.Errorf("ticket %d reached %s; %s maps it to %s", c.Ticket, c.Instance, canonical, sorted[rule(uint64(c.Ticket))])
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("no call to check")
	}
	return nil
}

// ruleOracle is the specification the rotation expectation checks rota against (docs/rules.md),
// not the channel's code (the channel indexes rota's positions): the position, in a list with
// these weights ordered by id, of ticket t under the canonical rule. round_robin: t mod n;
// repeat(n=N): ⌊t / N⌋ mod n; weighted: slot t mod Σw of the earliest-deadline-first schedule of
// the weights reduced by their gcd (instance i's k-th slot due at (2k+1)/2wᵢ, ties to the lower
// position). Weighted cycles past 2²⁰ slots, which rota scales down, are not needed here.
func ruleOracle(canonical string, weights []uint64) (func(ticket uint64) int, error) {
	n := uint64(len(weights))
	if n == 0 {
		return nil, fmt.Errorf("no instance to map %s over", canonical)
	}
	switch {
	case canonical == "round_robin":
		return func(t uint64) int { return int(t % n) }, nil
	case strings.HasPrefix(canonical, "repeat(n=") && strings.HasSuffix(canonical, ")"):
		var run uint64
		if _, err := fmt.Sscanf(canonical, "repeat(n=%d)", &run); err != nil || run == 0 {
			return nil, fmt.Errorf("rule %q", canonical)
		}
		return func(t uint64) int { return int(t / run % n) }, nil
	case canonical == "weighted":
		slots := weightedSchedule(weights)
		if len(slots) == 0 {
			return nil, fmt.Errorf("no weighted oracle for weights %v (none, or past 2^20 slots)", weights)
		}
		return func(t uint64) int { return slots[t%uint64(len(slots))] }, nil
	}
	return nil, fmt.Errorf("no oracle for rule %q", canonical)
}

// weightedSchedule is one cycle of the weighted rule's slots (see ruleOracle).
func weightedSchedule(weights []uint64) []int {
	var divisor uint64
	for _, w := range weights {
		a, b := divisor, w
		for b != 0 {
			a, b = b, a%b
		}
		divisor = a
	}
	if divisor == 0 {
		return nil
	}
	reduced := make([]uint64, len(weights))
	var total uint64
	for i, w := range weights {
		reduced[i] = w / divisor
		total += reduced[i]
	}
	if total > 1<<20 {
		return nil
	}
	taken := make([]uint64, len(weights)) // slots given to each instance so far
	slots := make([]int, 0, total)
	for uint64(len(slots)) < total {
		best := -1
		for i, w := range reduced {
			if taken[i] == w {
				continue
			}
			// Due at (2k+1)/2w: earlier when (2k+1)·w_best < (2k_best+1)·w; ties to the lower i.
			if best < 0 || (2*taken[i]+1)*reduced[best] < (2*taken[best]+1)*w {
				best = i
			}
		}
		slots = append(slots, best)
		taken[best]++
	}
	return slots
}

// oraclePositions are the positions rota answers for tickets first .. first+count-1 of a lease
// over a list with these weights, by ruleOracle: what the scripted leases of the unit tests
// answer.
func oraclePositions(t *testing.T, canonical string, weights []uint64, first uint64, count uint32) []uint32 {
	t.Helper()
	rule, err := ruleOracle(canonical, weights)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, count)
	for i := range out {
		out[i] = uint32(rule(first + uint64(i)))
	}
	return out
}
