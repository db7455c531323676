package channel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	rota "github.com/rota-lb/rota/clients/go"
)

func TestMain(m *testing.M) {
	if os.Getenv(consumerEnv) != "" {
		os.Exit(consumerMain())
	}
	// Servers die with the test process (parent-death signal, tied to the starting thread).
	runtime.LockOSThread()
	os.Exit(m.Run())
}

// rotaServer is one `rota serve` process on a loopback port.
type rotaServer struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRota runs `rota serve` on listen (127.0.0.1:0 for a free port), stopped when the test
// ends.
func startRota(t *testing.T, listen string) *rotaServer {
	t.Helper()
	bin := os.Getenv("ROTA_BIN")
	if bin == "" {
		root, _ := filepath.Abs(filepath.Join("..", "..", ".."))
		bin = filepath.Join(root, "target", "debug", "rota")
	}
	cmd := exec.Command(bin, "serve", "--listen", listen)
	// No start-up warm-up: the run registers its instances before anything follows them.
	cmd.Env = append(os.Environ(), "ROTA_ADMIN_LISTEN=off", "ROTA_WARMUP=0s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s (set ROTA_BIN): %v", bin, err)
	}
	s := &rotaServer{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.stop)
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case line := <-lines:
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
		if !ok {
			t.Fatalf("rota serve printed %q", line)
		}
		s.addr = addr
	case <-time.After(30 * time.Second):
		t.Fatal("rota serve printed no address within 30s")
	}
	return s
}

// stop kills the server and waits for it to exit.
func (s *rotaServer) stop() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

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
