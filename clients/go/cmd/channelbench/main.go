// Command channelbench compares a rota:///echo channel (the rota policy, leased tickets) with
// the same channel under gRPC's own round_robin policy, over the same three echo instances, in
// alternating rounds of one run; it prints throughput, p99 latency, their ratios and the RPCs
// per Lease call.
//
//	ROTA_BIN=/path/to/rota go run ./cmd/channelbench [-rounds 6] [-round 2s] [-workers 16]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/channel/echopb"
)

func main() {
	rounds := flag.Int("rounds", 6, "rounds per channel (alternating)")
	roundLen := flag.Duration("round", 2*time.Second, "length of one round")
	workers := flag.Int("workers", 16, "concurrent callers")
	bin := flag.String("rota", os.Getenv("ROTA_BIN"), "rota binary (default $ROTA_BIN)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the rounds to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *bin == "" {
		log.Fatal("set -rota or ROTA_BIN")
	}
	addr, stop := startRota(*bin)
	defer stop()

	ctx := context.Background()
	client, err := rota.Dial(ctx, addr, rota.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	for _, id := range []string{"echo-a", "echo-b", "echo-c"} {
		srv, err := echo.Start(id, nil)
		if err != nil {
			log.Fatal(err)
		}
		defer srv.Kill()
		if _, err := client.Register(ctx, rota.Instance{ID: id, Service: "echo", Host: "127.0.0.1", Port: uint32(srv.Addr.Port)}); err != nil {
			log.Fatal(err)
		}
	}

	var leases atomic.Int64
	countLeases := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/rota.v1.Balancer/Lease" {
			leases.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	resolver := channel.NewResolver(channel.WithServer(addr), channel.WithRotaDialOptions(countLeases))
	rotaConn := mustConn(grpc.WithResolvers(resolver))
	defer rotaConn.Close()
	quiet := channel.NewResolver(channel.WithServer(addr), channel.WithReports(false))
	quietConn := mustConn(grpc.WithResolvers(quiet))
	defer quietConn.Close()
	rrConn := mustConn(grpc.WithResolvers(resolver), grpc.WithDisableServiceConfig(),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	defer rrConn.Close()

	// Warm up both channels (connections, first leases).
	round(rotaConn, *workers, 300*time.Millisecond)
	round(rrConn, *workers, 300*time.Millisecond)
	round(quietConn, *workers, 300*time.Millisecond)

	var rotaRuns, rrRuns, quietRuns []result
	var rotaLeases int64
	for i := 0; i < *rounds; i++ {
		before := leases.Load()
		r := round(rotaConn, *workers, *roundLen)
		rotaLeases += leases.Load() - before
		rotaRuns = append(rotaRuns, r)
		rrRuns = append(rrRuns, round(rrConn, *workers, *roundLen))
		quietRuns = append(quietRuns, round(quietConn, *workers, *roundLen))
		fmt.Printf("round %d: rota %6.0f rps p99 %6.0f µs | round_robin %6.0f rps p99 %6.0f µs | rota without reports %6.0f rps p99 %6.0f µs\n",
			i+1, rotaRuns[i].rps, rotaRuns[i].p99, rrRuns[i].rps, rrRuns[i].p99, quietRuns[i].rps, quietRuns[i].p99)
	}
	quietRPS := median(quietRuns, func(r result) float64 { return r.rps })
	quietP99 := median(quietRuns, func(r result) float64 { return r.p99 })
	rotaRPS, rrRPS := median(rotaRuns, func(r result) float64 { return r.rps }), median(rrRuns, func(r result) float64 { return r.rps })
	rotaP99, rrP99 := median(rotaRuns, func(r result) float64 { return r.p99 }), median(rrRuns, func(r result) float64 { return r.p99 })
	var rotaCalls int64
	for _, r := range rotaRuns {
		rotaCalls += r.calls
	}
	fmt.Printf("median: rota %.0f rps, p99 %.0f µs; round_robin %.0f rps, p99 %.0f µs\n", rotaRPS, rotaP99, rrRPS, rrP99)
	fmt.Printf("median: rota without reports %.0f rps, p99 %.0f µs\n", quietRPS, quietP99)
	fmt.Printf("throughput ratio rota/round_robin %.3f; p99 ratio %.3f\n", rotaRPS/rrRPS, rotaP99/rrP99)
	fmt.Printf("throughput ratio rota without reports/round_robin %.3f; p99 ratio %.3f\n", quietRPS/rrRPS, quietP99/rrP99)
	fmt.Printf("leases %d for %d RPCs: %.0f RPCs per Lease\n", rotaLeases, rotaCalls, float64(rotaCalls)/float64(max(rotaLeases, 1)))
}

type result struct {
	rps   float64
	p99   float64 // µs
	calls int64
}

func mustConn(opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient("rota:///echo", append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	return conn
}

// round runs workers callers for d and measures throughput and the 99th percentile latency.
func round(conn *grpc.ClientConn, workers int, d time.Duration) result {
	client := echopb.NewEchoClient(conn)
	var mu sync.Mutex
	var latencies []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(end) {
				t := time.Now()
				if _, err := client.Echo(context.Background(), &echopb.EchoRequest{Message: "x"}); err != nil {
					log.Fatal(err)
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			latencies = append(latencies, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	return result{rps: float64(len(latencies)) / elapsed.Seconds(), p99: float64(p99.Microseconds()), calls: int64(len(latencies))}
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// startRota runs `rota serve` on a free loopback port.
func startRota(bin string) (string, func()) {
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0")
	// No start-up warm-up: the run registers its instances before anything follows them.
	cmd.Env = append(os.Environ(), "ROTA_ADMIN_LISTEN=off", "ROTA_WARMUP=0s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok {
		log.Fatalf("rota serve printed %q", line)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return addr, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
}
