package channel

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/rotapb"
)

// VersionHeader is the call metadata naming the version a call wants.
const VersionHeader = "x-rota-version"

// TicketHeader is the metadata that names the ticket a call was routed by, so that an
// instance (or a test) can see which ticket of the rotation the call was: the ticket in
// decimal, or "L" and the local counter for a call routed by the local rotation while rota
// was unreachable. Channels add it only when asked (WithTicketHeader, or "ticketHeader": true
// in the policy config), since it adds bytes to every call.
const TicketHeader = "x-rota-ticket"

// picker routes each RPC by the next leased ticket of its version whose instance is usable.
type picker struct {
	leases  *leaser
	link    *link
	version string
	report  bool
	ticket  bool
	// byAddr: the subchannels are the addresses xDS gave (RegisterXDSPolicy), found by an
	// instance's host:port alone, and every call takes version (the cluster's).
	byAddr     bool
	ready      map[string]readyConn
	connecting bool
	unsettled  bool
	// known is the resolver's list, whose unusable instances leases exclude.
	known *knownInstances
	// clock is the time of holds (time.Now when nil).
	clock func() time.Time
}

// readyConn is a READY subchannel with its instance's hold-out for timeouts.
type readyConn struct {
	sc   balancer.SubConn
	hold *holdout
}

func (p *picker) now() time.Time {
	if p.clock != nil {
		return p.clock()
	}
	return time.Now()
}

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	if p.unsettled {
		return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
	}
	version := p.version
	if !p.byAddr {
		version = callVersion(info.Ctx, p.version)
	}
	s := p.leases.stream(version)
	// The next ticket whose instance is usable; those of unusable instances are passed over.
	d, state, err := s.take(p)
	switch {
	case err != nil:
		return balancer.PickResult{}, pickError(err)
	case state == waitLease:
		return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
	case state == noneUsable:
		return balancer.PickResult{}, p.noneReady()
	}
	c := d.conn
	id := d.view.ids[d.pos]
	result := balancer.PickResult{SubConn: c.sc}
	if p.ticket {
		result.Metadata = metadata.Pairs(TicketHeader, ticketValue(d))
	}
	hold, epoch, clock := c.hold, c.hold.callEpoch(), p.now
	if !p.report {
		result.Done = func(done balancer.DoneInfo) { hold.record(done, epoch, clock()) }
		return result, nil
	}
	start := time.Now()
	ticket, rule, reports := d.ticket, d.view.rule, p.link.reports
	if d.local {
		ticket, rule = 0, ""
	}
	if id == "" {
		// A local rotation over xDS's addresses, before any lease: no instance id to report.
		result.Done = func(done balancer.DoneInfo) { hold.record(done, epoch, clock()) }
		return result, nil
	}
	result.Done = func(done balancer.DoneInfo) {
		hold.record(done, epoch, clock())
		result, report := outcomeOf(done)
		if !report {
			return
		}
		reports.add(outcome{instance: id, rule: rule, ticket: ticket, latencyUs: uint64(time.Since(start).Microseconds()), result: result})
	}
	return result, nil
}

// noneReady is the answer to a call for which no usable instance was found: wait while some
// instance is still connecting, else fail.
func (p *picker) noneReady() error {
	if p.connecting {
		return balancer.ErrNoSubConnAvailable
	}
	return status.Errorf(codes.Unavailable, "rota: no instance of %q is reachable", p.link.service)
}

// usable returns the subchannel of view position pos when it is READY and not held out for
// timeouts.
func (p *picker) usable(view *leaseView, pos int) (readyConn, bool) {
	return p.usableAt(view.keys[pos], view.addrKeys[pos])
}

// usableAt is usable for the instance of subchannel keys key (id and address) and addrKey
// (address alone).
func (p *picker) usableAt(key, addrKey string) (readyConn, bool) {
	if p.byAddr {
		key = addrKey
	}
	c, ok := p.ready[key]
	if !ok || c.hold.held(p.now) {
		return readyConn{}, false
	}
	return c, true
}

// pickError is the status a picker may return for err. grpc-go turns the codes a picker must
// not return (gRFC A54: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
// ABORTED, OUT_OF_RANGE, DATA_LOSS) into INTERNAL "illegal status"; rota's refusals of a lease
// (an unknown version with isolation fail, a rule it cannot lease, ...) fail the call as
// UNAVAILABLE with rota's message instead.
func pickError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.Aborted, codes.OutOfRange, codes.DataLoss:
		return status.Error(codes.Unavailable, st.Message())
	}
	return err
}

// ticketValue is a draw's x-rota-ticket: the leased ticket, or "L" and the local counter.
func ticketValue(d draw) string {
	if d.local {
		return "L" + strconv.FormatUint(d.ticket, 10)
	}
	return strconv.FormatUint(d.ticket, 10)
}

// callVersion is the call's x-rota-version metadata, else the version rota.WithVersion put
// on its context, else the channel's.
func callVersion(ctx context.Context, fallback string) string {
	if ctx == nil {
		return fallback
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		if v := md.Get(VersionHeader); len(v) > 0 {
			return v[0]
		}
	}
	if v := rota.VersionFrom(ctx); v != "" {
		return v
	}
	return fallback
}

// outcomeOf classifies a finished call; calls the caller cancelled are not reported.
func outcomeOf(done balancer.DoneInfo) (rotapb.CallResult, bool) {
	if done.Err == nil {
		return rotapb.CallResult_CALL_RESULT_OK, true
	}
	switch status.Code(done.Err) {
	case codes.Canceled:
		return 0, false
	case codes.Unavailable:
		if !done.BytesReceived {
			return rotapb.CallResult_CALL_RESULT_CONNECT_FAILURE, true
		}
	}
	return rotapb.CallResult_CALL_RESULT_ERROR, true
}
