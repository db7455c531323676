package xds

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// Every scenario file decodes; the runner refuses unknown keys, also inside a policy and an
// expectation, and the channel scenarios' keys that the xDS ones do not use.
func TestScenarioKeys(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(scenarioDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s: %v", scenarioDir, err)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeScenario(raw); err != nil {
			t.Errorf("%s: %v", file, err)
		}
	}
	for _, raw := range []string{
		`{"name": "x", "instances": [], "steps": [], "polcy": {}}`,
		`{"name": "x", "instances": [], "steps": [], "policy": {"grey": {}}}`,
		`{"name": "x", "rule": "round_robin", "instances": [], "steps": []}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "expect": {"leased": true}}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "expect": {"code": ["UNAVAILABLE"]}}]}`,
		`{"name": "x", "instances": [], "steps": [{"drain": "a", "trip": "a", "within_ms": 1}]}`,
		`{"name": "x", "instances": [], "steps": [{"within_ms": 1}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "expect": {"rotation": ["a"]}}]}`,
		`{"name": "x", "rota_policy": true, "instances": [], "steps": [{"calls": 1, "expect": {"runs": 3}}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "key": 2}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "expect": {"keyd": true}}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "expect": {"keyed": true}}]}`,
		`{"name": "x", "instances": [], "steps": [{"calls": 1, "keys": -1}]}`,
		`{"name": "x", "instances": [], "steps": [{"withdraw": "a", "within_ms": 1, "keys": 2}]}`,
	} {
		if _, err := decodeScenario([]byte(raw)); err == nil {
			t.Errorf("accepted %s", raw)
		}
	}
	sc, err := decodeScenario([]byte(`{"name": "x", "instances": [{"id": "a"}], "policy": {"isolationFallback": "ISOLATION_FALLBACK_ANY"},
		"steps": [{"drain": "a", "within_ms": 1000, "version": "v"}, {"trip": "a", "within_ms": 10},
		{"calls": 1, "deadline_ms": 300, "expect": {"failures": 1, "codes": ["UNAVAILABLE"]}},
		{"calls": 4, "keys": 2, "expect": {"keyed": true}}]}`))
	if err != nil || sc.Steps[0].Drain != "a" || sc.Steps[1].Trip != "a" || sc.Steps[2].Expect.Codes[0] != "UNAVAILABLE" ||
		sc.Steps[3].Keys != 2 || !sc.Steps[3].Expect.Keyed {
		t.Fatalf("a valid scenario: %+v, %v", sc, err)
	}
}

// rotation holds when each call's ticket is distinct and reached the instance the rule maps
// it to among the ids in id order.
func TestRotationExpectation(t *testing.T) {
	sc, err := decodeScenario([]byte(`{"name": "x", "rota_policy": true, "instances": [{"id": "a"}],
		"steps": [{"calls": 1, "consumers": 2, "expect": {"failures": 0, "rotation": ["a"]}}]}`))
	if err != nil || !sc.RotaPolicy || sc.Steps[0].Expect.Rotation[0] != "a" {
		t.Fatalf("a valid rota_policy scenario: %+v, %v", sc, err)
	}
	call := func(id string, ticket int64) echo.Call { return echo.Call{Instance: id, Ticket: ticket} }
	for _, c := range []struct {
		rule  string
		calls []echo.Call
		fails string
	}{
		{"round_robin", []echo.Call{call("a", 0), call("b", 1), call("c", 5), call("a", 9)}, ""},
		{"repeat(n=2)", []echo.Call{call("a", 0), call("a", 1), call("b", 2), call("a", 6)}, ""},
		{"round_robin", []echo.Call{call("b", 0)}, "ticket 0 reached b"},
		{"round_robin", []echo.Call{call("a", 3), call("a", 3)}, "used twice"},
		{"round_robin", []echo.Call{call("a", -1)}, "carried no ticket"},
		{"round_robin", nil, "no call"},
		{"weighted", []echo.Call{call("a", 0)}, "not \"weighted\""},
	} {
		err := checkRotation(c.rule, []string{"c", "a", "b"}, c.calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("%s %v: %v", c.rule, c.calls, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("%s %v: %v, want an error with %q", c.rule, c.calls, err, c.fails)
		}
	}
}

// codes holds when every failed call's code is one of the names, spelled as the scenarios do.
func TestCodesExpectation(t *testing.T) {
	failed := func(c codes.Code) result { return result{start: time.Now(), err: status.Error(c, "x")} }
	ok := result{instance: "a"}
	calls := []echo.Call{{Instance: "a", Ticket: -1}}
	for _, c := range []struct {
		codes   []string
		results []result
		fails   string
	}{
		{[]string{"UNAVAILABLE"}, []result{ok, failed(codes.Unavailable)}, ""},
		{[]string{"UNAVAILABLE", "DEADLINE_EXCEEDED"}, []result{failed(codes.DeadlineExceeded), ok}, ""},
		{[]string{"UNAVAILABLE"}, []result{failed(codes.DeadlineExceeded), ok}, "failed with DEADLINE_EXCEEDED"},
		{[]string{"CANCELLED"}, []result{failed(codes.Canceled), ok}, ""},
	} {
		err := checkExpect(&expect{Codes: c.codes}, "round_robin", c.results, calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("codes %v: %v", c.codes, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("codes %v: %v, want an error with %q", c.codes, err, c.fails)
		}
	}
}

// keyed holds when every answered call carried a key and each key reached one instance; the
// calls of a round-robin client, which ignores the key, fail it.
func TestKeyedExpectation(t *testing.T) {
	call := func(i, keys int, id string) result { return result{instance: id, key: keyName(i, keys)} }
	failed := result{key: "key-0", err: status.Error(codes.Unavailable, "x")}
	var roundRobin []result
	for i := range 6 {
		roundRobin = append(roundRobin, call(i, 3, []string{"a", "b", "c"}[i%3]))
	}
	for _, c := range []struct {
		name    string
		results []result
		fails   string
	}{
		{"each key one instance", []result{call(0, 2, "a"), call(1, 2, "b"), call(2, 2, "a"), call(3, 2, "b")}, ""},
		{"across consumers, a failure aside", []result{call(0, 2, "a"), call(1, 2, "c"), failed, call(0, 2, "a"), call(1, 2, "c")}, ""},
		{"a key on two instances", []result{call(0, 2, "a"), call(1, 2, "b"), call(2, 2, "b")}, "1 of 2 keys reached more than one instance: key-0 reached map[a:1 b:1]"},
		// A rotation over as many instances as there are keys sends each key to one instance:
		// hence the scenarios' key counts, which share no factor with their instance counts.
		{"round robin over three with three keys", roundRobin, ""},
		{"round robin over three with two keys", []result{call(0, 2, "a"), call(1, 2, "b"), call(2, 2, "c"), call(3, 2, "a")}, "2 of 2 keys reached more than one instance"},
		{"no key", []result{call(0, 0, "a")}, "carried no key"},
		{"nothing answered", []result{failed}, "no call was answered"},
	} {
		err := checkExpect(&expect{Keyed: true}, "round_robin", c.results, make([]echo.Call, len(c.results)-countFailed(c.results)))
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.fails)
		}
	}
	if keyName(7, 3) != "key-1" || keyName(7, 0) != "" {
		t.Fatalf("keyName(7, 3) = %q, keyName(7, 0) = %q", keyName(7, 3), keyName(7, 0))
	}
}

func countFailed(results []result) int {
	n := 0
	for _, r := range results {
		if r.err != nil {
			n++
		}
	}
	return n
}
