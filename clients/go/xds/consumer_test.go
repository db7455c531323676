package xds

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	// The standard xDS client: registers the xds:/// resolver and the xDS balancers.
	_ "google.golang.org/grpc/xds"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/channel/echopb"
	"github.com/rota-lb/rota/clients/go/internal/rotaproc"
)

// consumerEnv, when set, makes the test binary a consumer process: its value is the target
// (xds:///SERVICE), and GRPC_XDS_BOOTSTRAP names the bootstrap file.
const consumerEnv = "ROTA_XDS_CONSUMER"

// policyEnv, when set in a consumer process, is the rota server its rota policy leases from:
// the process registers channel.RegisterXDSPolicy with it (x-rota-ticket on) before it dials.
const policyEnv = "ROTA_XDS_POLICY_SERVER"

// staticScheme is the scheme of a consumer target without xDS: static:///HOST:PORT,HOST:PORT,…
// is a channel over exactly those addresses (grpc-go's manual resolver, one endpoint each)
// under grpc-go's round_robin, for the throughput comparison (bench_test.go).
const staticScheme = "static"

// batch is one request to a consumer process: make Calls calls, one after another (call i with
// x-rota-key: keyName(i, Keys) when Keys > 0); or, with DurationMS set, call with Workers
// concurrent callers for that long and answer with one throughputLine.
type batch struct {
	Calls      int    `json:"calls"`
	Version    string `json:"version,omitempty"`
	Keys       int    `json:"keys,omitempty"`
	DeadlineMS int    `json:"deadline_ms"`
	DurationMS int    `json:"duration_ms,omitempty"`
	Workers    int    `json:"workers,omitempty"`
}

// throughputLine is the answer to a timed batch: the calls made by its callers, from the first
// call's start to the last one's end (ElapsedNS).
type throughputLine struct {
	Calls     int64            `json:"calls"`
	Failed    int64            `json:"failed"`
	ElapsedNS int64            `json:"elapsed_ns"`
	Instances map[string]int64 `json:"instances"`
	// FirstError is one failed call's error, when some failed.
	FirstError string `json:"first_error,omitempty"`
}

// callLine is one call's outcome as a consumer process prints it.
type callLine struct {
	// Start is when the call started, in Unix nanoseconds (the wall clock is the machine's, so
	// the runner can compare it with its own).
	Start    int64  `json:"start"`
	Instance string `json:"instance,omitempty"`
	Code     uint32 `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}

// result is one call of a consumer: the instance that answered, or the failure.
type result struct {
	start    time.Time
	instance string
	err      error
	// key is the x-rota-key the call sent, or "" for none.
	key string
}

// keyHeader is the metadata rota's ring_hash routes hash (docs/xds.md).
const keyHeader = "x-rota-key"

// keyName is the key call i of a batch sends among keys keys (clients/conformance/xds/README.md):
// key-(i mod keys), or none when keys is 0.
func keyName(i, keys int) string {
	if keys <= 0 {
		return ""
	}
	return fmt.Sprintf("key-%d", i%keys)
}

// consumerMain runs in a consumer process: one channel to the target through grpc-go's xDS
// client, kept until standard input ends; each batch read from standard input is answered with
// one line per call.
func consumerMain() int {
	if server := os.Getenv(policyEnv); server != "" {
		channel.RegisterXDSPolicy(server, channel.WithTicketHeader(true),
			channel.WithBackoff(rota.Backoff{Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Factor: 2}))
	}
	target := os.Getenv(consumerEnv)
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if addrs, ok := strings.CutPrefix(target, staticScheme+":///"); ok {
		static := manual.NewBuilderWithScheme(staticScheme)
		var state resolver.State
		for _, addr := range strings.Split(addrs, ",") {
			state.Endpoints = append(state.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr}}})
		}
		static.InitialState(state)
		opts = append(opts, grpc.WithResolvers(static), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	defer conn.Close()
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		var b batch
		if err := json.Unmarshal(in.Bytes(), &b); err != nil {
			fmt.Fprintln(os.Stderr, "consumer:", err)
			return 2
		}
		if b.DurationMS > 0 {
			line := timedCalls(conn, max(b.Workers, 1), time.Duration(b.DurationMS)*time.Millisecond, time.Duration(b.DeadlineMS)*time.Millisecond)
			if err := enc.Encode(line); err != nil {
				fmt.Fprintln(os.Stderr, "consumer:", err)
				return 2
			}
		}
		for i := 0; i < b.Calls; i++ {
			ctx := context.Background()
			if key := keyName(i, b.Keys); key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, keyHeader, key)
			}
			start := time.Now()
			r := echo.Calls(ctx, conn, 1, b.Version, time.Duration(b.DeadlineMS)*time.Millisecond)[0]
			line := callLine{Start: start.UnixNano(), Instance: r.Instance}
			if r.Err != nil {
				st := status.Convert(r.Err)
				line = callLine{Start: start.UnixNano(), Code: uint32(st.Code()), Message: st.Message()}
			}
			if err := enc.Encode(line); err != nil {
				fmt.Fprintln(os.Stderr, "consumer:", err)
				return 2
			}
		}
		if err := out.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "consumer:", err)
			return 2
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	return 0
}

// timedCalls has workers callers make unary Echo calls on conn, each with deadline, one after
// another, until d has passed since the first started.
func timedCalls(conn *grpc.ClientConn, workers int, d, deadline time.Duration) throughputLine {
	client := echopb.NewEchoClient(conn)
	type tally struct {
		calls, failed int64
		instances     map[string]int64
		firstError    string
	}
	tallies := make([]tally, workers)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for w := range tallies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[w]
			tl.instances = map[string]int64{}
			req := &echopb.EchoRequest{Message: "x"}
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				reply, err := client.Echo(ctx, req)
				cancel()
				tl.calls++
				if err != nil {
					if tl.failed++; tl.firstError == "" {
						tl.firstError = err.Error()
					}
					continue
				}
				tl.instances[reply.GetInstanceId()]++
			}
		}()
	}
	wg.Wait()
	line := throughputLine{ElapsedNS: time.Since(start).Nanoseconds(), Instances: map[string]int64{}}
	for _, tl := range tallies {
		line.Calls += tl.calls
		line.Failed += tl.failed
		for id, n := range tl.instances {
			line.Instances[id] += n
		}
		if line.FirstError == "" {
			line.FirstError = tl.firstError
		}
	}
	return line
}

// consumer is a consumer process: the test binary run with consumerEnv set.
type consumer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr *rotaproc.Tail
	// logFile, when not nil, gets the whole log; closed once the process has exited.
	logFile *os.File
	once    sync.Once
	err     error
}

// startConsumer starts a consumer process of target with the bootstrap file; policyServer,
// when not empty, is the rota its rota policy leases from (RegisterXDSPolicy); logFile, when
// not empty, gets all the process writes to its standard error.
func startConsumer(target, bootstrap, policyServer, logFile string) (*consumer, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), consumerEnv+"="+target, "GRPC_XDS_BOOTSTRAP="+bootstrap, policyEnv+"="+policyServer)
	rotaproc.SetParentDeathSignal(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &consumer{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout), stderr: &rotaproc.Tail{Limit: 256 << 10}}
	cmd.Stderr = c.stderr
	if logFile != "" {
		f, err := os.Create(logFile)
		if err != nil {
			return nil, err
		}
		c.logFile = f
		cmd.Stderr = io.MultiWriter(c.stderr, f)
	}
	if err := cmd.Start(); err != nil {
		if c.logFile != nil {
			_ = c.logFile.Close()
		}
		return nil, err
	}
	return c, nil
}

// calls has the process make n calls (call i with the key keyName(i, keys)) and returns their
// outcomes, in order; ctx bounds the wait.
func (c *consumer) calls(ctx context.Context, n int, version string, keys int, deadline time.Duration) ([]result, error) {
	line, err := json.Marshal(batch{Calls: n, Version: version, Keys: keys, DeadlineMS: int(deadline / time.Millisecond)})
	if err != nil {
		return nil, err
	}
	if _, err := c.stdin.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("consumer process: %w", err)
	}
	type answer struct {
		results []result
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		var results []result
		for len(results) < n && c.stdout.Scan() {
			var l callLine
			if err := json.Unmarshal(c.stdout.Bytes(), &l); err != nil {
				done <- answer{nil, fmt.Errorf("consumer process printed %q: %w", c.stdout.Text(), err)}
				return
			}
			r := result{start: time.Unix(0, l.Start), instance: l.Instance, key: keyName(len(results), keys)}
			if l.Instance == "" {
				r.err = status.Error(codes.Code(l.Code), l.Message)
			}
			results = append(results, r)
		}
		if len(results) < n {
			done <- answer{nil, errors.New("consumer process ended its output early")}
			return
		}
		done <- answer{results, nil}
	}()
	select {
	case a := <-done:
		return a.results, a.err
	case <-ctx.Done():
		// The reader goroutine ends when close kills the process.
		return nil, fmt.Errorf("consumer process: %d calls not answered: %w", n, ctx.Err())
	}
}

// timed has the process call with workers concurrent callers for d (each call with deadline)
// and returns its tally; ctx bounds the wait.
func (c *consumer) timed(ctx context.Context, workers int, d, deadline time.Duration) (throughputLine, error) {
	line, err := json.Marshal(batch{DurationMS: int(d / time.Millisecond), Workers: workers, DeadlineMS: int(deadline / time.Millisecond)})
	if err != nil {
		return throughputLine{}, err
	}
	if _, err := c.stdin.Write(append(line, '\n')); err != nil {
		return throughputLine{}, fmt.Errorf("consumer process: %w", err)
	}
	type answer struct {
		line throughputLine
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		if !c.stdout.Scan() {
			done <- answer{err: errors.New("consumer process ended its output early")}
			return
		}
		var l throughputLine
		if err := json.Unmarshal(c.stdout.Bytes(), &l); err != nil {
			done <- answer{err: fmt.Errorf("consumer process printed %q: %w", c.stdout.Text(), err)}
			return
		}
		done <- answer{line: l}
	}()
	select {
	case a := <-done:
		return a.line, a.err
	case <-ctx.Done():
		// The reader goroutine ends when close kills the process.
		return throughputLine{}, fmt.Errorf("consumer process: a timed batch of %v not answered: %w", d, ctx.Err())
	}
}

// close ends the process (its standard input first, then, after a while, a kill) and returns
// an error if it did not exit cleanly; later calls return the same.
func (c *consumer) close() error {
	c.once.Do(func() {
		c.err = c.end()
		if c.logFile != nil {
			_ = c.logFile.Close()
		}
	})
	return c.err
}

func (c *consumer) end() error {
	_ = c.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("consumer process: %w", err)
		}
		return nil
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
		return errors.New("consumer process did not exit within 5s of its input's end")
	}
}

// log is the tail of what the process wrote to its standard error (grpc-go's logs).
func (c *consumer) log() string { return strings.TrimSpace(c.stderr.String()) }
