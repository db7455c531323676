// Package rotaproc runs `rota serve` processes on loopback ports for the Go client's channel
// tests and its xDS conformance runner (clients/go/xds, a module of its own under this tree).
package rotaproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Binary is $ROTA_BIN, or else target/debug/rota under root (the repository's root).
func Binary(root string) string {
	if bin := os.Getenv("ROTA_BIN"); bin != "" {
		return bin
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		abs = root
	}
	return filepath.Join(abs, "target", "debug", "rota")
}

// Server is one `rota serve` process.
type Server struct {
	// Addr is the address rota printed it listens on (host:port).
	Addr string
	// Admin is the address of its admin listener (HTTP, host:port); empty when it is off.
	Admin string
	cmd   *exec.Cmd
	done  chan struct{}
	log   *Tail
	once  sync.Once
}

// Options are the settings of a `rota serve` beyond its listen address.
type Options struct {
	// Warmup is rota's start-up warm-up (ROTA_WARMUP); zero for none.
	Warmup time.Duration
	// Admin turns the admin listener on, on a free loopback port (ROTA_ADMIN_LISTEN=127.0.0.1:0);
	// its address is then Server.Admin. Off by default.
	Admin bool
	// Args are more arguments of `rota serve` (e.g. --config, --tls-cert).
	Args []string
}

// Start runs `bin serve --listen listen` (127.0.0.1:0 for a free port) with its admin listener
// off and no start-up warm-up (the callers register their instances before anything follows
// them), and reads the bound address from the first line of its output. The process gets
// SIGKILL when the thread that started it exits (Linux), so it dies with its test binary.
func Start(bin, listen string) (*Server, error) {
	return StartWith(bin, listen, Options{})
}

// StartWithWarmup is Start with rota's start-up warm-up set to warmup (ROTA_WARMUP): for a
// restarted rota, which then withholds a service it has not seen yet rather than reporting it
// absent, while the providers register again.
func StartWithWarmup(bin, listen string, warmup time.Duration) (*Server, error) {
	return StartWith(bin, listen, Options{Warmup: warmup})
}

// StartWith is Start with the settings of opts. With the admin listener on, rota prints its
// address on the second line (`admin on ADDR`, written with the first).
func StartWith(bin, listen string, opts Options) (*Server, error) {
	admin := "off"
	if opts.Admin {
		admin = "127.0.0.1:0"
	}
	cmd := exec.Command(bin, append([]string{"serve", "--listen", listen}, opts.Args...)...)
	cmd.Env = append(os.Environ(), "ROTA_ADMIN_LISTEN="+admin, fmt.Sprintf("ROTA_WARMUP=%dms", opts.Warmup.Milliseconds()))
	SetParentDeathSignal(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s := &Server{cmd: cmd, done: make(chan struct{}), log: &Tail{Limit: 64 << 10}}
	cmd.Stderr = s.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (set ROTA_BIN): %w", bin, err)
	}
	go func() { _ = cmd.Wait(); close(s.done) }()
	want := 1
	if opts.Admin {
		want = 2
	}
	lines := make(chan []string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		var read []string
		for len(read) < want {
			line, err := r.ReadString('\n')
			read = append(read, line)
			if err != nil {
				break
			}
		}
		lines <- read
		_, _ = io.Copy(io.Discard, r) // keep the pipe drained
	}()
	select {
	case read := <-lines:
		addr, ok := strings.CutPrefix(strings.TrimSpace(read[0]), "listening on ")
		if !ok {
			s.Stop()
			return nil, fmt.Errorf("rota serve printed %q; log:\n%s", read[0], s.Log())
		}
		s.Addr = addr
		if opts.Admin {
			second := ""
			if len(read) > 1 {
				second = read[1]
			}
			admin, ok := strings.CutPrefix(strings.TrimSpace(second), "admin on ")
			if !ok {
				s.Stop()
				return nil, fmt.Errorf("rota serve printed %q after its address, not its admin address; log:\n%s", second, s.Log())
			}
			s.Admin = admin
		}
		return s, nil
	case <-time.After(30 * time.Second):
		s.Stop()
		return nil, fmt.Errorf("rota serve printed no address within 30s; log:\n%s", s.Log())
	}
}

// Stop kills the server (SIGKILL) and waits for it to exit; later calls return at once.
func (s *Server) Stop() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
}

// Log is the tail of what the server wrote to its standard error.
func (s *Server) Log() string { return s.log.String() }

// Tail is an io.Writer that keeps the last Limit bytes written to it (a process's log).
type Tail struct {
	Limit int
	mu    sync.Mutex
	buf   []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.Limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String is what the tail holds.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
