package xds

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// expect is a calls step's expectations (../channel/README.md, plus codes).
type expect struct {
	Failures      *int     `json:"failures"`
	ErrorContains string   `json:"error_contains"`
	Codes         []string `json:"codes"`
	Only          []string `json:"only"`
	Never         []string `json:"never"`
	Spread        bool     `json:"spread"`
	// Counts: exactly this many calls reached each id, and none reached another.
	Counts map[string]int `json:"counts"`
	// Balanced: every id in Only answered, and the counts differ by at most max(2, N/10).
	Balanced bool `json:"balanced"`
	// Rotation (rota_policy scenarios only): every call carried a ticket, no ticket came twice
	// (across all the step's consumers), and each reached the instance of these ids (in id
	// order) that the service's rule maps its ticket to.
	Rotation []string `json:"rotation"`
	// Keyed: all answered calls that carried the same x-rota-key (the step's keys) reached one
	// instance, across the step's consumers.
	Keyed bool `json:"keyed"`
}

// codeName is a status code's canonical name, as the scenarios write it (UNAVAILABLE, …).
func codeName(err error) string { return code.Code(status.Code(err)).String() }

// checkExpect checks a calls step's expectations against what the consumers saw (results)
// and what the instances answered (calls).
func checkExpect(e *expect, rule string, results []result, calls []echo.Call) error {
	if e == nil {
		return nil
	}
	failures := 0
	var reached []string
	for _, r := range results {
		if r.err == nil {
			reached = append(reached, r.instance)
			continue
		}
		failures++
		if e.ErrorContains != "" && !strings.Contains(status.Convert(r.err).Message(), e.ErrorContains) {
			return fmt.Errorf("a call failed with %v, which does not mention %q", r.err, e.ErrorContains)
		}
		if len(e.Codes) > 0 && !slices.Contains(e.Codes, codeName(r.err)) {
			return fmt.Errorf("a call failed with %s, not one of %v: %v", codeName(r.err), e.Codes, r.err)
		}
	}
	if e.Failures != nil && failures != *e.Failures {
		// Each distinct error once, with how many calls it failed.
		counts := map[string]int{}
		var msgs []string
		for _, r := range results {
			if r.err != nil {
				if counts[r.err.Error()]++; counts[r.err.Error()] == 1 {
					msgs = append(msgs, r.err.Error())
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
	got := map[string]int{}
	for _, id := range reached {
		got[id]++
		if len(e.Only) > 0 && !slices.Contains(e.Only, id) {
			return fmt.Errorf("a call reached %s, outside %v: %v", id, e.Only, got)
		}
		if slices.Contains(e.Never, id) {
			return fmt.Errorf("a call reached %s", id)
		}
	}
	if e.Counts != nil {
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
	if e.Spread || e.Balanced {
		if len(e.Only) == 0 {
			return fmt.Errorf("spread and balanced need only")
		}
		for _, id := range e.Only {
			if got[id] == 0 {
				return fmt.Errorf("%s answered no call: %v", id, got)
			}
		}
	}
	if len(e.Rotation) > 0 {
		if err := checkRotation(rule, e.Rotation, calls); err != nil {
			return err
		}
	}
	if e.Keyed {
		if err := checkKeyed(results); err != nil {
			return err
		}
	}
	if e.Balanced {
		most, fewest := 0, len(reached)
		for _, id := range e.Only {
			most, fewest = max(most, got[id]), min(fewest, got[id])
		}
		if bound := max(2, len(reached)/10); most-fewest > bound {
			return fmt.Errorf("calls per instance %v differ by %d, more than %d", got, most-fewest, bound)
		}
	}
	return nil
}

// checkKeyed: every answered call carried a key, and all answered calls with the same key
// reached one instance. The error names the first keys (in key order) that reached more than
// one, with their calls per instance.
func checkKeyed(results []result) error {
	byKey := map[string]map[string]int{}
	answered := 0
	for _, r := range results {
		if r.err != nil {
			continue
		}
		if r.key == "" {
			return fmt.Errorf("keyed: a call to %s carried no key", r.instance)
		}
		answered++
		if byKey[r.key] == nil {
			byKey[r.key] = map[string]int{}
		}
		byKey[r.key][r.instance]++
	}
	if answered == 0 {
		return fmt.Errorf("keyed: no call was answered")
	}
	var split []string
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		if len(byKey[key]) > 1 {
			split = append(split, fmt.Sprintf("%s reached %v", key, byKey[key]))
		}
	}
	if len(split) > 0 {
		shown := strings.Join(split[:min(len(split), 5)], "; ")
		if len(split) > 5 {
			shown += "; …"
		}
		return fmt.Errorf("keyed: %d of %d keys reached more than one instance: %s", len(split), len(byKey), shown)
	}
	return nil
}

// checkRotation: every call has a distinct ticket and reached the instance rule maps it to
// among ids in id order, as rota maps a lease's tickets (round_robin: ticket mod n;
// repeat(n=N): ticket / N mod n). Only those rules are checked here.
func checkRotation(rule string, ids []string, calls []echo.Call) error {
	sorted := slices.Sorted(slices.Values(ids))
	run := uint64(1)
	switch {
	case rule == "round_robin":
	case rule == "repeat":
		run = 3
	case strings.HasPrefix(rule, "repeat(n=") && strings.HasSuffix(rule, ")"):
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(rule, "repeat(n="), ")"), 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("rotation: rule %q", rule)
		}
		run = n
	default:
		return fmt.Errorf("rotation: this runner checks round_robin and repeat, not %q", rule)
	}
	seen := map[int64]string{}
	for _, c := range calls {
		if c.Ticket < 0 {
			return fmt.Errorf("a call to %s carried no ticket", c.Instance)
		}
		if other, dup := seen[c.Ticket]; dup {
			return fmt.Errorf("ticket %d was used twice (%s and %s): the consumers do not share one rotation", c.Ticket, other, c.Instance)
		}
		seen[c.Ticket] = c.Instance
		if want := sorted[(uint64(c.Ticket)/run)%uint64(len(sorted))]; want != c.Instance {
			return fmt.Errorf("ticket %d reached %s; %s over %v maps it to %s", c.Ticket, c.Instance, rule, sorted, want)
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("no call to check")
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

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
