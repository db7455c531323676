package rota

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
)

// readmeBlock returns the body of the first ```lang block after heading in README.md.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
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
		t.Fatalf("unterminated ```%s block under %q in README.md", lang, heading)
	}
	return block + "\n"
}

// TestReadmeQuickStart installs this module into a fresh module outside the repository with
// the commands of the README's Install section, writes the README's quick start there as
// main.go and runs it against a server of its own.
func TestReadmeQuickStart(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is needed to build the quick start:", err)
	}
	const readmeAddr = "127.0.0.1:50051"
	program := readmeBlock(t, "## Quick start", "go")
	if !strings.Contains(program, `"`+readmeAddr+`"`) {
		t.Fatalf("the quick start does not dial %s", readmeAddr)
	}
	install := readmeBlock(t, "## Install", "sh")
	checkout, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}

	srv := startTestServer(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		// A go.work above the temp folder, or flags meant for this module, must not leak in.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
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

	run("go", "mod", "init", "example.com/quickstart")
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
	source := strings.Replace(program, readmeAddr, srv.addr, 1)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run("go", "run", ".")
	if want := "calling 127.0.0.1:8080 (ticket 0)\n"; out != want {
		t.Fatalf("the quick start printed %q, want %q", out, want)
	}
}
