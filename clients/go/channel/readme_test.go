package channel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// readmeBlock returns the first ```lang block after heading in ../README.md.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q heading", heading)
	}
	_, block, ok := strings.Cut(section, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md has no ```%s block under %q", lang, heading)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatalf("unterminated ```%s block under %q", lang, heading)
	}
	return block + "\n"
}

// TestReadmeChannel installs the module into a fresh module outside the repository with the
// README's install commands and runs the README's channel example against three echo
// instances registered as "orders": a fresh rotation visits them in id order.
func TestReadmeChannel(t *testing.T) {
	program := readmeBlock(t, "## gRPC channels", "go")
	install := readmeBlock(t, "## Install", "sh")
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	srv := startRota(t, "127.0.0.1:0")
	client := dialRota(t, srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, id := range []string{"orders-a", "orders-b", "orders-c"} {
		e, err := echo.Start(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Kill)
		if _, err := client.Register(ctx, rota.Instance{ID: id, Service: "orders", Host: "127.0.0.1", Port: uint32(e.Addr.Port)}); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", ServerEnv+"="+srv.addr)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("%s %s: no result within the test's deadline", name, strings.Join(args, " "))
			}
			t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), stderr.String())
		}
		return out.String()
	}
	run("go", "mod", "init", "example.com/channelexample")
	commands := 0
	for _, line := range strings.Split(install, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(strings.ReplaceAll(line, "/path/to/rota/clients/go", checkout))
		run(fields[0], fields[1:]...)
		commands++
	}
	if commands != 2 {
		t.Fatalf("expected the two install commands of the README, ran %d", commands)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run("go", "run", "."); out != "orders-a\norders-b\norders-c\n" {
		t.Fatalf("the README example printed %q, want orders-a, orders-b, orders-c", out)
	}
}
