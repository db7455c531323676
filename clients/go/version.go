package rota

import (
	"context"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The version a request asks for travels between services in this HTTP header and this
// gRPC metadata key. The middleware and server interceptors below read it into the
// request's context; Pick, VersionTransport and the client interceptors send it on.
const (
	VersionHeader      = "X-Rota-Version"
	VersionMetadataKey = "x-rota-version"
)

type versionKey struct{}

// WithVersion returns a context carrying version v. Picks made with it (without a Version
// option) ask for instances of v, and the outgoing interceptors forward v.
func WithVersion(ctx context.Context, v string) context.Context {
	return context.WithValue(ctx, versionKey{}, v)
}

// VersionFrom returns the version carried by ctx, or "" for none.
func VersionFrom(ctx context.Context) string {
	v, _ := ctx.Value(versionKey{}).(string)
	return v
}

// Middleware makes the X-Rota-Version header of each request the version of its context.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get(VersionHeader); v != "" {
			r = r.WithContext(WithVersion(r.Context(), v))
		}
		next.ServeHTTP(w, r)
	})
}

// VersionTransport wraps base (http.DefaultTransport when nil) so that each outgoing
// request carries the version of its context in the X-Rota-Version header, unless the
// request sets the header itself.
func VersionTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return versionTransport{base: base}
}

type versionTransport struct{ base http.RoundTripper }

func (t versionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if v := VersionFrom(r.Context()); v != "" && r.Header.Get(VersionHeader) == "" {
		r = r.Clone(r.Context())
		r.Header.Set(VersionHeader, v)
	}
	return t.base.RoundTrip(r)
}

// UnaryServerInterceptor makes the x-rota-version metadata of each incoming call the
// version of its context.
func UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(incomingVersion(ctx), req)
	}
}

// StreamServerInterceptor makes the x-rota-version metadata of each incoming stream the
// version of its context.
func StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := incomingVersion(ss.Context())
		if ctx == ss.Context() {
			return handler(srv, ss)
		}
		return handler(srv, versionedStream{ServerStream: ss, ctx: ctx})
	}
}

type versionedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s versionedStream) Context() context.Context { return s.ctx }

func incomingVersion(ctx context.Context) context.Context {
	if values := metadata.ValueFromIncomingContext(ctx, VersionMetadataKey); len(values) > 0 && values[0] != "" {
		return WithVersion(ctx, values[0])
	}
	return ctx
}

// UnaryClientInterceptor sends the version of the call's context as x-rota-version
// metadata, unless the call sets that metadata itself.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(outgoingVersion(ctx), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor sends the version of the stream's context as x-rota-version
// metadata, unless the stream sets that metadata itself.
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(outgoingVersion(ctx), desc, cc, method, opts...)
	}
}

func outgoingVersion(ctx context.Context) context.Context {
	v := VersionFrom(ctx)
	if v == "" {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(VersionMetadataKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, VersionMetadataKey, v)
}
