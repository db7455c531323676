package rota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// readmeBlocks returns the body of every ```lang block of README.md, in order.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	rest := string(readme)
	for {
		var block string
		var ok bool
		if _, rest, ok = strings.Cut(rest, "\n```"+lang+"\n"); !ok {
			return blocks
		}
		if block, rest, ok = strings.Cut(rest, "\n```\n"); !ok {
			t.Fatalf("unterminated ```%s block in README.md", lang)
		}
		blocks = append(blocks, block+"\n")
	}
}

// readmeModule is a fresh module outside the repository with this module installed by the
// commands of the README's Install section; run runs a command in it, with env added.
type readmeModule struct {
	t   *testing.T
	dir string
	ctx context.Context
}

func newReadmeModule(t *testing.T, name string) *readmeModule {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is needed to build the README's examples:", err)
	}
	install := readmeBlock(t, "## Install", "sh")
	checkout, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	m := &readmeModule{t: t, dir: t.TempDir(), ctx: testContext(t, 3*time.Minute)}
	m.run(nil, "go", "mod", "init", "example.com/"+name)
	commands := 0
	for _, line := range strings.Split(install, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(strings.ReplaceAll(line, "/path/to/rota/clients/go", checkout))
		m.run(nil, fields[0], fields[1:]...)
		commands++
	}
	if commands != 2 {
		t.Fatalf("expected the two install commands of the README, ran %d", commands)
	}
	return m
}

func (m *readmeModule) run(env []string, name string, args ...string) string {
	m.t.Helper()
	cmd := exec.CommandContext(m.ctx, name, args...)
	cmd.Dir = m.dir
	// A go.work above the temp folder, or flags meant for this module, must not leak in.
	cmd.Env = append(append(os.Environ(), "GOWORK=off", "GOFLAGS="), env...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(m.ctx.Err(), context.DeadlineExceeded) {
			m.t.Fatalf("%s %s: no result within the test's deadline", name, strings.Join(args, " "))
		}
		m.t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

// write puts a program in folder sub of the module.
func (m *readmeModule) write(sub, source string) {
	m.t.Helper()
	dir := filepath.Join(m.dir, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(source), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

// TestReadmeQuickStart installs this module into a fresh module outside the repository with
// the commands of the README's Install section, writes the README's quick start there as
// main.go and runs it against a server of its own.
func TestReadmeQuickStart(t *testing.T) {
	const readmeAddr = "127.0.0.1:50051"
	program := readmeBlock(t, "## Quick start", "go")
	if !strings.Contains(program, `"`+readmeAddr+`"`) {
		t.Fatalf("the quick start does not dial %s", readmeAddr)
	}
	srv := startTestServer(t)
	m := newReadmeModule(t, "quickstart")
	m.write(".", strings.Replace(program, readmeAddr, srv.addr, 1))
	out := m.run(nil, "go", "run", ".")
	if want := "calling 127.0.0.1:8080 (ticket 0)\n"; out != want {
		t.Fatalf("the quick start printed %q, want %q", out, want)
	}
}

// TestReadmeWatch runs the README's watch example as written, with ROTA_SERVER naming a
// server of its own.
func TestReadmeWatch(t *testing.T) {
	program := readmeBlock(t, "## Watching a service", "go")
	srv := startTestServer(t)
	m := newReadmeModule(t, "watch")
	m.write(".", program)
	lines := strings.Split(strings.TrimSpace(m.run([]string{ServerEnv + "=" + srv.addr}, "go", "run", ".")), "\n")
	if len(lines) != 7 || lines[0] != "snapshot: 0 instances" {
		t.Fatalf("the watch example printed %q, want a snapshot and six events", lines)
	}
	got := slices.Clone(lines[1:])
	slices.Sort(got)
	want := []string{
		"added inventory-a (weight 300)", "added inventory-b (weight 100)", "added inventory-c (weight 0)",
		"removed inventory-a", "removed inventory-b", "removed inventory-c",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the watch example printed %q, want %q", lines, want)
	}
	for i, line := range lines[1:4] {
		if !strings.HasPrefix(line, "added ") {
			t.Fatalf("line %d is %q: the additions come before the removals", i+2, line)
		}
	}
}

// TestReadmeExamplesCompile builds every Go block of the README, each a complete program, in
// a fresh module set up by the README's install commands.
func TestReadmeExamplesCompile(t *testing.T) {
	blocks := readmeBlocks(t, "go")
	if len(blocks) < 3 {
		t.Fatalf("README.md has %d Go blocks, expected at least 3", len(blocks))
	}
	m := newReadmeModule(t, "examples")
	for i, block := range blocks {
		if !strings.HasPrefix(block, "package main\n") {
			t.Fatalf("Go block %d of README.md is not a complete program:\n%s", i+1, block)
		}
		m.write(fmt.Sprintf("example%d", i+1), block)
	}
	m.run(nil, "go", "vet", "./...")
}
