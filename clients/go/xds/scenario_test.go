package xds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/internal/rotaproc"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

const scenarioDir = "../../conformance/xds"

// skip names the scenarios not run, each with the reason in one line. A scenario that fails
// because of rota's xDS server (not of this runner) is listed here until the server is fixed.
var skip = map[string]string{}

// scenario is one file of clients/conformance/xds (format in its README.md and in
// ../channel/README.md). Keys the xDS scenarios do not use (rule, leased, runs, kill, hang,
// await_leases) are refused as unknown, and rotation outside a rota_policy scenario.
type scenario struct {
	Name    string `json:"name"`
	Service string `json:"service"`
	// RotaPolicy: each consumer process registers rota's own policy (channel.RegisterXDSPolicy,
	// gRFC A52) with this scenario's rota and the x-rota-ticket header on.
	RotaPolicy bool `json:"rota_policy"`
	Instances  []struct {
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
	Calls     int    `json:"calls"`
	Consumers int    `json:"consumers"`
	Version   string `json:"version"`
	// Keys: call i of each consumer (from 0, within the step) sends x-rota-key: key-(i mod Keys).
	Keys        int     `json:"keys"`
	DeadlineMS  int     `json:"deadline_ms"`
	Expect      *expect `json:"expect"`
	Withdraw    string  `json:"withdraw"`
	Drain       string  `json:"drain"`
	Trip        string  `json:"trip"`
	WithinMS    int     `json:"within_ms"`
	StopRota    bool    `json:"stop_rota"`
	RestartRota bool    `json:"restart_rota"`
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
	for i, s := range sc.Steps {
		actions := 0
		for _, set := range []bool{s.Calls > 0, s.Withdraw != "", s.Drain != "", s.Trip != "", s.StopRota, s.RestartRota} {
			if set {
				actions++
			}
		}
		if actions != 1 {
			return sc, fmt.Errorf("step %d has %d actions, want one", i, actions)
		}
		if s.Expect != nil && len(s.Expect.Rotation) > 0 && !sc.RotaPolicy {
			return sc, fmt.Errorf("step %d expects a rotation, which only a rota_policy scenario's calls carry tickets of", i)
		}
		if s.Keys < 0 || (s.Keys > 0 && s.Calls == 0) {
			return sc, fmt.Errorf("step %d: keys %d, which only a calls step takes, as a positive count", i, s.Keys)
		}
		if s.Expect != nil && s.Expect.Keyed && s.Keys == 0 {
			return sc, fmt.Errorf("step %d expects keyed calls and sends no keys", i)
		}
	}
	return sc, nil
}

func TestXDSScenarios(t *testing.T) {
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
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			if reason, ok := skip[name]; ok {
				t.Skip(reason)
			}
			runScenario(t, sc)
		})
	}
}

// run is one scenario's world: rota, the echo instances, their registrations, consumer 1.
type run struct {
	t         *testing.T
	sc        scenario
	service   string
	rota      *rotaproc.Server
	client    *rota.Client
	servers   map[string]*echo.Server
	regs      map[string]*rota.Registration
	refs      map[string]rota.InstanceRef
	log       *echo.Log
	bootstrap string
	consumer  *consumer
	// rule is the service's rule (its policy's, else round_robin), which rotation checks
	// tickets with.
	rule string
}

// scenarioTimeout bounds one scenario, its rota restarts and waits included.
const scenarioTimeout = 90 * time.Second

// restartWarmup is the warm-up of a restarted rota (clients/conformance/xds/README.md: at
// least 10 s).
const restartWarmup = 10 * time.Second

func runScenario(t *testing.T, sc scenario) {
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	t.Cleanup(cancel)
	r := startWorld(ctx, t, sc)
	r.consumer = r.startConsumer()
	for i, s := range sc.Steps {
		r.step(ctx, i, s)
		if t.Failed() {
			return
		}
	}
}

// startWorld starts a scenario's world but its consumers: rota, a client of it, the echo
// instances and their registrations, the policy, and the bootstrap naming that rota. All of it
// ends with the test.
func startWorld(ctx context.Context, t *testing.T, sc scenario) *run {
	t.Helper()
	r := &run{t: t, sc: sc, service: sc.Service, servers: map[string]*echo.Server{}, regs: map[string]*rota.Registration{},
		refs: map[string]rota.InstanceRef{}, log: &echo.Log{}, rule: "round_robin"}
	if r.service == "" {
		r.service = "echo"
	}
	r.startRota("127.0.0.1:0", 0)
	client, err := rota.Dial(ctx, r.rota.Addr, rota.WithLogger(quietLogger()),
		rota.WithBackoff(rota.Backoff{Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Factor: 2}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	r.client = client
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
		// Each instance is registered in the scenario's service (echo unless it names another).
		instance := rota.Instance{ID: inst.ID, Service: "echo", Host: "127.0.0.1", Port: uint32(port), Version: inst.Version}
		if inst.Weight != nil {
			instance.Weight, instance.ZeroWeight = *inst.Weight, *inst.Weight == 0
		}
		reg, err := r.client.Register(ctx, instance)
		if err != nil {
			t.Fatal(err)
		}
		r.regs[inst.ID], r.refs[inst.ID] = reg, instance.Ref()
	}
	if sc.Policy != nil {
		var policy rotapb.Policy
		if err := protojson.Unmarshal(sc.Policy, &policy); err != nil {
			t.Fatalf("policy: %v", err)
		}
		if policy.GetService() != "" {
			t.Fatalf("policy names service %q; a scenario's policy is for its own service", policy.GetService())
		}
		policy.Service = r.service
		if policy.GetRule() != "" {
			r.rule = policy.GetRule()
		}
		if _, err := rotapb.NewPoliciesClient(r.client.Conn()).SetPolicy(ctx, &rotapb.SetPolicyRequest{Policy: &policy}); err != nil {
			t.Fatalf("setting the policy of %s: %v", r.service, err)
		}
	}
	r.bootstrap = writeBootstrap(t, r.rota.Addr)
	return r
}

// startRota starts rota on listen with its warm-up (0 for none), stopped when the test ends;
// a failed test logs its tail.
func (r *run) startRota(listen string, warmup time.Duration) {
	t := r.t
	t.Helper()
	srv, err := rotaproc.StartWithWarmup(rotaproc.Binary(filepath.Join("..", "..", "..")), listen, warmup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("rota %s log (tail):\n%s", srv.Addr, strings.TrimSpace(srv.Log()))
		}
	})
	r.rota = srv
}

// startConsumer starts a consumer process of xds:///SERVICE, closed when the test ends; a
// failed test logs what grpc-go wrote in it.
func (r *run) startConsumer() *consumer {
	r.t.Helper()
	return r.startConsumerOf("xds:///" + r.service)
}

// startConsumerOf starts a consumer process of target (xds:///SERVICE, or static:///ADDRS for
// a channel without xDS), closed when the test ends; a failed test logs what grpc-go wrote in
// it.
func (r *run) startConsumerOf(target string) *consumer {
	t := r.t
	t.Helper()
	policyServer := ""
	if r.sc.RotaPolicy {
		policyServer = r.rota.Addr
	}
	c, err := startConsumer(target, r.bootstrap, policyServer, logFile(t))
	if err != nil {
		t.Fatalf("starting a consumer process: %v", err)
	}
	t.Cleanup(func() {
		err := c.close()
		if err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("consumer process log (tail):\n%s", c.log())
		}
	})
	return c
}

// logFile is where a consumer process's log goes in full, besides its tail: a file in
// $ROTA_XDS_LOG_DIR when that is set (to read grpc-go's logs of a passing run too), else none.
func logFile(t *testing.T) string {
	dir := os.Getenv("ROTA_XDS_LOG_DIR")
	if dir == "" {
		return ""
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
}

// writeBootstrap writes the xDS bootstrap naming the rota at addr as the only xDS server.
func writeBootstrap(t *testing.T, addr string) string {
	t.Helper()
	bootstrap := map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": "conformance-go", "locality": map[string]any{}},
	}
	raw, err := json.Marshal(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (r *run) step(ctx context.Context, i int, s step) {
	t := r.t
	switch {
	case s.Calls > 0:
		r.calls(ctx, i, s)
	case s.Withdraw != "":
		reg := r.regs[s.Withdraw]
		if reg == nil {
			t.Fatalf("step %d: no open registration of %q", i, s.Withdraw)
		}
		if err := reg.Close(ctx); err != nil {
			t.Fatalf("step %d: withdrawing %s: %v", i, s.Withdraw, err)
		}
		delete(r.regs, s.Withdraw)
		r.noCallsAfter(ctx, i, s, s.Withdraw, "its withdrawal", time.Now())
	case s.Drain != "":
		reg := r.regs[s.Drain]
		if reg == nil {
			t.Fatalf("step %d: no open registration of %q", i, s.Drain)
		}
		if err := reg.Update(ctx, r.refs[s.Drain], rota.SetStatus(rota.StatusDraining)); err != nil {
			t.Fatalf("step %d: draining %s: %v", i, s.Drain, err)
		}
		r.noCallsAfter(ctx, i, s, s.Drain, "the acknowledgement of its DRAINING", time.Now())
	case s.Trip != "":
		r.trip(ctx, i, s)
	case s.StopRota:
		r.rota.Stop()
	case s.RestartRota:
		// With its warm-up on, as the README asks: the restarted rota withholds the service
		// until the providers are back, rather than telling the clients it has no listener.
		r.startRota(r.rota.Addr, restartWarmup)
		open := len(r.regs)
		err := waitFor(ctx, 20*time.Second, func() bool {
			list, err := r.client.Instances(ctx, "echo")
			return err == nil && len(list) == open
		})
		if err != nil {
			t.Fatalf("step %d: the %d open registrations not back in the restarted rota: %v", i, open, err)
		}
	default:
		t.Fatalf("step %d: no action", i)
	}
}

// trip reports as many failed calls of the instance as its service's breaker threshold.
func (r *run) trip(ctx context.Context, i int, s step) {
	t := r.t
	policy, err := rotapb.NewPoliciesClient(r.client.Conn()).GetPolicy(ctx, &rotapb.GetPolicyRequest{Service: r.service})
	if err != nil {
		t.Fatalf("step %d: the policy of %s: %v", i, r.service, err)
	}
	threshold := policy.GetBreaker().GetFailureThreshold()
	if threshold == 0 {
		threshold = 3
	}
	req := &rotapb.ReportRequest{}
	for n := uint32(0); n < threshold; n++ {
		req.Outcomes = append(req.Outcomes, &rotapb.CallOutcome{Service: r.service, InstanceId: s.Trip,
			LatencyUs: 1000, Result: rotapb.CallResult_CALL_RESULT_ERROR, Leased: true})
	}
	resp, err := rotapb.NewBalancerClient(r.client.Conn()).Report(ctx, req)
	if err != nil {
		t.Fatalf("step %d: reporting %d failed calls of %s: %v", i, threshold, s.Trip, err)
	}
	if resp.GetAccepted() != threshold {
		t.Fatalf("step %d: rota accepted %d of the %d failed calls of %s reported (%d ignored)", i, resp.GetAccepted(), threshold, s.Trip, resp.GetIgnored())
	}
	r.noCallsAfter(ctx, i, s, s.Trip, fmt.Sprintf("the report of %d failed calls", threshold), time.Now())
}

// noCallsAfter calls through consumer 1 (with the step's version) until the step's within_ms
// have passed since at and at least 20 more calls were made: no call that started later than
// that may reach id, and none may fail.
func (r *run) noCallsAfter(ctx context.Context, i int, s step, id, what string, at time.Time) {
	t := r.t
	bound := time.Duration(s.WithinMS) * time.Millisecond
	var late []string
	made, after := 0, 0
	for time.Since(at) <= bound || after < 20 {
		results, err := r.consumer.calls(ctx, 1, s.Version, 0, 5*time.Second)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		res := results[0]
		made++
		if res.err != nil {
			t.Fatalf("step %d: call %d after %s (%v later) failed: %v", i, made, what, res.start.Sub(at), res.err)
		}
		if res.start.Sub(at) > bound {
			after++
			if res.instance == id {
				late = append(late, res.start.Sub(at).Round(time.Millisecond).String())
			}
		}
	}
	t.Logf("step %d: %d calls after %s of %s, %d of them later than %v", i, made, what, id, after, bound)
	if len(late) > 0 {
		t.Fatalf("step %d: %s still received calls started %v after %s (bound %v)", i, id, late, what, bound)
	}
}

// calls runs a calls step: consumer 1 and, for consumers > 1, more consumer processes of
// their own, at the same time.
func (r *run) calls(ctx context.Context, i int, s step) {
	t := r.t
	deadline := 5 * time.Second
	if s.DeadlineMS > 0 {
		deadline = time.Duration(s.DeadlineMS) * time.Millisecond
	}
	before := r.log.Len()
	consumers := []*consumer{r.consumer}
	for c := 1; c < max(s.Consumers, 1); c++ {
		consumers = append(consumers, r.startConsumer())
	}
	type answer struct {
		results []result
		err     error
	}
	answers := make([]chan answer, len(consumers))
	for n, c := range consumers {
		answers[n] = make(chan answer, 1)
		go func() {
			results, err := c.calls(ctx, s.Calls, s.Version, s.Keys, deadline)
			answers[n] <- answer{results, err}
		}()
	}
	var results []result
	var errs []error
	for _, a := range answers {
		got := <-a
		if got.err != nil {
			errs = append(errs, got.err)
		}
		results = append(results, got.results...)
	}
	for _, c := range consumers[1:] {
		if err := c.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		t.Fatalf("step %d: %v", i, errors.Join(errs...))
	}
	answered, failed := map[string]int{}, 0
	for _, res := range results {
		if res.err != nil {
			failed++
		} else {
			answered[res.instance]++
		}
	}
	t.Logf("step %d: %d calls, %d failed, answered %v", i, len(results), failed, answered)
	if err := checkExpect(s.Expect, r.rule, results, r.log.Calls()[before:]); err != nil {
		t.Fatalf("step %d (%d calls by %d consumers): %v", i, s.Calls, len(consumers), err)
	}
}

// waitFor polls cond every 10 ms until it holds, d passes or ctx ends.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
