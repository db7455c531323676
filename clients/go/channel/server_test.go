package channel

import (
	"net/url"
	"testing"

	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
)

// nullClientConn is a resolver.ClientConn that drops what the resolver hands it.
type nullClientConn struct{ resolver.ClientConn }

func (nullClientConn) UpdateState(resolver.State) error { return nil }
func (nullClientConn) ReportError(error)                {}
func (nullClientConn) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{}
}

// The rota server of a channel: the target's authority, else WithServer, else ROTA_SERVER,
// else 127.0.0.1:50051. (The addresses are closed loopback ports: only the choice is checked.)
func TestResolverServerOrder(t *testing.T) {
	for _, c := range []struct {
		name, target, option, env, want string
	}{
		{"authority", "rota://127.0.0.1:1/svc", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:1"},
		{"option", "rota:///svc", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:2"},
		{"environment", "rota:///svc", "", "127.0.0.1:3", "127.0.0.1:3"},
		{"default", "rota:///svc", "", "", "127.0.0.1:50051"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(ServerEnv, c.env)
			u, err := url.Parse(c.target)
			if err != nil {
				t.Fatal(err)
			}
			var opts []Option
			if c.option != "" {
				opts = append(opts, WithServer(c.option))
			}
			r, err := NewResolver(append(opts, WithLogger(quietLogger()))...).Build(resolver.Target{URL: *u}, nullClientConn{}, resolver.BuildOptions{})
			if err != nil {
				t.Fatalf("Build(%s): %v", c.target, err)
			}
			defer r.Close()
			if got := r.(*watchResolver).link.conn.Target(); got != c.want {
				t.Fatalf("rota server %q, want %q", got, c.want)
			}
		})
	}
}
