package rota

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// Pick is the instance rota chose for one call.
type Pick struct {
	Instance Instance
	// Ticket is the number drawn from the rotation shared by every consumer of the
	// service; for local fallback picks, this client's own count (0, 1, 2, ... per service
	// and subset).
	Ticket uint64
	// Rule is the rule that ran, in canonical form, such as "repeat(n=3)".
	Rule string
	// Fallback is empty when the pick was served as asked; otherwise it says why another
	// subset was used (for instance no instance of the requested version).
	Fallback string
	// Epoch is the generation of the instance list the pick was made from.
	Epoch uint64
	// LocalFallback is true when rota could not be reached and the pick was made by this
	// client, round robin over the last instance list seen through Watch.
	LocalFallback bool
}

// PickOption sets one field of a pick request.
type PickOption func(*pickRequest)

type pickRequest struct {
	rule, version, key, zone string
	exclude                  []string
	versionSet               bool
}

// Rule selects the rule and its parameters, such as "round_robin" (the default), "random"
// or "repeat(n=3)".
func Rule(rule string) PickOption {
	return func(r *pickRequest) { r.rule = rule }
}

// Version asks for instances of version v, falling back to instances with no version when
// there are none. It overrides the version carried by the context (see WithVersion);
// Version("") asks for instances with no version whatever the context says.
func Version(v string) PickOption {
	return func(r *pickRequest) { r.version, r.versionSet = v, true }
}

// Key is the affinity key of hashing rules; other rules ignore it.
func Key(key string) PickOption {
	return func(r *pickRequest) { r.key = key }
}

// Zone is the consumer's zone, for zone-aware rules; other rules ignore it.
func Zone(zone string) PickOption {
	return func(r *pickRequest) { r.zone = zone }
}

// Exclude names instance ids already tried by this call; they are never returned. Several
// Exclude options add up.
func Exclude(ids ...string) PickOption {
	return func(r *pickRequest) { r.exclude = append(r.exclude, ids...) }
}

// DefaultPickTimeout bounds a pick whose context has no deadline, so that a rota that
// accepts connections but does not answer cannot hold a caller.
const DefaultPickTimeout = 2 * time.Second

// Pick asks rota for one instance of service.
//
// Without a Version option the version comes from ctx (see WithVersion and the
// interceptors in this package), so a version set at the edge follows the call chain.
//
// Failures are *Error values: codes.InvalidArgument for a bad service name or rule,
// codes.NotFound for a service never registered, codes.Unavailable when nothing is
// eligible or rota cannot be reached. When rota cannot be reached (a transport failure or
// an expired deadline, as opposed to rota answering) and the service is followed (see
// Follow), the pick is made locally from the last instance list seen, the result has
// LocalFallback set, and a warning is logged.
func (c *Client) Pick(ctx context.Context, service string, opts ...PickOption) (*Pick, error) {
	var req pickRequest
	for _, opt := range opts {
		opt(&req)
	}
	if !req.versionSet {
		req.version = VersionFrom(ctx)
	}
	if ctx.Err() != nil {
		return nil, contextError(ctx, "picking from "+service)
	}
	if c.outage.shortcut() && c.cache.synced(service) {
		// rota failed several picks in a row: answer locally for a while without waiting.
		return c.localPick(ctx, service, req, errShortcut)
	}
	callCtx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, DefaultPickTimeout)
		defer cancel()
	}
	var trailer metadata.MD
	resp, err := c.balancer.Pick(callCtx, &rotapb.PickRequest{
		Service: service,
		Rule:    req.rule,
		Version: req.version,
		Key:     req.key,
		Zone:    req.zone,
		Exclude: req.exclude,
	}, grpc.Trailer(&trailer))
	if err == nil {
		c.outage.answered(c.log)
		return pickFromProto(resp), nil
	}
	rerr := pickError(err, trailer)
	if !rerr.Unreachable && rerr.Reason != reasonWarmingUp {
		c.outage.answered(c.log)
		return nil, rerr
	}
	c.outage.unreachable()
	if !c.cache.synced(service) {
		return nil, rerr
	}
	return c.localPick(ctx, service, req, rerr)
}

// localPick answers from the last instance list seen; nothing eligible there is rota's own
// answer (UNAVAILABLE no_eligible_instance), not "unreachable".
func (c *Client) localPick(ctx context.Context, service string, req pickRequest, cause *Error) (*Pick, error) {
	p, ok := c.cache.pick(service, req.version, req.exclude)
	if !ok {
		return nil, &Error{
			Code:    codes.Unavailable,
			Message: "no eligible instance of " + service + " in the last list seen; " + cause.Error(),
			Reason:  "no_eligible_instance",
			cause:   cause,
		}
	}
	c.outage.pickedLocally(ctx, c.log, service, cause)
	return p, nil
}

// pickError converts a failed pick into an *Error with rota's reason and whether rota was
// reached at all.
func pickError(err error, trailer metadata.MD) *Error {
	st := status.Convert(err)
	rerr := &Error{Code: st.Code(), Message: st.Message(), status: st, cause: err}
	if values := trailer.Get(ErrorReasonKey); len(values) > 0 {
		rerr.Reason = values[0]
	}
	rerr.Unreachable = rerr.Reason == "" && unreachable(err)
	return rerr
}

func pickFromProto(resp *rotapb.PickResponse) *Pick {
	return &Pick{
		Instance: instanceFromProto(resp.GetInstance()),
		Ticket:   resp.GetTicket(),
		Rule:     resp.GetRule(),
		Fallback: resp.GetFallback(),
		Epoch:    resp.GetEpoch(),
	}
}

// unreachable tells a failure to reach rota from an answer of rota, for a status without
// rota's rota-error trailer (rota marks every pick failure it decides with one, warming_up
// included): UNAVAILABLE or DEADLINE_EXCEEDED — connection refused or lost, the deadline
// passing, a proxy with no rota behind it — and nothing else. The definition every client
// shares is in clients/conformance/README.md, "Unreachable".
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}
