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

// The shared conformance scenarios (../conformance/README.md), run against the shared
// server: picks go through Client.Pick on `connections` separate clients; registrations
// use raw Register streams, since a step asserts exactly what the Ack says.

const scenarioDir = "../conformance/scenarios"

func TestConformance(t *testing.T) {
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
	if len(files) == 0 {
		t.Fatalf("no scenario in %s", scenarioDir)
	}
	for _, name := range files {
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			sc, err := loadScenario(filepath.Join(scenarioDir, name))
			if err != nil {
				t.Fatal(err)
			}
			newScenarioRun(t, sc).run()
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

	// register, withdraw
	Stream         string            `json:"stream"`
	Instances      []json.RawMessage `json:"instances"`
	ExpectAccepted *[]string         `json:"expect_accepted"`
	ExpectRefused  *[]expectRefusal  `json:"expect_refused"`

	// pick, pick_sequence
	Connection     int             `json:"connection"`
	Connections    []int           `json:"connections"`
	Request        json.RawMessage `json:"request"`
	Expect         *expectPick     `json:"expect"`
	Count          int             `json:"count"`
	ExpectFallback *bool           `json:"expect_fallback"`

	// pick_sequence, list
	ExpectIDs *[]string `json:"expect_ids"`
	Service   string    `json:"service"`
}

type expectRefusal struct {
	ID   string          `json:"id"`
	Code json.RawMessage `json:"code"` // a name such as "INVALID_ARGUMENT", or its number
}

type expectPick struct {
	ID              *string `json:"id"`
	Fallback        *bool   `json:"fallback"`
	Ticket          *uint64 `json:"ticket"`
	Error           string  `json:"error"`
	MessageContains *string `json:"message_contains"`
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
	var sc scenario
	if err := decodeStrict(data, &sc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if sc.Connections == 0 {
		sc.Connections = 1
	}
	return &sc, nil
}

// scenarioRun holds the connections and streams of one scenario.
type scenarioRun struct {
	t        *testing.T
	sc       *scenario
	ctx      context.Context
	conns    []*Client
	registry rotapb.RegistryClient
	streams  map[string]*rawStream
}

type rawStream struct {
	stream rotapb.Registry_RegisterClient
	cancel context.CancelFunc
}

func newScenarioRun(t *testing.T, sc *scenario) *scenarioRun {
	r := &scenarioRun{t: t, sc: sc, ctx: testContext(t, 30*time.Second), streams: map[string]*rawStream{}}
	for range sc.Connections {
		r.conns = append(r.conns, dial(t, rotaAddr))
	}
	r.registry = rotapb.NewRegistryClient(dial(t, rotaAddr).Conn())
	t.Cleanup(func() {
		for _, s := range r.streams {
			s.cancel()
		}
	})
	return r
}

func (r *scenarioRun) run() {
	r.t.Logf("scenario %q", r.sc.Name)
	for i, raw := range r.sc.Steps {
		var st step
		if err := decodeStrict(raw, &st); err != nil {
			r.t.Fatalf("step %d: %v", i, err)
		}
		var err error
		switch st.Op {
		case "register":
			err = r.register(st)
		case "withdraw":
			err = r.withdraw(st)
		case "pick":
			err = r.pick(st)
		case "pick_sequence":
			err = r.pickSequence(st)
		case "list":
			err = r.list(st)
		default:
			err = fmt.Errorf("unknown op %q", st.Op)
		}
		if err != nil {
			r.t.Fatalf("scenario %q, step %d (%s): %v", r.sc.Name, i, st.Op, err)
		}
	}
}

func (r *scenarioRun) register(st step) error {
	instances := make([]*rotapb.Instance, len(st.Instances))
	for i, raw := range st.Instances {
		instances[i] = &rotapb.Instance{}
		if err := protojson.Unmarshal(raw, instances[i]); err != nil {
			return fmt.Errorf("instance %d: %w", i, err)
		}
	}
	s, ok := r.streams[st.Stream]
	if !ok {
		ctx, cancel := context.WithCancel(r.ctx)
		stream, err := r.registry.Register(ctx)
		if err != nil {
			cancel()
			return err
		}
		s = &rawStream{stream: stream, cancel: cancel}
		r.streams[st.Stream] = s
	}
	ack, err := s.send(&rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Announce{Announce: &rotapb.Announce{Instances: instances}}})
	if err != nil {
		return err
	}

	var wantAccepted []string
	var wantRefused []string
	if st.ExpectAccepted != nil {
		wantAccepted = *st.ExpectAccepted
	} else {
		for _, i := range instances {
			wantAccepted = append(wantAccepted, instanceFromProto(i).Ref().ID)
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
	var gotAccepted, gotRefused []string
	for _, a := range ack.GetAccepted() {
		gotAccepted = append(gotAccepted, a.GetId())
	}
	for _, f := range ack.GetRefused() {
		gotRefused = append(gotRefused, fmt.Sprintf("%s:%s", f.GetInstance().GetId(), code.Code(f.GetCode())))
	}
	if !slices.Equal(gotAccepted, wantAccepted) {
		return fmt.Errorf("accepted %q, want %q (refused: %v)", gotAccepted, wantAccepted, ack.GetRefused())
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

// send sends one Announce, Update or Withdraw and returns its Ack.
func (s *rawStream) send(msg *rotapb.RegisterRequest) (*rotapb.Ack, error) {
	if err := s.stream.Send(msg); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	resp, err := s.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("waiting for the ack: %w", err)
	}
	ack := resp.GetAck()
	if ack == nil {
		return nil, fmt.Errorf("got %v instead of an ack", resp)
	}
	return ack, nil
}

func (r *scenarioRun) withdraw(st step) error {
	s, ok := r.streams[st.Stream]
	if !ok {
		return fmt.Errorf("no open stream %q", st.Stream)
	}
	delete(r.streams, st.Stream)
	defer s.cancel()
	if _, err := s.send(&rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Withdraw{Withdraw: &rotapb.Withdraw{}}}); err != nil {
		return err
	}
	return s.stream.CloseSend()
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
	if st.Expect == nil {
		return errors.New("pick without expect")
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
	want := st.Expect
	if want.Error != "" {
		var rerr *Error
		if !errors.As(err, &rerr) {
			return fmt.Errorf("got %v, %v; want a %s error", p, err, want.Error)
		}
		if codeName(rerr.Code) != want.Error {
			return fmt.Errorf("got %v, want a %s error", err, want.Error)
		}
		if want.MessageContains != nil && !strings.Contains(rerr.Message, *want.MessageContains) {
			return fmt.Errorf("message %q does not contain %q", rerr.Message, *want.MessageContains)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if p.LocalFallback {
		return errors.New("answered from the local cache, not by rota")
	}
	if want.ID == nil {
		return errors.New("expect has neither id nor error")
	}
	if p.Instance.ID != *want.ID {
		return fmt.Errorf("picked %q, want %q", p.Instance.ID, *want.ID)
	}
	if want.Fallback != nil && (p.Fallback != "") != *want.Fallback {
		return fmt.Errorf("fallback %q, want fallback=%v", p.Fallback, *want.Fallback)
	}
	if want.Ticket != nil && p.Ticket != *want.Ticket {
		return fmt.Errorf("ticket %d, want %d", p.Ticket, *want.Ticket)
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
	var ids []string
	for i := range st.Count {
		c, err := r.conn(connections[i%len(connections)])
		if err != nil {
			return err
		}
		p, err := c.Pick(r.ctx, service, opts...)
		if err != nil {
			return fmt.Errorf("pick %d: %w", i, err)
		}
		if p.LocalFallback {
			return fmt.Errorf("pick %d answered from the local cache, not by rota", i)
		}
		if st.ExpectFallback != nil && (p.Fallback != "") != *st.ExpectFallback {
			return fmt.Errorf("pick %d: fallback %q, want fallback=%v", i, p.Fallback, *st.ExpectFallback)
		}
		ids = append(ids, p.Instance.ID)
	}
	if !slices.Equal(ids, *st.ExpectIDs) {
		return fmt.Errorf("picked %q, want %q", ids, *st.ExpectIDs)
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
