package rota

import (
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a failed rota call: the gRPC status code and message that rota (or the
// transport, when rota could not be reached) returned.
//
// It carries the gRPC status, so status.FromError, status.Code and errors.As all work:
//
//	var rerr *rota.Error
//	if errors.As(err, &rerr) && rerr.Code == codes.NotFound { ... }
type Error struct {
	// Code is the gRPC status code, such as codes.InvalidArgument, codes.NotFound
	// (the service was never registered) or codes.Unavailable (nothing eligible, or
	// rota unreachable).
	Code codes.Code
	// Message is the status message, which names the offending field or rule.
	Message string
	// Reason is rota's stable token for a pick it refused, from the rota-error trailer
	// ("no_eligible_instance", "unknown_service", "invalid_rule", "warming_up", ...); empty
	// when rota did not decide the failure, and on calls other than Pick.
	Reason string
	// Unreachable is true when rota could not be reached (connection refused or lost, the
	// deadline passed before rota answered: UNAVAILABLE or DEADLINE_EXCEEDED without a
	// Reason) rather than answering with an error; warming_up is an answer. Set on errors
	// of Pick.
	Unreachable bool

	status *status.Status
	cause  error
}

// Error formats the error as "rota: CODE_NAME: message".
func (e *Error) Error() string {
	return "rota: " + codeName(e.Code) + ": " + e.Message
}

// GRPCStatus returns the gRPC status; it is what status.FromError and status.Code look for.
func (e *Error) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(e.Code, e.Message)
	}
	return e.status
}

// Unwrap returns the error returned by the gRPC call, if any.
func (e *Error) Unwrap() error {
	return e.cause
}

// rpcError converts an error returned by a gRPC call into an *Error.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return &Error{Code: st.Code(), Message: st.Message(), status: st, cause: err}
}

// ErrorReasonKey is the trailer with which rota marks a pick failure it decided itself.
const ErrorReasonKey = "rota-error"

// reasonWarmingUp is rota's reason while it has just started and has not seen the service.
const reasonWarmingUp = "warming_up"

// codeName returns the canonical name of a code, "INVALID_ARGUMENT" rather than
// "InvalidArgument".
func codeName(c codes.Code) string {
	if name, ok := code.Code_name[int32(c)]; ok {
		return name
	}
	return c.String()
}

// Refusal is one instance rota did not register, and why.
type Refusal struct {
	Instance InstanceRef
	// Code is why: codes.InvalidArgument (a bad field), codes.AlreadyExists (another
	// registration owns the id), ...
	Code    codes.Code
	Message string
}

// RefusedError is returned by Client.Register when rota refused one or more of the
// instances (or the client did, for an instance it can tell is invalid without asking rota). Register is all or nothing: after a RefusedError none of the instances is
// registered.
type RefusedError struct {
	Refusals []Refusal
}

// Error lists the refusals.
func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refusals))
	for i, r := range e.Refusals {
		parts[i] = fmt.Sprintf("%s/%s: %s: %s", r.Instance.Service, r.Instance.ID, codeName(r.Code), r.Message)
	}
	return "rota: registration refused: " + strings.Join(parts, "; ")
}

// GRPCStatus reports the code of the first refusal, so status.Code works on a RefusedError.
func (e *RefusedError) GRPCStatus() *status.Status {
	if len(e.Refusals) == 0 {
		return status.New(codes.Unknown, e.Error())
	}
	return status.New(e.Refusals[0].Code, e.Error())
}
