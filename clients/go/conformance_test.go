package rota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// The shared conformance scenarios (../conformance/README.md), run through the client's own
// API as users call it: Register, Registration.Update and Close for providers, Pick,
// Report, Follow, Instances and Watch for consumers. Lease has no wrapper in this client
// (the channel package leases); its steps use the rotapb stubs on the client's connection. Scenarios that stop
// their server get a server of their own.

const scenarioDir = "../conformance/scenarios"

// patience bounds every wait of a step (a watch event, a followed list).
const patience = 10 * time.Second

func scenarioFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(scenarioDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") {
			files = append(files, e.Name())
		}
	}
	if len(files) < 14 {
		t.Fatalf("%d scenarios in %s, expected at least 14", len(files), scenarioDir)
	}
	return files
}

func TestConformance(t *testing.T) {
	for _, name := range scenarioFiles(t) {
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			sc, err := loadScenario(filepath.Join(scenarioDir, name))
			if err != nil {
				t.Fatal(err)
			}
			addr, srv := rotaAddr, (*server)(nil)
			if sc.stopsServer() {
				srv = startTestServer(t)
				addr = srv.addr
			}
			if err := newScenarioRun(t, sc, addr, srv).run(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConformanceEveryOpIsExercised fails when the scenarios lose an op (and with it the
// checks of that part of the contract).
func TestConformanceEveryOpIsExercised(t *testing.T) {
	ops := map[string]bool{}
	for _, name := range scenarioFiles(t) {
		sc, err := loadScenario(filepath.Join(scenarioDir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range sc.Steps {
			var st step
			if err := decodeStrict(raw, &st); err != nil {
				t.Fatal(err)
			}
			ops[st.Op] = true
		}
	}
	for _, op := range []string{"register", "withdraw", "pick", "pick_sequence", "list", "update", "report", "lease", "watch", "watch_expect", "follow", "stop_server", "start_server"} {
		if !ops[op] {
			t.Errorf("no scenario uses op %q", op)
		}
	}
}

// TestConformanceRunnerFails shows that the runner can fail: wrong tickets, a wrong local
// mark and a misspelt key each stop a scenario at their step.
func TestConformanceRunnerFails(t *testing.T) {
	svc := uniqueService("go-runner-check")
	cases := []struct{ name, steps, want string }{
		{"tickets", `{"op": "pick_sequence", "connections": [0], "count": 2, "request": {"service": "SVC"}, "expect_ids": ["a", "a"], "expect_tickets": [0, 2]}`,
			`step 1 (pick_sequence): tickets [0 1], want [0 2]`},
		{"local", `{"op": "pick", "request": {"service": "SVC"}, "expect": {"id": "a", "local": true}}`,
			`step 1 (pick): LocalFallback false, want true`},
		{"misspelt", `{"op": "pick", "request": {"service": "SVC"}, "expect": {"id": "a", "tiket": 0}}`,
			`unknown field "tiket"`},
		{"id", `{"op": "pick", "request": {"service": "SVC"}, "expect": {"id": "b"}}`,
			`step 1 (pick): picked "a", want "b"`},
		{"positions", `{"op": "lease", "request": {"service": "SVC", "count": 2}, "expect": {"first_ticket": 0, "count": 2, "ids": ["a"], "positions": [0, 1]}}`,
			`step 1 (lease): lease positions [0 0], want [0 1]`},
		{"exclude", `{"op": "lease", "request": {"service": "SVC", "count": 1, "exclude": ["a"]}, "expect": {"first_ticket": 0, "count": 1, "ids": ["a"]}}`,
			`step 1 (lease): rota`},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			service := fmt.Sprintf("%s-%d", svc, i)
			text := `{"name": "wrong on purpose", "steps": [
				{"op": "register", "stream": "p", "instances": [{"service": "SVC", "id": "a", "host": "127.0.0.1", "port": 9001}]},
				` + tc.steps + `]}`
			sc, err := parseScenario([]byte(strings.ReplaceAll(text, "SVC", service)))
			if err != nil {
				t.Fatal(err)
			}
			err = newScenarioRun(t, sc, rotaAddr, nil).run()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

type scenario struct {
	Name        string            `json:"name"`
	Connections int               `json:"connections"`
	Steps       []json.RawMessage `json:"steps"`
}

type step struct {
	Op string `json:"op"`

	// register, withdraw, update
	Stream         string            `json:"stream"`
	Instances      []json.RawMessage `json:"instances"`
	ExpectAccepted json.RawMessage   `json:"expect_accepted"` // register: ids; report: a count
	ExpectRefused  *[]expectRefusal  `json:"expect_refused"`
	ID             string            `json:"id"`
	Status         string            `json:"status"`
	Weight         *uint32           `json:"weight"`

	// pick, pick_sequence, report, lease
	Connection     int             `json:"connection"`
	Connections    []int           `json:"connections"`
	Request        json.RawMessage `json:"request"`
	Expect         json.RawMessage `json:"expect"`
	Count          int             `json:"count"`
	ExpectFallback *bool           `json:"expect_fallback"`
	ExpectTickets  *[]uint64       `json:"expect_tickets"`
	ExpectRule     *string         `json:"expect_rule"`
	ExpectLocal    *bool           `json:"expect_local"`
	Outcomes       []outcomeJSON   `json:"outcomes"`
	ExpectIgnored  *uint32         `json:"expect_ignored"`

	// start_server
	Warmup string `json:"warmup"`

	// pick_sequence, list, follow, watch
	ExpectIDs *[]string   `json:"expect_ids"`
	Service   string      `json:"service"`
	Watch     string      `json:"watch"`
	Events    []eventJSON `json:"events"`
}

type expectRefusal struct {
	ID   string          `json:"id"`
	Code json.RawMessage `json:"code"` // a name such as "INVALID_ARGUMENT", or its number
}

type expectPick struct {
	ID              *string `json:"id"`
	Fallback        *bool   `json:"fallback"`
	Ticket          *uint64 `json:"ticket"`
	Rule            *string `json:"rule"`
	Local           *bool   `json:"local"`
	Error           string  `json:"error"`
	MessageContains *string `json:"message_contains"`
	Unreachable     *bool   `json:"unreachable"`
}

type outcomeJSON struct {
	Service    string `json:"service"`
	InstanceID string `json:"instance_id"`
	Ticket     uint64 `json:"ticket"`
	Rule       string `json:"rule"`
	LatencyUS  uint64 `json:"latency_us"`
	Result     string `json:"result"`
}

type leaseRequest struct {
	Service string   `json:"service"`
	Rule    string   `json:"rule"`
	Version string   `json:"version"`
	Count   uint32   `json:"count"`
	Exclude []string `json:"exclude"`
}

type expectLease struct {
	FirstTicket uint64    `json:"first_ticket"`
	Count       uint32    `json:"count"`
	IDs         []string  `json:"ids"`
	Positions   *[]uint32 `json:"positions"`
	Rule        *string   `json:"rule"`
	Fallback    *bool     `json:"fallback"`
}

type eventJSON struct {
	Snapshot *[]string `json:"snapshot"`
	Added    *string   `json:"added"`
	Updated  *string   `json:"updated"`
	Removed  *string   `json:"removed"`
	Status   string    `json:"status"`
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func loadScenario(path string) (*scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := parseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

func parseScenario(data []byte) (*scenario, error) {
	var sc scenario
	if err := decodeStrict(data, &sc); err != nil {
		return nil, err
	}
	if sc.Connections == 0 {
		sc.Connections = 1
	}
	return &sc, nil
}

func (sc *scenario) stopsServer() bool {
	for _, raw := range sc.Steps {
		var st struct {
			Op string `json:"op"`
		}
		if json.Unmarshal(raw, &st) == nil && st.Op == "stop_server" {
			return true
		}
	}
	return false
}

// scenarioRun holds the connections, registrations and watches of one scenario.
type scenarioRun struct {
	t       *testing.T
	sc      *scenario
	ctx     context.Context
	srv     *server
	conns   []*Client
	owner   *Client
	streams map[string]*Registration
	// refused names streams whose announcement was refused: Register is all or nothing, so
	// they hold nothing and there is nothing to withdraw.
	refused map[string]bool
	watches map[string]*Watcher
}

func newScenarioRun(t *testing.T, sc *scenario, addr string, srv *server) *scenarioRun {
	r := &scenarioRun{
		t:       t,
		sc:      sc,
		ctx:     testContext(t, 60*time.Second),
		srv:     srv,
		streams: map[string]*Registration{},
		refused: map[string]bool{},
		watches: map[string]*Watcher{},
	}
	for range sc.Connections {
		r.conns = append(r.conns, dial(t, addr))
	}
	r.owner = dial(t, addr)
	return r
}

// run runs the steps in order and returns the first failure, naming its step.
func (r *scenarioRun) run() error {
	r.t.Logf("scenario %q", r.sc.Name)
	for i, raw := range r.sc.Steps {
		var st step
		if err := decodeStrict(raw, &st); err != nil {
			return fmt.Errorf("scenario %q, step %d: %w", r.sc.Name, i, err)
		}
		var err error
		switch st.Op {
		case "register":
			err = r.register(st)
		case "withdraw":
			err = r.withdraw(st)
		case "update":
			err = r.update(st)
		case "pick":
			err = r.pick(st)
		case "pick_sequence":
			err = r.pickSequence(st)
		case "list":
			err = r.list(st)
		case "report":
			err = r.report(st)
		case "lease":
			err = r.lease(st)
		case "watch":
			err = r.watch(st)
		case "watch_expect":
			err = r.watchExpect(st)
		case "follow":
			err = r.follow(st)
		case "stop_server":
			err = r.stopServer()
		case "start_server":
			err = r.startServer(st)
		default:
			err = fmt.Errorf("unknown op %q", st.Op)
		}
		if err != nil {
			return fmt.Errorf("scenario %q, step %d (%s): %w", r.sc.Name, i, st.Op, err)
		}
	}
	return nil
}

func instanceFromJSON(raw json.RawMessage) (Instance, error) {
	var pb rotapb.Instance
	if err := protojson.Unmarshal(raw, &pb); err != nil {
		return Instance{}, err
	}
	return instanceFromProto(&pb), nil
}

func (r *scenarioRun) register(st step) error {
	if _, ok := r.streams[st.Stream]; ok {
		return fmt.Errorf("stream %q is open; this client announces once per registration", st.Stream)
	}
	var instances []Instance
	for i, raw := range st.Instances {
		instance, err := instanceFromJSON(raw)
		if err != nil {
			return fmt.Errorf("instance %d: %w", i, err)
		}
		instances = append(instances, instance)
	}
	var wantAccepted, wantRefused []string
	if st.ExpectAccepted != nil {
		if err := json.Unmarshal(st.ExpectAccepted, &wantAccepted); err != nil {
			return fmt.Errorf("expect_accepted: %w", err)
		}
	} else {
		for _, i := range instances {
			wantAccepted = append(wantAccepted, i.Ref().ID)
		}
	}
	if st.ExpectRefused != nil {
		for _, f := range *st.ExpectRefused {
			c, err := parseCode(f.Code)
			if err != nil {
				return err
			}
			wantRefused = append(wantRefused, fmt.Sprintf("%s:%s", f.ID, c))
		}
	}
	reg, err := r.owner.Register(r.ctx, instances...)
	var gotAccepted, gotRefused []string
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		// Register is all or nothing: nothing is accepted when anything is refused.
		r.refused[st.Stream] = true
		for _, f := range refused.Refusals {
			gotRefused = append(gotRefused, fmt.Sprintf("%s:%s", f.Instance.ID, code.Code(f.Code)))
		}
	case err != nil:
		return err
	default:
		r.streams[st.Stream] = reg
		for _, a := range reg.Accepted() {
			gotAccepted = append(gotAccepted, a.ID)
		}
	}
	if !slices.Equal(gotAccepted, wantAccepted) {
		return fmt.Errorf("accepted %q, want %q (refused: %q)", gotAccepted, wantAccepted, gotRefused)
	}
	slices.Sort(gotRefused)
	slices.Sort(wantRefused)
	if !slices.Equal(gotRefused, wantRefused) {
		return fmt.Errorf("refused %q, want %q", gotRefused, wantRefused)
	}
	return nil
}

func parseCode(raw json.RawMessage) (code.Code, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		v, ok := code.Code_value[name]
		if !ok {
			return 0, fmt.Errorf("unknown status code name %q", name)
		}
		return code.Code(v), nil
	}
	var number int32
	if err := json.Unmarshal(raw, &number); err != nil {
		return 0, fmt.Errorf("status code %s is neither a name nor a number", raw)
	}
	return code.Code(number), nil
}

func (r *scenarioRun) withdraw(st step) error {
	reg, ok := r.streams[st.Stream]
	if !ok {
		if r.refused[st.Stream] {
			delete(r.refused, st.Stream)
			return nil
		}
		return fmt.Errorf("no open stream %q", st.Stream)
	}
	delete(r.streams, st.Stream)
	return reg.Close(r.ctx)
}

func (r *scenarioRun) update(st step) error {
	reg, ok := r.streams[st.Stream]
	if !ok {
		return fmt.Errorf("no open stream %q", st.Stream)
	}
	var opts []UpdateOption
	if st.Status != "" {
		v, ok := rotapb.InstanceStatus_value[st.Status]
		if !ok {
			return fmt.Errorf("unknown status %q", st.Status)
		}
		opts = append(opts, SetStatus(InstanceStatus(v)))
	}
	if st.Weight != nil {
		opts = append(opts, SetWeight(*st.Weight))
	}
	return reg.Update(r.ctx, InstanceRef{Service: st.Service, ID: st.ID}, opts...)
}

// pickOptions turns a PickRequest in proto JSON into Pick's arguments.
func pickOptions(raw json.RawMessage) (string, []PickOption, error) {
	var req rotapb.PickRequest
	if err := protojson.Unmarshal(raw, &req); err != nil {
		return "", nil, fmt.Errorf("request: %w", err)
	}
	opts := []PickOption{Rule(req.GetRule()), Version(req.GetVersion()), Key(req.GetKey()), Zone(req.GetZone())}
	if len(req.GetExclude()) > 0 {
		opts = append(opts, Exclude(req.GetExclude()...))
	}
	return req.GetService(), opts, nil
}

func (r *scenarioRun) conn(i int) (*Client, error) {
	if i < 0 || i >= len(r.conns) {
		return nil, fmt.Errorf("connection %d of %d", i, len(r.conns))
	}
	return r.conns[i], nil
}

func (r *scenarioRun) pick(st step) error {
	var want expectPick
	if err := decodeStrict(st.Expect, &want); err != nil {
		return fmt.Errorf("expect: %w", err)
	}
	service, opts, err := pickOptions(st.Request)
	if err != nil {
		return err
	}
	c, err := r.conn(st.Connection)
	if err != nil {
		return err
	}
	p, err := c.Pick(r.ctx, service, opts...)
	if want.Error != "" {
		var rerr *Error
		if !errors.As(err, &rerr) {
			return fmt.Errorf("got %+v, %v; want a %s error", p, err, want.Error)
		}
		if codeName(rerr.Code) != want.Error {
			return fmt.Errorf("got %v, want a %s error", err, want.Error)
		}
		if want.MessageContains != nil && !strings.Contains(rerr.Message, *want.MessageContains) {
			return fmt.Errorf("message %q does not contain %q", rerr.Message, *want.MessageContains)
		}
		if want.Unreachable != nil && rerr.Unreachable != *want.Unreachable {
			return fmt.Errorf("Unreachable %v, want %v (%v)", rerr.Unreachable, *want.Unreachable, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if want.ID == nil {
		return errors.New("expect has neither id nor error")
	}
	if p.Instance.ID != *want.ID {
		return fmt.Errorf("picked %q, want %q", p.Instance.ID, *want.ID)
	}
	if local := want.Local != nil && *want.Local; p.LocalFallback != local {
		return fmt.Errorf("LocalFallback %v, want %v", p.LocalFallback, local)
	}
	if want.Fallback != nil && (p.Fallback != "") != *want.Fallback {
		return fmt.Errorf("fallback %q, want fallback=%v", p.Fallback, *want.Fallback)
	}
	if want.Ticket != nil && p.Ticket != *want.Ticket {
		return fmt.Errorf("ticket %d, want %d", p.Ticket, *want.Ticket)
	}
	if want.Rule != nil && p.Rule != *want.Rule {
		return fmt.Errorf("rule %q, want %q", p.Rule, *want.Rule)
	}
	return nil
}

func (r *scenarioRun) pickSequence(st step) error {
	if st.ExpectIDs == nil {
		return errors.New("pick_sequence without expect_ids")
	}
	connections := st.Connections
	if len(connections) == 0 {
		connections = []int{0}
	}
	service, opts, err := pickOptions(st.Request)
	if err != nil {
		return err
	}
	local := st.ExpectLocal != nil && *st.ExpectLocal
	var ids []string
	var tickets []uint64
	for i := range st.Count {
		c, err := r.conn(connections[i%len(connections)])
		if err != nil {
			return err
		}
		p, err := c.Pick(r.ctx, service, opts...)
		if err != nil {
			return fmt.Errorf("pick %d: %w", i, err)
		}
		if p.LocalFallback != local {
			return fmt.Errorf("pick %d: LocalFallback %v, want %v", i, p.LocalFallback, local)
		}
		if st.ExpectFallback != nil && (p.Fallback != "") != *st.ExpectFallback {
			return fmt.Errorf("pick %d: fallback %q, want fallback=%v", i, p.Fallback, *st.ExpectFallback)
		}
		if st.ExpectRule != nil && p.Rule != *st.ExpectRule {
			return fmt.Errorf("pick %d: rule %q, want %q", i, p.Rule, *st.ExpectRule)
		}
		ids = append(ids, p.Instance.ID)
		tickets = append(tickets, p.Ticket)
	}
	if !slices.Equal(ids, *st.ExpectIDs) {
		return fmt.Errorf("picked %q, want %q", ids, *st.ExpectIDs)
	}
	if st.ExpectTickets != nil && !slices.Equal(tickets, *st.ExpectTickets) {
		return fmt.Errorf("tickets %v, want %v", tickets, *st.ExpectTickets)
	}
	return nil
}

func (r *scenarioRun) list(st step) error {
	if st.ExpectIDs == nil {
		return errors.New("list without expect_ids")
	}
	instances, err := r.conns[0].Instances(r.ctx, st.Service)
	if err != nil {
		return err
	}
	ids := []string{}
	for _, i := range instances {
		ids = append(ids, i.ID)
	}
	if !slices.Equal(ids, *st.ExpectIDs) {
		return fmt.Errorf("listed %q, want %q", ids, *st.ExpectIDs)
	}
	return nil
}

func (r *scenarioRun) report(st step) error {
	c, err := r.conn(st.Connection)
	if err != nil {
		return err
	}
	var outcomes []Outcome
	for _, o := range st.Outcomes {
		v, ok := rotapb.CallResult_value["CALL_RESULT_"+o.Result]
		if !ok {
			return fmt.Errorf("unknown result %q", o.Result)
		}
		outcomes = append(outcomes, Outcome{
			Service:    o.Service,
			InstanceID: o.InstanceID,
			Ticket:     o.Ticket,
			Rule:       o.Rule,
			Latency:    time.Duration(o.LatencyUS) * time.Microsecond,
			Result:     Result(v),
		})
	}
	summary, err := c.Report(r.ctx, outcomes...)
	if err != nil {
		return err
	}
	wantAccepted, wantIgnored := uint32(len(outcomes)), uint32(0)
	if st.ExpectAccepted != nil {
		if err := json.Unmarshal(st.ExpectAccepted, &wantAccepted); err != nil {
			return fmt.Errorf("expect_accepted: %w", err)
		}
	}
	if st.ExpectIgnored != nil {
		wantIgnored = *st.ExpectIgnored
	}
	if uint32(summary.Accepted) != wantAccepted || uint32(summary.Ignored) != wantIgnored {
		return fmt.Errorf("accepted %d, ignored %d; want %d and %d", summary.Accepted, summary.Ignored, wantAccepted, wantIgnored)
	}
	return nil
}

func (r *scenarioRun) lease(st step) error {
	var req leaseRequest
	if err := decodeStrict(st.Request, &req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	var want expectLease
	if err := decodeStrict(st.Expect, &want); err != nil {
		return fmt.Errorf("expect: %w", err)
	}
	c, err := r.conn(st.Connection)
	if err != nil {
		return err
	}
	resp, err := rotapb.NewBalancerClient(c.Conn()).Lease(r.ctx, &rotapb.LeaseRequest{
		Service: req.Service, Rule: req.Rule, Version: req.Version, Count: req.Count, Exclude: req.Exclude,
	})
	if err != nil {
		return rpcError(err)
	}
	var ids []string
	for _, i := range resp.GetInstances() {
		ids = append(ids, i.GetId())
	}
	if resp.GetFirstTicket() != want.FirstTicket || resp.GetCount() != want.Count || !slices.Equal(ids, want.IDs) {
		return fmt.Errorf("leased %d+%d over %q, want %d+%d over %q",
			resp.GetFirstTicket(), resp.GetCount(), ids, want.FirstTicket, want.Count, want.IDs)
	}
	if want.Positions != nil && !slices.Equal(resp.GetPositions(), *want.Positions) {
		return fmt.Errorf("lease positions %v, want %v", resp.GetPositions(), *want.Positions)
	}
	if want.Rule != nil && resp.GetRule() != *want.Rule {
		return fmt.Errorf("lease rule %q, want %q", resp.GetRule(), *want.Rule)
	}
	if want.Fallback != nil && (resp.GetFallback() != "") != *want.Fallback {
		return fmt.Errorf("lease fallback %q, want fallback=%v", resp.GetFallback(), *want.Fallback)
	}
	return nil
}

func (r *scenarioRun) watch(st step) error {
	c, err := r.conn(st.Connection)
	if err != nil {
		return err
	}
	w, err := c.Watch(r.ctx, st.Service)
	if err != nil {
		return err
	}
	r.watches[st.Watch] = w
	return nil
}

func describeEvent(e WatchEvent) string {
	switch e.Kind {
	case WatchSnapshot:
		ids := []string{}
		for _, i := range e.Instances {
			ids = append(ids, i.ID)
		}
		return fmt.Sprintf("snapshot %q", ids)
	case WatchAdded:
		return fmt.Sprintf("added %q", e.Ref.ID)
	case WatchUpdated:
		return fmt.Sprintf("updated %q %s", e.Ref.ID, e.Instance.Status)
	case WatchRemoved:
		return fmt.Sprintf("removed %q", e.Ref.ID)
	}
	return "nothing"
}

func (e eventJSON) describe() (string, error) {
	var kinds []string
	var out string
	if e.Snapshot != nil {
		kinds = append(kinds, "snapshot")
		ids := append([]string{}, *e.Snapshot...)
		out = fmt.Sprintf("snapshot %q", ids)
	}
	if e.Added != nil {
		kinds = append(kinds, "added")
		out = fmt.Sprintf("added %q", *e.Added)
	}
	if e.Updated != nil {
		kinds = append(kinds, "updated")
		out = fmt.Sprintf("updated %q %s", *e.Updated, cmpOr(e.Status, "UP"))
	}
	if e.Removed != nil {
		kinds = append(kinds, "removed")
		out = fmt.Sprintf("removed %q", *e.Removed)
	}
	if len(kinds) != 1 {
		return "", fmt.Errorf("an event names exactly one of snapshot, added, updated, removed; got %q", kinds)
	}
	return out, nil
}

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

func (r *scenarioRun) watchExpect(st step) error {
	stream, ok := r.watches[st.Watch]
	if !ok {
		return fmt.Errorf("no watch %q", st.Watch)
	}
	for n, want := range st.Events {
		wanted, err := want.describe()
		if err != nil {
			return fmt.Errorf("event %d: %w", n, err)
		}
		type received struct {
			event WatchEvent
			err   error
		}
		got := make(chan received, 1)
		go func() {
			e, err := stream.Recv()
			got <- received{e, err}
		}()
		select {
		case g := <-got:
			if g.err != nil {
				return fmt.Errorf("event %d: %w", n, g.err)
			}
			if d := describeEvent(g.event); d != wanted {
				return fmt.Errorf("event %d: got %s, want %s", n, d, wanted)
			}
		case <-time.After(patience):
			return fmt.Errorf("event %d: none within %s, want %s", n, patience, wanted)
		}
	}
	return nil
}

func (r *scenarioRun) follow(st step) error {
	if st.ExpectIDs == nil {
		return errors.New("follow without expect_ids")
	}
	c, err := r.conn(st.Connection)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, patience)
	defer cancel()
	if err := c.Follow(ctx, st.Service); err != nil {
		return err
	}
	var ids []string
	for {
		ids = c.cache.ids(st.Service)
		if slices.Equal(ids, *st.ExpectIDs) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the followed list is %q, want %q", ids, *st.ExpectIDs)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *scenarioRun) stopServer() error {
	if r.srv == nil {
		return errors.New("stop_server needs the scenario's own server")
	}
	if err := r.srv.kill(); err != nil {
		return err
	}
	// The providers are gone with it: nothing may re-announce to a later server.
	_ = r.owner.Close()
	r.streams = map[string]*Registration{}
	return nil
}

func (r *scenarioRun) startServer(st step) error {
	if r.srv == nil || st.Warmup == "" {
		return errors.New("start_server needs the scenario's own server and a warmup")
	}
	r.srv = startTestServerOn(r.t, r.srv.addr, "--warmup", st.Warmup)
	r.owner = dial(r.t, r.srv.addr)
	return nil
}

// ids lists the ids of service's cached instances (every status), by id.
func (fc *fallbackCache) ids(service string) []string {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	ids := []string{}
	if v, ok := fc.services[service]; ok {
		for _, i := range v.instances {
			ids = append(ids, i.ID)
		}
	}
	return ids
}
