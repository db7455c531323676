package xds

import (
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchEnv, set to 1, runs TestXDSThroughput; the normal test run skips it.
const benchEnv = "ROTA_XDS_BENCH"

// TestXDSThroughput compares the throughput of grpc-go's standard xDS client (xds:///echo, rota
// as its control plane, the standard policy rota gives a round_robin service: wrr_locality over
// round_robin) with the same client over a static list of the same three echo servers under
// grpc-go's round_robin (static:///…, no xDS), in alternating rounds of one run: xds, static,
// xds, static, … Both are consumer processes of this binary, each with its own channel and the
// same concurrent callers, alive for the whole run; the echo servers, rota and the
// registrations are the scenarios' (startWorld). It prints calls/s per round and overall and
// the ratio xds/static; it fails on a failed call or on a channel that does not reach all
// three servers, not on the ratio.
//
//	ROTA_XDS_BENCH=1 ROTA_BIN=/abs/path/to/release/rota go test -run '^TestXDSThroughput$' -count=1 -v .
//
// ROTA_XDS_BENCH_ROUNDS (rounds per channel, at least 3; 5), ROTA_XDS_BENCH_ROUND (length of a
// round; 3s) and ROTA_XDS_BENCH_WORKERS (concurrent callers per channel; 16) change the run.
func TestXDSThroughput(t *testing.T) {
	if os.Getenv(benchEnv) != "1" {
		t.Skip("a benchmark: set " + benchEnv + "=1 to run it")
	}
	rounds := envInt(t, "ROTA_XDS_BENCH_ROUNDS", 5)
	workers := envInt(t, "ROTA_XDS_BENCH_WORKERS", 16)
	roundLen := envDuration(t, "ROTA_XDS_BENCH_ROUND", 3*time.Second)
	if rounds < 3 || workers < 1 || roundLen < 100*time.Millisecond {
		t.Fatalf("rounds %d (at least 3), workers %d (at least 1), round %v (at least 100ms)", rounds, workers, roundLen)
	}
	const deadline = 5 * time.Second
	warmupLen := min(roundLen, time.Second)
	// Start-up and readiness, the warm-up rounds, then every round with its slack.
	bound := time.Minute + 2*(warmupLen+deadline) + time.Duration(2*rounds)*(roundLen+deadline)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)

	sc, err := decodeScenario([]byte(`{"name": "throughput", "instances": [{"id": "echo-a"}, {"id": "echo-b"}, {"id": "echo-c"}], "steps": []}`))
	if err != nil {
		t.Fatal(err)
	}
	r := startWorld(ctx, t, sc)
	ids := slices.Sorted(maps.Keys(r.servers))
	addrs := make([]string, len(ids))
	for i, id := range ids {
		addrs[i] = r.servers[id].Addr.String()
	}
	type channel struct {
		name     string
		consumer *consumer
	}
	channels := []channel{
		{"xds", r.startConsumer()},
		{"static", r.startConsumerOf(staticScheme + ":///" + strings.Join(addrs, ","))},
	}

	// Ready: each channel has answered from all three servers (calls in batches until it has,
	// within 30 s), then one warm-up round each, not counted.
	for _, ch := range channels {
		readyCtx, readyCancel := context.WithTimeout(ctx, 30*time.Second)
		seen := map[string]bool{}
		for len(seen) < len(ids) {
			results, err := ch.consumer.calls(readyCtx, 30, "", 0, deadline)
			if err != nil {
				readyCancel()
				t.Fatalf("%s: not answering from all of %v (answered from %v): %v", ch.name, ids, seen, err)
			}
			for _, res := range results {
				if res.err == nil {
					seen[res.instance] = true
				}
			}
		}
		readyCancel()
		if _, err := r.timedRound(ctx, ch.consumer, ids, workers, warmupLen, deadline); err != nil {
			t.Fatalf("%s warm-up: %v", ch.name, err)
		}
	}

	fmt.Printf("grpc-go xds:///echo against static:/// (round_robin) over the same 3 echo servers: "+
		"%d rounds of %v each, alternating, %d concurrent callers per channel, %d CPUs\n", rounds, roundLen, workers, runtime.NumCPU())
	var totals [2]throughputLine
	ratios := make([]float64, 0, rounds)
	for i := 0; i < rounds; i++ {
		var rates [2]float64
		var spread [2]string
		for c, ch := range channels {
			line, err := r.timedRound(ctx, ch.consumer, ids, workers, roundLen, deadline)
			if err != nil {
				t.Fatalf("round %d, %s: %v", i+1, ch.name, err)
			}
			totals[c].Calls += line.Calls
			totals[c].ElapsedNS += line.ElapsedNS
			rates[c] = callsPerSecond(line)
			parts := make([]string, len(ids))
			for k, id := range ids {
				parts[k] = strconv.FormatInt(line.Instances[id], 10)
			}
			spread[c] = strings.Join(parts, "/")
		}
		ratios = append(ratios, rates[0]/rates[1])
		fmt.Printf("round %d: xds %8.0f calls/s (%s) | static %8.0f calls/s (%s) | xds/static %.3f\n",
			i+1, rates[0], spread[0], rates[1], spread[1], ratios[i])
	}
	xds, static := callsPerSecond(totals[0]), callsPerSecond(totals[1])
	overall := xds / static
	fmt.Printf("overall: xds %.0f calls/s (%d calls), static %.0f calls/s (%d calls), xds/static %.3f; median of the rounds' ratios %.3f\n",
		xds, totals[0].Calls, static, totals[1].Calls, overall, median(ratios))
	verdict := "met"
	if overall < 0.95 {
		verdict = "NOT met"
	}
	fmt.Printf("target xds/static >= 0.95: %s\n", verdict)
}

// timedRound runs one timed batch on c and checks it: no call failed, every server answered,
// and the servers counted as many calls as the consumer saw answered.
func (r *run) timedRound(ctx context.Context, c *consumer, ids []string, workers int, d, deadline time.Duration) (throughputLine, error) {
	before := make(map[string]int, len(ids))
	for _, id := range ids {
		before[id] = r.servers[id].Count()
	}
	waitCtx, cancel := context.WithTimeout(ctx, d+2*deadline)
	defer cancel()
	line, err := c.timed(waitCtx, workers, d, deadline)
	if err != nil {
		return line, err
	}
	if line.Failed > 0 {
		return line, fmt.Errorf("%d of %d calls failed, one with: %s", line.Failed, line.Calls, line.FirstError)
	}
	for _, id := range ids {
		if line.Instances[id] == 0 {
			return line, fmt.Errorf("%s answered none of %d calls: %v", id, line.Calls, line.Instances)
		}
		if got := int64(r.servers[id].Count() - before[id]); got != line.Instances[id] {
			return line, fmt.Errorf("%s counted %d calls, the consumer saw %d answered by it", id, got, line.Instances[id])
		}
	}
	return line, nil
}

func callsPerSecond(l throughputLine) float64 {
	return float64(l.Calls) / (float64(l.ElapsedNS) / float64(time.Second))
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}
