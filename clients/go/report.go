package rota

import (
	"context"
	"time"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// Result is how a call to a picked instance ended.
type Result int32

const (
	// ResultOK is a successful call.
	ResultOK Result = Result(rotapb.CallResult_CALL_RESULT_OK)
	// ResultConnectFailure is a call that could not reach the instance (connection
	// refused, reset, timed out connecting).
	ResultConnectFailure Result = Result(rotapb.CallResult_CALL_RESULT_CONNECT_FAILURE)
	// ResultError is a call the instance answered with an error.
	ResultError Result = Result(rotapb.CallResult_CALL_RESULT_ERROR)
)

// String returns the proto name of the result, such as "CALL_RESULT_OK".
func (r Result) String() string {
	return rotapb.CallResult(r).String()
}

// reportTimeout bounds the report that Timed sends after the call.
const reportTimeout = 2 * time.Second

// Outcome is the outcome of one call to a picked instance; reported outcomes feed the
// statistics of latency- and failure-aware rules.
type Outcome struct {
	Service    string
	InstanceID string
	// Ticket and Rule come from the Pick the call followed, if any.
	Ticket  uint64
	Rule    string
	Latency time.Duration
	Result  Result
}

// Outcome returns the outcome of a call to the picked instance.
func (p *Pick) Outcome(result Result, latency time.Duration) Outcome {
	return Outcome{
		Service:    p.Instance.Service,
		InstanceID: p.Instance.ID,
		Ticket:     p.Ticket,
		Rule:       p.Rule,
		Latency:    latency,
		Result:     result,
	}
}

// ReportSummary says what rota did with reported outcomes.
type ReportSummary struct {
	// Accepted outcomes were recorded.
	Accepted int
	// Ignored outcomes named a service or instance that is not registered.
	Ignored int
}

// Report sends call outcomes to rota (at most 1000 per call).
func (c *Client) Report(ctx context.Context, outcomes ...Outcome) (ReportSummary, error) {
	req := &rotapb.ReportRequest{Outcomes: make([]*rotapb.CallOutcome, len(outcomes))}
	for i, o := range outcomes {
		req.Outcomes[i] = &rotapb.CallOutcome{
			Service:    o.Service,
			InstanceId: o.InstanceID,
			Ticket:     o.Ticket,
			Rule:       o.Rule,
			LatencyUs:  uint64(max(o.Latency.Microseconds(), 0)),
			Result:     rotapb.CallResult(o.Result),
		}
	}
	resp, err := c.balancer.Report(ctx, req)
	if err != nil {
		return ReportSummary{}, rpcError(err)
	}
	return ReportSummary{Accepted: int(resp.GetAccepted()), Ignored: int(resp.GetIgnored())}, nil
}

// Timed runs call, the call to the picked instance, reports its outcome (ResultOK when it
// returns nil, ResultError otherwise) with its latency, and returns call's error
// unchanged. The report is sent before Timed returns, even if ctx is cancelled meanwhile;
// a failed report is logged, never returned. Local fallback picks (and a nil pick) are not
// reported: rota is unreachable then.
func Timed(ctx context.Context, c *Client, pick *Pick, call func() error) error {
	_, err := TimedValue(ctx, c, pick, func() (struct{}, error) { return struct{}{}, call() })
	return err
}

// TimedValue is Timed for a call that returns a value.
func TimedValue[T any](ctx context.Context, c *Client, pick *Pick, call func() (T, error)) (T, error) {
	start := time.Now()
	value, err := call()
	latency := time.Since(start)
	if pick == nil || pick.LocalFallback {
		return value, err
	}
	result := ResultOK
	if err != nil {
		result = ResultError
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	if _, rerr := c.Report(rctx, pick.Outcome(result, latency)); rerr != nil {
		c.log.WarnContext(ctx, "rota report failed", "service", pick.Instance.Service, "instance", pick.Instance.ID, "error", rerr)
	}
	return value, err
}
