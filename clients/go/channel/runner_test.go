package channel

import (
	"strings"
	"testing"

	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// The runner refuses unknown keys, also inside a policy and an expectation.
func TestScenarioUnknownKeysAreRefused(t *testing.T) {
	for _, raw := range []string{
		`{"name": "x", "rule": "round_robin", "instances": [], "steps": [], "polcy": {}}`,
		`{"name": "x", "rule": "round_robin", "instances": [], "steps": [], "policy": {"grey": {}}}`,
		`{"name": "x", "rule": "round_robin", "instances": [], "steps": [{"calls": 1, "expect": {"count": {"a": 1}}}]}`,
	} {
		if _, err := decodeScenario([]byte(raw)); err == nil {
			t.Errorf("accepted %s", raw)
		}
	}
	sc, err := decodeScenario([]byte(`{"name": "x", "rule": "round_robin", "instances": [], "policy": {"gray": {"unversioned": 2, "versions": {"v2": 1}}},
		"steps": [{"calls": 1, "expect": {"counts": {"a": 1}}}]}`))
	if err != nil || sc.Policy == nil || sc.Steps[0].Expect.Counts["a"] != 1 {
		t.Fatalf("a valid scenario: %+v, %v", sc, err)
	}
}

// counts holds only for exactly the listed numbers of calls, and no call elsewhere.
func TestCountsExpectation(t *testing.T) {
	var results []echo.Result
	var calls []echo.Call
	for _, id := range []string{"a", "a", "b", "v"} {
		results = append(results, echo.Result{Instance: id})
		calls = append(calls, echo.Call{Instance: id, Ticket: 0})
	}
	for _, c := range []struct {
		counts map[string]int
		fails  string
	}{
		{map[string]int{"a": 2, "b": 1, "v": 1}, ""},
		{map[string]int{"a": 2, "b": 2, "v": 1}, "1 calls reached b, want 2"},
		{map[string]int{"a": 2, "b": 1}, "which counts does not list"},
		{map[string]int{"a": 2, "b": 1, "v": 1, "w": 0}, ""},
		{map[string]int{"a": 2, "b": 1, "v": 1, "w": 1}, "0 calls reached w, want 1"},
	} {
		err := checkExpect("round_robin", &expectInfo{Counts: c.counts}, nil, results, calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("counts %v: %v", c.counts, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("counts %v: %v, want an error with %q", c.counts, err, c.fails)
		}
	}
}

// The keys of the unusable-instance scenarios are known; balanced holds only within its bound.
func TestBalancedExpectationAndTheUnusableInstanceKeys(t *testing.T) {
	sc, err := decodeScenario([]byte(`{"name": "x", "rule": "round_robin", "instances": [{"id": "a"}, {"id": "c", "unreachable": true}],
		"steps": [{"hang": "a"}, {"calls": 1, "expect": {"balanced": true, "only": ["a"]}}]}`))
	if err != nil || !sc.Instances[1].Unreachable || sc.Steps[0].Hang != "a" || !sc.Steps[1].Expect.Balanced {
		t.Fatalf("a scenario with unreachable, hang and balanced: %+v, %v", sc, err)
	}
	if _, err := decodeScenario([]byte(`{"name": "x", "rule": "round_robin", "instances": [{"id": "a", "unreachabl": true}], "steps": []}`)); err == nil {
		t.Error("accepted an unknown instance key")
	}
	answers := func(counts map[string]int) []echo.Result {
		var out []echo.Result
		for id, n := range counts {
			for i := 0; i < n; i++ {
				out = append(out, echo.Result{Instance: id})
			}
		}
		return out
	}
	only := []string{"a", "b"}
	for _, c := range []struct {
		counts map[string]int
		fails  string
	}{
		{map[string]int{"a": 30, "b": 30}, ""},
		{map[string]int{"a": 33, "b": 27}, ""}, // 6 ≤ 60/10
		{map[string]int{"a": 34, "b": 26}, "differ by 8, more than 6"},
		{map[string]int{"a": 5, "b": 3}, ""}, // 2 ≤ max(2, 0)
		{map[string]int{"a": 6, "b": 3}, "differ by 3, more than 2"},
		{map[string]int{"a": 6}, "b answered no call"},
	} {
		reached := answers(c.counts)
		var calls []echo.Call
		for _, r := range reached {
			calls = append(calls, echo.Call{Instance: r.Instance})
		}
		err := checkExpect("round_robin", &expectInfo{Only: only, Balanced: true}, nil, reached, calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("%v: %v", c.counts, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("%v: %v, want an error with %q", c.counts, err, c.fails)
		}
	}
}
