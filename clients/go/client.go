package rota

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// Client is a connection to one rota server. It is safe for concurrent use; make one per
// process and share it.
type Client struct {
	conn     *grpc.ClientConn
	balancer rotapb.BalancerClient
	registry rotapb.RegistryClient
	log      *slog.Logger

	backoffMu sync.Mutex
	backoff   Backoff

	cache  *fallbackCache
	outage *outageState

	// ctx ends every background goroutine (registrations, watchers) when the client closes.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Option configures a Client.
type Option func(*options)

type options struct {
	dialOptions []grpc.DialOption
	logger      *slog.Logger
	backoff     Backoff
	fallback    []string
}

// WithDialOptions adds gRPC dial options, applied after the client's own (plaintext
// transport, connection backoff): pass grpc.WithTransportCredentials to use TLS.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// WithLogger sets the logger for reconnections and local fallbacks; the default is
// slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithBackoff sets the reconnection schedule of registrations and fallback watchers, and of
// the underlying gRPC connection. The default is DefaultBackoff.
func WithBackoff(b Backoff) Option {
	return func(o *options) { o.backoff = b }
}

// WithFallback follows services through background watches, so that Pick can still answer
// from the last instance list seen when rota cannot be reached. See Client.Follow.
func WithFallback(services ...string) Option {
	return func(o *options) { o.fallback = append(o.fallback, services...) }
}

// DefaultServer is the rota server a client or channel talks to when nothing else names one:
// rota serve's default listen address.
const DefaultServer = "127.0.0.1:50051"

// ServerEnv is the environment variable naming the rota server ("host:port") when the code
// names none.
const ServerEnv = "ROTA_SERVER"

// ServerAddr is the rota server to use when addr is the one the code asked for: addr itself,
// else $ROTA_SERVER, else DefaultServer.
func ServerAddr(addr string) string {
	if addr != "" {
		return addr
	}
	if env := os.Getenv(ServerEnv); env != "" {
		return env
	}
	return DefaultServer
}

// Dial creates a client of the rota server at addr ("host:port"). An empty addr means
// $ROTA_SERVER, else DefaultServer (127.0.0.1:50051), as in the other rota clients and the
// rota command line.
//
// Dial does not wait for the server: the connection is made in the background, and calls
// made while rota is unreachable fail fast (or, for followed services, fall back to the
// local cache). A consumer therefore starts, and keeps running, without rota.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := options{logger: slog.Default(), backoff: DefaultBackoff}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(discardHandler{})
	}
	b := o.backoff.withDefaults()
	dialOptions := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  b.Initial,
				Multiplier: b.Factor,
				Jitter:     0.2,
				MaxDelay:   b.Max,
			},
			// No longer than a pick may take: a fresh client facing a rota that accepts
			// connections but never answers falls back after one pick deadline.
			MinConnectTimeout: DefaultPickTimeout,
		}),
		// HTTP/2 keepalive notices a rota that stopped answering without waiting for TCP;
		// rota accepts pings every 10 s or more, with or without calls in flight.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                20 * time.Second,
			Timeout:             10 * time.Second,
			PermitWithoutStream: true,
		}),
	}, o.dialOptions...)
	conn, err := grpc.NewClient(ServerAddr(addr), dialOptions...)
	if err != nil {
		return nil, err
	}
	conn.Connect()
	c := &Client{
		conn:     conn,
		balancer: rotapb.NewBalancerClient(conn),
		registry: rotapb.NewRegistryClient(conn),
		log:      o.logger,
		backoff:  b,
		cache:    newFallbackCache(),
		outage:   newOutageState(),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, service := range o.fallback {
		c.follow(service)
	}
	return c, nil
}

// Conn returns the underlying gRPC connection, for the rotapb stubs (PickStream,
// ListServices, Watch).
func (c *Client) Conn() *grpc.ClientConn {
	return c.conn
}

// Close stops the fallback watchers and closes the connection. Open registrations end with
// it, which removes their instances at once; close them first to withdraw gracefully.
func (c *Client) Close() error {
	c.cancel()
	err := c.conn.Close()
	c.wg.Wait()
	return err
}

// Instances lists the instances of a service, ordered by id.
func (c *Client) Instances(ctx context.Context, service string) ([]Instance, error) {
	resp, err := c.registry.ListInstances(ctx, &rotapb.ListInstancesRequest{Service: service})
	if err != nil {
		return nil, rpcError(err)
	}
	instances := make([]Instance, len(resp.GetInstances()))
	for i, pb := range resp.GetInstances() {
		instances[i] = instanceFromProto(pb)
	}
	return instances, nil
}

// retryDelay is the wait before retry attempt of any reconnecting goroutine.
func (c *Client) retryDelay(attempt int) time.Duration {
	c.backoffMu.Lock()
	defer c.backoffMu.Unlock()
	return c.backoff.Delay(attempt)
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

// contextError converts the end of a wait into an *Error that still matches
// errors.Is(err, context.DeadlineExceeded) or context.Canceled.
func contextError(ctx context.Context, what string) error {
	err := ctx.Err()
	st := status.FromContextError(err)
	return &Error{Code: st.Code(), Message: what + ": " + err.Error(), cause: err}
}

// errClosed is returned by calls made after Close.
var errClosed = &Error{Code: codes.Canceled, Message: "the client is closed"}

func (c *Client) closed() bool {
	return errors.Is(c.ctx.Err(), context.Canceled)
}

// discardHandler drops every record (what slog.DiscardHandler does in Go 1.24 and later).
type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (h discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h discardHandler) WithGroup(string) slog.Handler           { return h }
