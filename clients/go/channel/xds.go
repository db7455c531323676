package channel

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/serviceconfig"

	rota "github.com/rota-lb/rota/clients/go"
)

// XDSPolicyName is the name rota's xDS clusters give its own load-balancing policy (gRFC A52:
// the part of the TypedStruct's type URL type.googleapis.com/rota.v1.CentralRotation after the
// last "/"). RegisterXDSPolicy registers the channel's policy under it.
const XDSPolicyName = "rota.v1.CentralRotation"

// RegisterXDSPolicy registers the channel's policy with grpc-go under XDSPolicyName, so that an
// xds:///SERVICE channel whose control plane is rota routes its calls by rota's central
// rotation, as a rota:///SERVICE channel does, instead of balancing by itself: rota's clusters
// name this policy first (under wrr_locality), with the service, version and rule to lease;
// a client that has not registered it goes on to the standard policy after it.
//
// rotaTarget is the rota server the policy leases tickets from ("host:port", or any grpc-go
// target). The options that apply are WithTicketHeader, WithReports, WithRotaDialOptions (for
// TLS or per-RPC credentials of the connection to rota), WithLogger and WithBackoff; WithServer,
// WithRule and WithVersion are not read, since each cluster names its service, version and
// rule. Like balancer.Register, it must be called before the channels that use it are created
// (in an init function, or at the start of main), and the last registration wins.
//
// The policy receives the endpoints xDS gives one locality (host:port addresses, not rota's
// instance ids). It leases tickets with Balancer.Lease(service, rule, version), and routes each
// call to the subchannel of the host:port of the instance the ticket's position names; an
// instance xDS did not give (not pushed yet, another locality, unhealthy) is unusable: its
// tickets are passed over and the next leases exclude it, as in a rota:/// channel. While rota
// cannot be reached it routes with a local rotation over the last lease's instances, else over
// the endpoints.
func RegisterXDSPolicy(rotaTarget string, opts ...Option) {
	o := resolverOptions{logger: slog.Default(), backoff: rota.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Factor: 2}}
	for _, opt := range opts {
		opt(&o)
	}
	o.server = rotaTarget
	balancer.Register(xdsBuilder{opts: o})
}

// XDSConfig is the policy's configuration as rota's clusters carry it (the TypedStruct's
// value): {"service": "echo", "version": "", "rule": "round_robin"}. Unknown fields are ignored.
type XDSConfig struct {
	serviceconfig.LoadBalancingConfig `json:"-"`
	// Service is the service whose rotation the policy leases; it must be set.
	Service string `json:"service"`
	// Version is the version leased (empty: the unversioned instances).
	Version string `json:"version"`
	// Rule is the rule leased; empty means the service's policy rule at rota.
	Rule string `json:"rule"`
}

// ParseXDSConfig reads the policy's configuration: a JSON object whose "service" is a
// non-empty string, and whose "version" and "rule", when present, are strings. A config it
// refuses makes grpc-go's xDS client NACK the cluster, so it accepts any other field.
func ParseXDSConfig(raw json.RawMessage) (*XDSConfig, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("rota: the %s config %s is not a JSON object", XDSPolicyName, raw)
	}
	c := &XDSConfig{}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"service", &c.Service}, {"version", &c.Version}, {"rule", &c.Rule}} {
		v, ok := fields[f.name]
		if !ok || string(v) == "null" {
			continue
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return nil, fmt.Errorf("rota: the %s config's %q is %s, not a string", XDSPolicyName, f.name, v)
		}
	}
	if c.Service == "" {
		return nil, fmt.Errorf("rota: the %s config %s names no service", XDSPolicyName, raw)
	}
	return c, nil
}

type xdsBuilder struct{ opts resolverOptions }

func (xdsBuilder) Name() string { return XDSPolicyName }

func (xdsBuilder) ParseConfig(raw json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	c, err := ParseXDSConfig(raw)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (b xdsBuilder) Build(cc balancer.ClientConn, _ balancer.BuildOptions) balancer.Balancer {
	return &rotaBalancer{cc: cc, subConns: map[string]*subConn{}, xds: &b}
}

// dial opens the policy's own link to rota for service: a connection for leases and one for
// reports, as a rota:/// channel's resolver opens them.
func (b *xdsBuilder) dial(service string) (*link, error) {
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, b.opts.dialOptions...)
	conn, err := grpc.NewClient(b.opts.server, dial...)
	if err != nil {
		return nil, fmt.Errorf("rota: connecting to %s: %w", b.opts.server, err)
	}
	reportConn, err := grpc.NewClient(b.opts.server, dial...)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rota: connecting to %s: %w", b.opts.server, err)
	}
	conn.Connect()
	return newLink(conn, reportConn, service, b.opts), nil
}
