package channel

import (
	"strings"
	"testing"

	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// The runner refuses unknown keys anywhere (top level, instances, steps, expectations, the
// policy), naming the key.
func TestScenarioUnknownKeysAreRefused(t *testing.T) {
	for _, c := range []struct{ raw, key string }{
		{`{"name": "x", "rule": "round_robin", "instances": [], "steps": [], "polcy": {}}`, "polcy"},
		{`{"name": "x", "rule": "round_robin", "instances": [], "steps": [], "policy": {"grey": {}}}`, "grey"},
		{`{"name": "x", "rule": "round_robin", "instances": [{"id": "a", "wieght": 1}], "steps": []}`, "wieght"},
		{`{"name": "x", "rule": "round_robin", "instances": [], "steps": [{"drwa": 7}]}`, "drwa"},
		{`{"name": "x", "rule": "round_robin", "instances": [], "steps": [{"calls": 1, "expect": {"count": {"a": 1}}}]}`, "count"},
	} {
		_, err := decodeScenario([]byte(c.raw))
		if err == nil || !strings.Contains(err.Error(), `"`+c.key+`"`) {
			t.Errorf("%s: %v, want an error naming %q", c.raw, err, c.key)
		}
	}
	sc, err := decodeScenario([]byte(`{"name": "x", "rule": "round_robin", "instances": [], "policy": {"gray": {"unversioned": 2, "versions": {"v2": 1}}},
		"steps": [{"draw": 7}, {"calls": 1, "expect": {"counts": {"a": 1}}}]}`))
	if err != nil || sc.Policy == nil || sc.Steps[0].Draw != 7 || sc.Steps[1].Expect.Counts["a"] != 1 {
		t.Fatalf("a valid scenario: %+v, %v", sc, err)
	}
}

// rotation fails when a call carries a ticket drawn out of band before the step, as a channel
// counting tickets of its own from 0 would send, even though that ticket maps to the instance.
func TestRotationRefusesTicketsDrawnOutOfBand(t *testing.T) {
	ids := []string{"a", "b", "c"}
	var calls []echo.Call
	for ticket := int64(7); ticket < 13; ticket++ {
		calls = append(calls, echo.Call{Instance: ids[ticket%3], Ticket: ticket})
	}
	if err := checkRotation("round_robin", ids, nil, 7, calls); err != nil {
		t.Fatalf("tickets 7..12 after 7 drawn: %v", err)
	}
	low := append([]echo.Call{{Instance: "c", Ticket: 5}}, calls...)
	err := checkRotation("round_robin", ids, nil, 7, low)
	if err == nil || !strings.Contains(err.Error(), "ticket 5, one of the 7 tickets drawn out of band") {
		t.Fatalf("ticket 5 after 7 drawn: %v", err)
	}
	results := make([]echo.Result, len(low))
	for i, c := range low {
		results[i] = echo.Result{Instance: c.Instance}
	}
	if err := checkExpect("round_robin", &expectInfo{Rotation: ids}, nil, 7, results, low); err == nil {
		t.Fatal("the rotation expectation held with ticket 5 after 7 drawn")
	}
	if err := checkExpect("round_robin", &expectInfo{Rotation: ids}, nil, 5, results, low); err != nil {
		t.Fatalf("ticket 5 after 5 drawn: %v", err)
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
		err := checkExpect("round_robin", &expectInfo{Counts: c.counts}, nil, 0, results, calls)
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
		err := checkExpect("round_robin", &expectInfo{Only: only, Balanced: true}, nil, 0, reached, calls)
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("%v: %v", c.counts, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("%v: %v, want an error with %q", c.counts, err, c.fails)
		}
	}
}
