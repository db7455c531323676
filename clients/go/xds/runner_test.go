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
	} {
		if _, err := decodeScenario([]byte(raw)); err == nil {
			t.Errorf("accepted %s", raw)
		}
	}
	sc, err := decodeScenario([]byte(`{"name": "x", "instances": [{"id": "a"}], "policy": {"isolationFallback": "ISOLATION_FALLBACK_ANY"},
		"steps": [{"drain": "a", "within_ms": 1000, "version": "v"}, {"trip": "a", "within_ms": 10},
		{"calls": 1, "deadline_ms": 300, "expect": {"failures": 1, "codes": ["UNAVAILABLE"]}}]}`))
	if err != nil || sc.Steps[0].Drain != "a" || sc.Steps[1].Trip != "a" || sc.Steps[2].Expect.Codes[0] != "UNAVAILABLE" {
		t.Fatalf("a valid scenario: %+v, %v", sc, err)
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
		err := checkExpect(&expect{Codes: c.codes}, c.results, calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("codes %v: %v", c.codes, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("codes %v: %v, want an error with %q", c.codes, err, c.fails)
		}
	}
}
