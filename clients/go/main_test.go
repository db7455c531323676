package rota

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// rotaAddr is the address of the rota server shared by the tests (started by TestMain).
var rotaAddr string

// rotaBin is the server binary, for tests that start their own server.
var rotaBin string

func TestMain(m *testing.M) {
	// Servers are started with a parent-death signal, which Linux ties to the starting
	// thread: keep TestMain on one thread so that the shared server dies with the tests
	// even when they crash.
	runtime.LockOSThread()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	bin, err := serverBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rota tests:", err)
		return 1
	}
	rotaBin = bin
	srv, err := startServer(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rota tests:", err)
		return 1
	}
	rotaAddr = srv.addr
	code := m.Run()
	if err := srv.kill(); err != nil {
		fmt.Fprintln(os.Stderr, "rota tests: stopping the server:", err)
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "rota tests: server log (tail):\n%s\n", srv.log.String())
	}
	return code
}

// serverBinary returns $ROTA_BIN, or builds the server with cargo in the repository root.
func serverBinary() (string, error) {
	if bin := os.Getenv("ROTA_BIN"); bin != "" {
		if !filepath.IsAbs(bin) {
			return "", fmt.Errorf("ROTA_BIN must be an absolute path, got %q", bin)
		}
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("ROTA_BIN: %w", err)
		}
		return bin, nil
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "Cargo.toml")); err != nil {
		return "", fmt.Errorf("ROTA_BIN is unset and %s is not the rota repository: %w", root, err)
	}
	cmd := exec.Command("cargo", "build", "--bin", "rota")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("cargo build --bin rota: %w", err)
	}
	return filepath.Join(root, "target", "debug", "rota"), nil
}

// server is one running `rota serve` process.
type server struct {
	addr string
	cmd  *exec.Cmd
	log  *tailBuffer
	once sync.Once
	err  error
}

// startServer runs `rota serve --listen 127.0.0.1:0` plus args and reads the bound address
// from the first line of its output.
func startServer(bin string, args ...string) (*server, error) {
	return startServerOn(bin, "127.0.0.1:0", args...)
}

// startServerOn runs `rota serve --listen listen` plus args (listen is a loopback address;
// port 0 picks a free one) and reads the bound address from the first line of its output.
func startServerOn(bin, listen string, args ...string) (*server, error) {
	cmd := exec.Command(bin, append([]string{"serve", "--listen", listen}, args...)...)
	// No start-up warm-up unless args ask for one (a flag wins over the environment): these
	// servers start empty, and a service never registered is NOT_FOUND at once. A server
	// without the setting ignores the variable.
	cmd.Env = append(os.Environ(), "ROTA_WARMUP="+cmp.Or(os.Getenv("ROTA_WARMUP"), "0s"))
	setParentDeathSignal(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	log := &tailBuffer{limit: 64 << 10}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &server{cmd: cmd, log: log}
	lines := make(chan string, 1)
	go func() {
		reader := bufio.NewReader(stdout)
		line, err := reader.ReadString('\n')
		if err != nil {
			line = ""
		}
		lines <- line
		_, _ = io.Copy(io.Discard, reader) // keep the pipe drained
	}()
	select {
	case line := <-lines:
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
		if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
			_ = s.kill()
			return nil, fmt.Errorf("rota serve printed %q as its first line; log:\n%s", line, log.String())
		}
		s.addr = addr
		return s, nil
	case <-time.After(30 * time.Second):
		_ = s.kill()
		return nil, fmt.Errorf("rota serve printed no address within 30s; log:\n%s", log.String())
	}
}

// startTestServer starts a server of the test's own, killed when the test ends.
func startTestServer(t *testing.T, args ...string) *server {
	t.Helper()
	return startTestServerOn(t, "127.0.0.1:0", args...)
}

// startTestServerOn starts a server of the test's own on listen, killed when the test ends.
func startTestServerOn(t *testing.T, listen string, args ...string) *server {
	t.Helper()
	s, err := startServerOn(rotaBin, listen, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.kill() })
	return s
}

// kill stops the server at once (SIGKILL) and waits for it to exit.
func (s *server) kill() error {
	return s.stop(os.Kill, 0)
}

// stop sends sig to the server and waits for it to exit; after grace (when positive) it
// kills the server instead and reports that it had not exited.
func (s *server) stop(sig os.Signal, grace time.Duration) error {
	s.once.Do(func() {
		if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			s.err = err
			return
		}
		exited := make(chan struct{})
		go func() {
			_ = s.cmd.Wait() // "signal: killed" or "terminated" are expected outcomes
			close(exited)
		}()
		if grace <= 0 {
			<-exited
			return
		}
		select {
		case <-exited:
		case <-time.After(grace):
			_ = s.cmd.Process.Kill()
			<-exited
			s.err = fmt.Errorf("rota did not exit within %s of %v", grace, sig)
		}
	})
	return s.err
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	mu    sync.Mutex
	limit int
	buf   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// testContext is bounded by d and by the test.
func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dial connects a client to addr, closed when the test ends. It reconnects quickly and
// logs nothing, unless opts say otherwise.
func dial(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	defaults := []Option{
		WithBackoff(Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond}),
		WithLogger(slog.New(discardHandler{})),
	}
	c, err := Dial(context.Background(), addr, append(defaults, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// eventually polls cond every 10 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
