package channel

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// Scheme is the target scheme: `rota:///SERVICE`, or `rota://HOST:PORT/SERVICE` to name the
// rota server in the target.
const Scheme = "rota"

// ServerEnv names the environment variable with the rota server's address, used when neither
// the target nor WithServer names one; without it the channel uses rota.DefaultServer
// (127.0.0.1:50051).
const ServerEnv = rota.ServerEnv

// Option configures the resolver built by NewResolver.
type Option func(*resolverOptions)

type resolverOptions struct {
	server      string
	rule        string
	version     string
	noReports   bool
	ticket      bool
	dialOptions []grpc.DialOption
	logger      *slog.Logger
	backoff     rota.Backoff
}

// WithServer sets the rota server's address ("host:port"). A target that names one
// (rota://HOST:PORT/SERVICE) wins; without either, the channel uses $ROTA_SERVER, else
// rota.DefaultServer (127.0.0.1:50051).
func WithServer(addr string) Option { return func(o *resolverOptions) { o.server = addr } }

// WithRule sets the rule of the channel's policy (default round_robin) in the service config
// the resolver hands to the channel.
func WithRule(rule string) Option { return func(o *resolverOptions) { o.rule = rule } }

// WithVersion sets the version of calls that name none in their metadata.
func WithVersion(version string) Option { return func(o *resolverOptions) { o.version = version } }

// WithReports turns the reporting of call outcomes on (the default) or off; see Config.Report.
func WithReports(on bool) Option { return func(o *resolverOptions) { o.noReports = !on } }

// WithTicketHeader adds each call's ticket as x-rota-ticket metadata (off by default); see
// TicketHeader.
func WithTicketHeader(on bool) Option { return func(o *resolverOptions) { o.ticket = on } }

// WithRotaDialOptions adds dial options for the connection to rota (after a plaintext
// transport): pass grpc.WithTransportCredentials for TLS.
func WithRotaDialOptions(opts ...grpc.DialOption) Option {
	return func(o *resolverOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(logger *slog.Logger) Option { return func(o *resolverOptions) { o.logger = logger } }

// WithBackoff sets the reconnection schedule of the Watch and of leases while rota is away.
func WithBackoff(b rota.Backoff) Option { return func(o *resolverOptions) { o.backoff = b } }

// NewResolver returns a resolver builder for the rota scheme with options; pass it to
// grpc.WithResolvers. The builder registered by this package's import has no options: its
// channels talk to the rota server of the target, else $ROTA_SERVER, else 127.0.0.1:50051.
func NewResolver(opts ...Option) resolver.Builder {
	o := resolverOptions{logger: slog.Default(), backoff: rota.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Factor: 2}}
	for _, opt := range opts {
		opt(&o)
	}
	return &resolverBuilder{opts: o}
}

func init() {
	resolver.Register(NewResolver())
}

type resolverBuilder struct{ opts resolverOptions }

func (b *resolverBuilder) Scheme() string { return Scheme }

func (b *resolverBuilder) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	service := strings.TrimPrefix(target.Endpoint(), "/")
	if service == "" {
		return nil, fmt.Errorf("rota: target %q names no service (want rota:///SERVICE)", target.String())
	}
	server := serverOf(target, b.opts.server)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, b.opts.dialOptions...)
	conn, err := grpc.NewClient(server, dial...)
	if err != nil {
		return nil, fmt.Errorf("rota: connecting to %s: %w", server, err)
	}
	reportConn, err := grpc.NewClient(server, dial...)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rota: connecting to %s: %w", server, err)
	}
	conn.Connect()
	l := newLink(conn, reportConn, service, b.opts)
	config := cc.ParseServiceConfig(serviceConfigJSON(b.opts.rule, b.opts.version, !b.opts.noReports, b.opts.ticket))
	if config.Err != nil {
		l.close()
		return nil, config.Err
	}
	r := &watchResolver{cc: cc, link: l, config: config}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.run()
	return r, nil
}

// serverOf is the rota server of a target: its authority, else the WithServer option, else
// $ROTA_SERVER, else rota.DefaultServer.
func serverOf(target resolver.Target, option string) string {
	if host := target.URL.Host; host != "" {
		return host
	}
	return rota.ServerAddr(option)
}

// serviceConfigJSON selects the rota policy with the resolver's rule and version.
func serviceConfigJSON(rule, version string, report, ticketHeader bool) string {
	return fmt.Sprintf(`{"loadBalancingConfig":[{%q:{"rule":%q,"version":%q,"report":%t,"ticketHeader":%t}}]}`,
		PolicyName, rule, version, report, ticketHeader)
}

// watchResolver follows one service through Watch and hands its UP instances to the channel.
type watchResolver struct {
	cc   resolver.ClientConn
	link *link
	// watches counts Watch streams: a new one may follow a restarted rota, whose counters
	// started over, so the policy drops the tickets it holds.
	watches uint64
	config  *serviceconfig.ParseResult
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func (r *watchResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (r *watchResolver) Close() {
	r.cancel()
	r.wg.Wait()
	r.link.close()
}

// run keeps a Watch open, reconnecting with backoff. While rota is away the channel keeps the
// last list it was given: the policy routes over it with a local rotation.
func (r *watchResolver) run() {
	defer r.wg.Done()
	for attempt := 0; ; attempt++ {
		if r.watch() {
			attempt = 0
		}
		if !sleep(r.ctx, r.link.opts.backoff.Delay(attempt)) {
			return
		}
	}
}

// watch runs one Watch stream; it reports whether the stream delivered its snapshot.
func (r *watchResolver) watch() bool {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stream, err := rotapb.NewRegistryClient(r.link.conn).Watch(ctx, &rotapb.WatchRequest{Service: r.link.service})
	if err != nil {
		r.lost(err)
		return false
	}
	instances := map[string]*rotapb.Instance{}
	first := true
	for {
		event, err := stream.Recv()
		if err != nil {
			r.lost(err)
			return !first
		}
		switch e := event.GetEvent().(type) {
		case *rotapb.WatchEvent_Snapshot:
			clear(instances)
			for _, i := range e.Snapshot.GetInstances() {
				instances[i.GetId()] = i
			}
		case *rotapb.WatchEvent_Added:
			instances[e.Added.GetId()] = e.Added
		case *rotapb.WatchEvent_Updated:
			instances[e.Updated.GetId()] = e.Updated
		case *rotapb.WatchEvent_Removed:
			delete(instances, e.Removed.GetId())
		}
		if first {
			r.watches++
			if r.link.markWatching() {
				r.link.log.Info("rota: watching again", "service", r.link.service)
			}
		}
		first = false
		r.publish(instances, event.GetEpoch())
	}
}

// lost handles the end of a Watch: the first time, while the channel has no instances yet,
// it fails the channel's RPCs with a clear error instead of letting them wait.
func (r *watchResolver) lost(err error) {
	if r.ctx.Err() != nil {
		return
	}
	if r.link.markLost() {
		r.link.log.Warn("rota: watch lost; routing over the last known instances", "service", r.link.service, "error", err)
	}
	if !r.link.hasPublished() {
		r.cc.ReportError(status.Errorf(codes.Unavailable, "rota: cannot watch service %q at %s: %v", r.link.service, r.link.conn.Target(), err))
	}
}

// publish hands the UP instances to the channel (a service rota does not know, or with no UP
// instance, is reported as an error, so that RPCs fail rather than wait).
func (r *watchResolver) publish(instances map[string]*rotapb.Instance, epoch uint64) {
	endpoints := make([]resolver.Endpoint, 0, len(instances))
	for _, i := range instances {
		if s := i.GetStatus(); s != rotapb.InstanceStatus_UP && s != rotapb.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED {
			continue
		}
		endpoints = append(endpoints, resolver.Endpoint{
			Addresses:  []resolver.Address{{Addr: instanceAddr(i)}},
			Attributes: attributes.New(instanceKey{}, instanceInfo{id: i.GetId(), version: i.GetVersion(), weight: weightOf(i)}),
		})
	}
	sort.Slice(endpoints, func(a, b int) bool { return infoOf(endpoints[a]).id < infoOf(endpoints[b]).id })
	if len(endpoints) == 0 {
		r.link.setPublished(false)
		r.cc.ReportError(status.Errorf(codes.Unavailable, "rota: service %q has no UP instance (epoch %d); is it registered with rota?", r.link.service, epoch))
		return
	}
	r.link.setPublished(true)
	_ = r.cc.UpdateState(resolver.State{
		Endpoints:     endpoints,
		ServiceConfig: r.config,
		Attributes:    attributes.New(linkKey{}, r.link).WithValue(watchKey{}, r.watches),
	})
}

func instanceAddr(i *rotapb.Instance) string {
	host := i.GetHost()
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s:%d", host, i.GetPort())
}

func weightOf(i *rotapb.Instance) uint64 {
	if i.Weight == nil {
		return 100
	}
	return uint64(i.GetWeight())
}

type instanceKey struct{}
type linkKey struct{}
type watchKey struct{}

// instanceInfo rides on each endpoint, for the policy.
type instanceInfo struct {
	id      string
	version string
	weight  uint64
}

func infoOf(e resolver.Endpoint) instanceInfo {
	info, _ := e.Attributes.Value(instanceKey{}).(instanceInfo)
	return info
}

// sleep waits d, or less if ctx ends first; it reports whether the full wait elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
