package channel

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/internal/rotaproc"
)

func TestMain(m *testing.M) {
	if os.Getenv(consumerEnv) != "" {
		os.Exit(consumerMain())
	}
	// Servers die with the test process (parent-death signal, tied to the starting thread).
	runtime.LockOSThread()
	os.Exit(m.Run())
}

// rotaServer is one `rota serve` process on a loopback port (internal/rotaproc, shared with
// the xDS conformance runner).
type rotaServer struct {
	addr string
	proc *rotaproc.Server
}

// startRota runs `rota serve` on listen (127.0.0.1:0 for a free port), stopped when the test
// ends.
func startRota(t *testing.T, listen string) *rotaServer {
	t.Helper()
	proc, err := rotaproc.Start(rotaproc.Binary(filepath.Join("..", "..", "..")), listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Stop)
	return &rotaServer{addr: proc.Addr, proc: proc}
}

// stop kills the server and waits for it to exit.
func (s *rotaServer) stop() { s.proc.Stop() }

// restartRota starts a new server on the address of a stopped one.
func restartRota(t *testing.T, old *rotaServer) *rotaServer {
	t.Helper()
	// The port was just released; binding it again is immediate on Linux (SO_REUSEADDR).
	return startRota(t, old.addr)
}

func quietLogger() *slog.Logger { return slog.New(discardHandler{}) }

// dialRota connects a rota client (for registrations and unary picks).
func dialRota(t *testing.T, addr string) *rota.Client {
	t.Helper()
	c, err := rota.Dial(context.Background(), addr,
		rota.WithLogger(quietLogger()),
		rota.WithBackoff(rota.Backoff{Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Factor: 2}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond every 5 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var _ = fmt.Sprintf
