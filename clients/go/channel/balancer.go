package channel

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"
)

// PolicyName is the name of the load-balancing policy in service configs.
const PolicyName = "rota"

// Config is the policy's service-config entry: {"rota": {"rule": "repeat(n=3)", "version": "v2"}}.
type Config struct {
	serviceconfig.LoadBalancingConfig `json:"-"`
	// Rule is the rule leases name; empty means the service's policy rule at rota. It must be
	// one rota can lease: round_robin, repeat(n=N) or weighted.
	Rule string `json:"rule,omitempty"`
	// Version applies to calls whose metadata names no version.
	Version string `json:"version,omitempty"`
	// Report, when false, turns off the reporting of call outcomes (default true). Outcomes
	// feed rota's fleet statistics and breakers; the leasable rules do not read them.
	Report *bool `json:"report,omitempty"`
	// TicketHeader, when true, adds each call's ticket as x-rota-ticket metadata (default
	// false: it costs bytes on every call; see TicketHeader).
	TicketHeader bool `json:"ticketHeader,omitempty"`
}

func init() {
	balancer.Register(builder{})
}

type builder struct{}

func (builder) Name() string { return PolicyName }

func (builder) ParseConfig(raw json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("rota: bad policy config %s: %w", raw, err)
	}
	if c.Rule != "" {
		name := c.Rule
		if i := indexByte(name, '('); i >= 0 {
			name = name[:i]
		}
		if name != "round_robin" && name != "repeat" && name != "weighted" {
			return nil, fmt.Errorf("rota: rule %q cannot be leased; use round_robin, repeat(n=N) or weighted", c.Rule)
		}
	}
	return &c, nil
}

func indexByte(s string, b byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return i
		}
	}
	return -1
}

func (builder) Build(cc balancer.ClientConn, _ balancer.BuildOptions) balancer.Balancer {
	return &rotaBalancer{cc: cc, subConns: map[string]*subConn{}}
}

// subConn is the channel's connection to one instance.
type subConn struct {
	key   string // id + address
	info  instanceInfo
	addr  string
	sc    balancer.SubConn
	state connectivity.State
	// settled: the first connection attempt ended (READY or TRANSIENT_FAILURE). Until every
	// subchannel has settled, RPCs wait rather than skip instances still connecting.
	settled bool
	// hold holds the instance out after calls to it time out.
	hold *holdout
}

func subConnKey(id, addr string) string { return id + "\x00" + addr }

// rotaBalancer keeps one subchannel per instance and publishes pickers over the READY ones.
type rotaBalancer struct {
	cc balancer.ClientConn
	// xds is set for the policy xDS names (RegisterXDSPolicy): the balancer owns its link to
	// rota, its endpoints are addresses, and calls take the cluster's version.
	xds *xdsBuilder

	mu          sync.Mutex
	closed      bool
	link        *link
	config      Config
	leases      *leaser
	subConns    map[string]*subConn
	resolverErr error
	watch       uint64
	// known is the instance list in id order, read without b.mu by the local rotation.
	known atomic.Pointer[knownInstances]
}

// knownInstances is an immutable copy of the channel's instances, for the local rotation and
// the exclusions of leases.
type knownInstances struct {
	instances []knownInstance
}

type knownInstance struct {
	info instanceInfo
	addr string
}

func (b *rotaBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var l *link
	config := Config{}
	if b.xds != nil {
		var err error
		if l, config, err = b.xdsLinkLocked(s.BalancerConfig); err != nil {
			b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: errPicker{status.Error(codes.Unavailable, err.Error())}})
			return balancer.ErrBadResolverState
		}
	} else {
		l, _ = s.ResolverState.Attributes.Value(linkKey{}).(*link)
		if l == nil {
			b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: errPicker{status.Error(codes.FailedPrecondition, "rota: the rota policy needs a rota:///SERVICE target")}})
			return balancer.ErrBadResolverState
		}
		if c, ok := s.BalancerConfig.(*Config); ok && c != nil {
			config = *c
		}
	}
	if b.link != l || b.config.Rule != config.Rule {
		if b.leases != nil {
			b.leases.close()
		}
		b.link = l
		b.leases = newLeaser(l, config.Rule, b.wake, b.localView)
	}
	b.config = config
	b.resolverErr = nil

	endpoints := s.ResolverState.Endpoints
	seen := make(map[string]bool, len(endpoints))
	changed := false
	for _, e := range endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		a := e.Addresses[0]
		info := infoOf(e)
		if b.xds != nil {
			// xDS gives addresses, not rota's instances: the subchannel is the address's, and
			// a lease's instance finds it by its host:port (picker.byAddr).
			info = instanceInfo{version: config.Version, weight: 100}
		}
		key := subConnKey(info.id, a.Addr)
		seen[key] = true
		if c, ok := b.subConns[key]; ok {
			if c.info != info {
				c.info = info
				changed = true
			}
			continue
		}
		c := &subConn{key: key, info: info, addr: a.Addr, state: connectivity.Idle, hold: &holdout{}}
		// The notice on NewSubConn announces that a SubConn will take one address only, which is
		// what this policy gives it; a policy that keeps its own SubConns has no other call.
		//lint:ignore SA1019 one address per SubConn, as the deprecation notice asks
		sc, err := b.cc.NewSubConn([]resolver.Address{{Addr: a.Addr}}, balancer.NewSubConnOptions{
			StateListener: func(st balancer.SubConnState) { b.updateSubConn(c, st) },
		})
		if err != nil {
			continue
		}
		c.sc = sc
		b.subConns[key] = c
		sc.Connect()
		changed = true
	}
	for key, c := range b.subConns {
		if !seen[key] {
			c.sc.Shutdown()
			delete(b.subConns, key)
			changed = true
		}
	}
	known := &knownInstances{}
	for _, c := range b.subConns {
		known.instances = append(known.instances, knownInstance{info: c.info, addr: c.addr})
	}
	sort.Slice(known.instances, func(i, j int) bool {
		a, c := known.instances[i], known.instances[j]
		return a.info.id < c.info.id || a.info.id == c.info.id && a.addr < c.addr
	})
	b.known.Store(known)
	watch, _ := s.ResolverState.Attributes.Value(watchKey{}).(uint64)
	if changed || watch != b.watch {
		b.watch = watch
		b.leases.invalidate()
	}
	b.publishLocked()
	return nil
}

func (b *rotaBalancer) updateSubConn(c *subConn, st balancer.SubConnState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.subConns[c.key] != c {
		return
	}
	c.state = st.ConnectivityState
	if c.state == connectivity.Ready || c.state == connectivity.TransientFailure {
		c.settled = true
	}
	if c.state == connectivity.Idle {
		c.sc.Connect()
	}
	b.publishLocked()
}

func (b *rotaBalancer) ResolverError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resolverErr = err
	if len(b.subConns) == 0 {
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: errPicker{err}})
	}
}

func (b *rotaBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

func (b *rotaBalancer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.leases != nil {
		b.leases.close()
	}
	for _, c := range b.subConns {
		c.sc.Shutdown()
	}
	b.subConns = map[string]*subConn{}
	if b.xds != nil && b.link != nil {
		b.link.close()
		b.link = nil
	}
}

func (b *rotaBalancer) ExitIdle() {}

// xdsLinkLocked is the link and config of the policy xDS names (RegisterXDSPolicy): the
// cluster's service, version and rule, over the policy's own link to rota, opened anew when
// the service changes.
func (b *rotaBalancer) xdsLinkLocked(lbConfig serviceconfig.LoadBalancingConfig) (*link, Config, error) {
	c, ok := lbConfig.(*XDSConfig)
	if !ok || c == nil {
		return nil, Config{}, fmt.Errorf("rota: the %s policy got no config naming a service", XDSPolicyName)
	}
	report := !b.xds.opts.noReports
	config := Config{Rule: c.Rule, Version: c.Version, Report: &report, TicketHeader: b.xds.opts.ticket}
	if b.link != nil && b.link.service == c.Service {
		return b.link, config, nil
	}
	l, err := b.xds.dial(c.Service)
	if err != nil {
		return nil, Config{}, err
	}
	if b.link != nil {
		if b.leases != nil {
			b.leases.close()
			b.leases = nil
		}
		b.link.close()
	}
	return l, config, nil
}

// wake republishes the picker so that RPCs queued for a lease are picked again.
func (b *rotaBalancer) wake() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.publishLocked()
	}
}

// publishLocked publishes a picker over the current subchannel states.
func (b *rotaBalancer) publishLocked() {
	ready := make(map[string]readyConn, len(b.subConns))
	connecting, unsettled := false, false
	for _, c := range b.subConns {
		unsettled = unsettled || !c.settled
		switch c.state {
		case connectivity.Ready:
			ready[c.key] = readyConn{sc: c.sc, hold: c.hold}
		case connectivity.Idle, connectivity.Connecting:
			connecting = true
		}
	}
	state := connectivity.TransientFailure
	switch {
	case len(ready) > 0:
		state = connectivity.Ready
	case connecting:
		state = connectivity.Connecting
	}
	p := &picker{
		leases:     b.leases,
		link:       b.link,
		version:    b.config.Version,
		report:     b.config.Report == nil || *b.config.Report,
		ticket:     b.config.TicketHeader,
		byAddr:     b.xds != nil,
		ready:      ready,
		connecting: connecting,
		unsettled:  unsettled,
		known:      b.known.Load(),
	}
	// The next Lease excludes what this picker finds unusable.
	b.leases.current.Store(p)
	b.cc.UpdateState(balancer.State{ConnectivityState: state, Picker: p})
}

// localView is the instance list of version as the channel knows it (rota's isolation: the
// version's instances, else the unversioned ones), for the local rotation when rota was never
// reached for that version.
func (b *rotaBalancer) localView(version string) *leaseView {
	known := b.known.Load()
	if known == nil {
		return nil
	}
	pick := func(v string) *leaseView {
		var ids, addrs []string
		for _, c := range known.instances {
			if c.info.version == v {
				ids, addrs = append(ids, c.info.id), append(addrs, c.addr)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		return newLeaseView("", ids, addrs)
	}
	if v := pick(version); v != nil || version == "" {
		return v
	}
	return pick("")
}

type errPicker struct{ err error }

func (p errPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{}, pickError(p.err)
}
