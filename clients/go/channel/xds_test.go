package channel

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/metadata"
)

// The config rota's clusters carry parses, unknown fields ignored; one without a service, or
// that is not a JSON object with string fields, is refused (grpc-go then NACKs the cluster).
func TestXDSConfigParsing(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want XDSConfig
	}{
		{`{"service": "echo", "version": "", "rule": "round_robin"}`, XDSConfig{Service: "echo", Rule: "round_robin"}},
		{`{"service": "echo", "version": "v2", "rule": "repeat(n=3)", "future": {"x": [1]}}`, XDSConfig{Service: "echo", Version: "v2", Rule: "repeat(n=3)"}},
		{`{"service": "orders"}`, XDSConfig{Service: "orders"}},
		{`{"service": "orders", "version": null}`, XDSConfig{Service: "orders"}},
	} {
		got, err := ParseXDSConfig(json.RawMessage(c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.raw, err)
			continue
		}
		if got.Service != c.want.Service || got.Version != c.want.Version || got.Rule != c.want.Rule {
			t.Errorf("%s: got %+v, want %+v", c.raw, *got, c.want)
		}
	}
	for _, c := range []struct{ raw, says string }{
		{`{"version": "v1", "rule": "round_robin"}`, "names no service"},
		{`{"service": ""}`, "names no service"},
		{`{"service": null}`, "names no service"},
		{`{}`, "names no service"},
		{`{"service": 7}`, `"service" is 7, not a string`},
		{`{"service": "echo", "rule": ["round_robin"]}`, `"rule" is`},
		{`{"service": "echo", "version": 2}`, `"version" is 2`},
		{`"echo"`, "not a JSON object"},
		{`[{"service": "echo"}]`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`{"service": "echo"`, "not a JSON object"},
		{`junk`, "not a JSON object"},
		{``, "not a JSON object"},
	} {
		got, err := ParseXDSConfig(json.RawMessage(c.raw))
		if err == nil {
			t.Errorf("%s: accepted as %+v", c.raw, *got)
			continue
		}
		if !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want it to say %q", c.raw, err, c.says)
		}
	}
}

// RegisterXDSPolicy registers a builder under the name the xDS client looks up (the type URL's
// last part), whose ParseConfig is ParseXDSConfig's.
func TestRegisterXDSPolicy(t *testing.T) {
	RegisterXDSPolicy("127.0.0.1:1", WithTicketHeader(true))
	b := balancer.Get(XDSPolicyName)
	if b == nil {
		t.Fatalf("no balancer registered as %s", XDSPolicyName)
	}
	parser, ok := b.(balancer.ConfigParser)
	if !ok {
		t.Fatalf("%s's builder parses no config", XDSPolicyName)
	}
	lb, err := parser.ParseConfig(json.RawMessage(`{"service": "echo", "version": "", "rule": "round_robin", "extra": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := lb.(*XDSConfig); !ok || c.Service != "echo" || c.Rule != "round_robin" {
		t.Fatalf("parsed %#v", lb)
	}
	if _, err := parser.ParseConfig(json.RawMessage(`{"rule": "round_robin"}`)); err == nil {
		t.Fatal("a config without a service was accepted")
	}
	if xb, ok := b.(xdsBuilder); !ok || xb.opts.server != "127.0.0.1:1" || !xb.opts.ticket {
		t.Fatalf("registered %#v", b)
	}
}

// The policy xDS names finds a lease's instance by its host:port among the addresses xDS gave
// (no instance ids there): a ticket reaches the address of the instance its position names,
// and the tickets of an instance whose address xDS did not give are passed over, as in a
// rota:/// channel. A call's x-rota-version does not change the lease: the cluster's version.
func TestTheXDSPolicyRoutesTicketsByAddress(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fake := &scriptedLeases{rule: "round_robin"}
	p, _, woken := scriptedPicker(t, fake, &now)
	p.byAddr, p.known = true, nil
	for _, i := range threeInstances[:2] { // xDS gave a's and b's addresses, not c's
		p.ready[subConnKey("", instanceAddr(i))] = readyConn{sc: &fakeSubConn{id: instanceAddr(i)}, hold: &holdout{}}
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), VersionHeader, "v9")
	want := uint64(0)
	for call := 0; call < 30; call++ {
		var r balancer.PickResult
		var err error
		for attempt := 0; attempt < 100; attempt++ {
			if r, err = p.Pick(balancer.PickInfo{Ctx: ctx}); err != balancer.ErrNoSubConnAvailable {
				break
			}
			waitWoken(t, woken)
		}
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if want%3 == 2 {
			want++ // c's ticket: passed over
		}
		ticket, err := strconv.ParseUint(r.Metadata.Get(TicketHeader)[0], 10, 64)
		if err != nil || ticket != want {
			t.Fatalf("call %d: ticket %v (%v), want %d", call, r.Metadata.Get(TicketHeader), err, want)
		}
		wantAddr := instanceAddr(threeInstances[ticket%3])
		if got := r.SubConn.(*fakeSubConn).id; got != wantAddr {
			t.Fatalf("ticket %d went to %s, want %s", ticket, got, wantAddr)
		}
		want++
	}
	if _, ok := p.leases.streams["v9"]; ok {
		t.Fatal("a call's x-rota-version opened a lease stream of its own")
	}
	// The leases excluded c, by the id the lease named, and go on excluding it once rota
	// answers without it.
	if got := fake.excludes(); len(got) < 2 || !slices.Equal(got[len(got)-1], []string{"c"}) {
		t.Fatalf("leases excluded %q, want [c] once a lease named it", got)
	}
	fake.set(func(f *scriptedLeases) { f.honour = true })
	from := len(fake.excludes())
	for n := 0; len(fake.excludes()) < from+4; n++ {
		if c := pickCall(t, p, woken); c.id == instanceAddr(threeInstances[2]) {
			t.Fatal("a call went to c's address, which xDS did not give")
		}
		if n == 300_000 {
			t.Fatal("no further leases")
		}
	}
	for _, exclude := range fake.excludes()[from:] {
		if !slices.Equal(exclude, []string{"c"}) {
			t.Fatalf("leases after rota left c out excluded %q, want [c] each", fake.excludes()[from:])
		}
	}
}
