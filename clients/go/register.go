package rota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

const (
	// withdrawTimeout bounds the wait for the acknowledgement of the withdrawal on Close.
	withdrawTimeout = 3 * time.Second
	// reannounceTimeout bounds the wait for the acknowledgement of a re-announcement.
	reannounceTimeout = 10 * time.Second
	// defaultHeartbeatTimeout is assumed when rota does not state its timeout.
	defaultHeartbeatTimeout = 15 * time.Second
)

// Registration keeps a provider's instances registered: it holds the Register stream open,
// sends heartbeats at a third of rota's heartbeat timeout and, when the stream is lost,
// reconnects with backoff and announces the same instances again. Close withdraws them.
type Registration struct {
	c *Client

	// mu guards instances (what a reconnection announces again, updates included), live
	// and accepted against Update.
	mu        sync.Mutex
	instances []*rotapb.Instance
	accepted  []InstanceRef

	// ctx ends the keep-alive loop; stop cancels it.
	ctx  context.Context
	stop context.CancelFunc
	// streams is the parent of every stream of the registration; killStreams ends them.
	streams     context.Context
	killStreams context.CancelFunc
	// done is closed when the keep-alive loop has returned.
	done chan struct{}
	// live is the current stream, nil while reconnecting. The keep-alive loop owns it until
	// done is closed, Close after that.
	live  *session
	lease atomic.Uint64

	closeOnce sync.Once
	closeErr  error
}

// Register announces instances to rota and keeps them registered until the Registration is
// closed (or the client is). ctx bounds the initial announcement only.
//
// Registration is all or nothing: if rota refuses any instance Register returns a
// *RefusedError listing the refusals, and none of the instances stays registered. An instance
// with both ZeroWeight and a non-zero Weight is refused the same way before anything is sent.
func (c *Client) Register(ctx context.Context, instances ...Instance) (*Registration, error) {
	if c.closed() {
		return nil, errClosed
	}
	if len(instances) == 0 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "no instances to register"}
	}
	var contradictory []Refusal
	for _, i := range instances {
		if i.ZeroWeight && i.Weight != 0 {
			contradictory = append(contradictory, Refusal{Instance: i.Ref(), Code: codes.InvalidArgument,
				Message: fmt.Sprintf("weight %d with ZeroWeight: set one or the other", i.Weight)})
		}
	}
	if len(contradictory) > 0 {
		return nil, &RefusedError{Refusals: contradictory}
	}
	r := &Registration{c: c, done: make(chan struct{})}
	for _, i := range instances {
		r.instances = append(r.instances, i.proto())
	}
	r.ctx, r.stop = context.WithCancel(c.ctx)
	r.streams, r.killStreams = context.WithCancel(c.ctx)
	s, err := r.connect(ctx)
	if err != nil {
		r.stop()
		r.killStreams()
		return nil, err
	}
	r.live = s
	r.lease.Store(s.lease)
	c.wg.Add(1)
	go r.run()
	return r, nil
}

// Accepted lists the instances rota accepted in its acknowledgement of the announcement,
// in its order (an instance announced without an id has its default, "host:port").
func (r *Registration) Accepted() []InstanceRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.accepted)
}

// UpdateOption sets one field of an Update; fields not set keep their value.
type UpdateOption func(*rotapb.Update)

// SetStatus changes an instance's status: StatusDraining stops new picks of it once the
// Update is acknowledged.
func SetStatus(status InstanceStatus) UpdateOption {
	return func(u *rotapb.Update) { u.Status = rotapb.InstanceStatus(status) }
}

// SetWeight changes an instance's weight for weighted rules (0 = never picked).
func SetWeight(weight uint32) UpdateOption {
	return func(u *rotapb.Update) { u.Weight = &weight }
}

// Update changes one instance of this registration and waits, within ctx, for rota's
// acknowledgement; once Update returns nil, picks see the change. The change is kept, so a
// reconnection announces the instance as updated. A refusal is a *RefusedError.
func (r *Registration) Update(ctx context.Context, ref InstanceRef, opts ...UpdateOption) error {
	update := &rotapb.Update{Instance: &rotapb.InstanceRef{Service: ref.Service, Id: ref.ID}}
	for _, opt := range opts {
		opt(update)
	}
	r.mu.Lock()
	s := r.live
	r.mu.Unlock()
	if s == nil {
		return &Error{Code: codes.Unavailable, Message: "the registration is reconnecting", Unreachable: true}
	}
	ack, err := s.request(ctx, &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Update{Update: update}}, "updating")
	if err != nil {
		return err
	}
	if refused := refusedError(ack); refused != nil {
		return refused
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range r.instances {
		if i.GetService() == ref.Service && instanceFromProto(i).Ref().ID == ref.ID {
			if update.Weight != nil {
				i.Weight = update.Weight
			}
			if update.Status != rotapb.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED {
				i.Status = update.Status
			}
		}
	}
	return nil
}

func refusedError(ack *rotapb.Ack) *RefusedError {
	if len(ack.GetRefused()) == 0 {
		return nil
	}
	refused := &RefusedError{}
	for _, f := range ack.GetRefused() {
		refused.Refusals = append(refused.Refusals, Refusal{
			Instance: InstanceRef{Service: f.GetInstance().GetService(), ID: f.GetInstance().GetId()},
			Code:     codes.Code(f.GetCode()),
			Message:  f.GetMessage(),
		})
	}
	return refused
}

// LeaseID identifies the current stream's lease on rota; it changes when the registration
// reconnects.
func (r *Registration) LeaseID() uint64 {
	return r.lease.Load()
}

// Close withdraws the instances and closes the stream. It waits, within ctx and at most a
// few seconds, for rota to acknowledge the withdrawal; once Close returns nil no pick
// returns these instances. Closing the stream removes them even when the wait fails.
// Close is idempotent, and returns nil once the client is closed (which ended the stream).
func (r *Registration) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		defer r.killStreams()
		r.stop()
		timer := time.NewTimer(withdrawTimeout)
		defer timer.Stop()
		select {
		case <-r.done:
		case <-ctx.Done():
			r.killStreams() // unblocks the loop, whatever it waits on
			<-r.done
			r.closeErr = contextError(ctx, "closing the registration")
			return
		case <-timer.C:
			// A re-announcement is still unanswered: ending its stream is what removes
			// whatever rota registered from it.
			r.killStreams()
			<-r.done
		}
		r.mu.Lock()
		live := r.live
		r.live = nil
		r.mu.Unlock()
		if live == nil || r.c.closed() {
			return // nothing is registered: the stream was lost, or ended with the client
		}
		r.closeErr = live.withdraw(ctx)
		live.close()
	})
	return r.closeErr
}

// run heartbeats the live stream and restores it when lost, until stopped.
func (r *Registration) run() {
	defer r.c.wg.Done()
	defer close(r.done)
	for {
		if !r.hold(r.live) {
			return
		}
		r.live.close()
		r.setLive(nil)
		s, ok := r.reconnect()
		if !ok {
			return
		}
		r.setLive(s)
	}
}

func (r *Registration) setLive(s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live = s
}

// hold sends heartbeats on s until the stream is lost (true) or the registration stops
// (false, leaving s open for Close).
func (r *Registration) hold(s *session) bool {
	ticker := time.NewTicker(s.heartbeat)
	defer ticker.Stop()
	heartbeat := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Heartbeat{Heartbeat: &rotapb.Heartbeat{}}}
	for {
		select {
		case <-r.ctx.Done():
			return false
		case <-s.lost:
			r.c.log.Warn("rota registration lost; reconnecting", "lease", s.lease, "error", s.lostErr())
			return true
		case <-ticker.C:
			// A failed send means the stream is broken; s.lost follows with the reason.
			_ = s.send(heartbeat)
		}
	}
}

// reconnect opens a new stream and announces the instances again, retrying with backoff.
func (r *Registration) reconnect() (*session, bool) {
	for attempt := 0; ; attempt++ {
		if !sleep(r.ctx, r.c.retryDelay(attempt)) {
			return nil, false
		}
		// A stop does not abort an announcement already sent: Close waits for its
		// acknowledgement, so that it can withdraw what rota has just registered.
		ctx, cancel := context.WithTimeout(r.streams, reannounceTimeout)
		s, err := r.connect(ctx)
		cancel()
		if err == nil {
			r.lease.Store(s.lease)
			r.c.log.Info("rota registration restored", "lease", s.lease, "attempts", attempt+1)
			return s, true
		}
		if r.ctx.Err() != nil {
			return nil, false
		}
		r.c.log.Warn("rota registration retry failed", "attempt", attempt+1, "error", err)
	}
}

// connect opens a stream, announces the instances and waits, within ctx, for the
// acknowledgement. The stream itself lives with the registration, not with ctx.
func (r *Registration) connect(ctx context.Context) (*session, error) {
	sctx, cancel := context.WithCancel(r.streams)
	stream, err := r.c.registry.Register(sctx)
	if err != nil {
		cancel()
		return nil, rpcError(err)
	}
	s := &session{stream: stream, cancel: cancel, acks: make(chan *rotapb.Ack, 1), lost: make(chan struct{})}
	r.c.wg.Add(1)
	go func() {
		defer r.c.wg.Done()
		s.receive(sctx)
	}()
	r.mu.Lock()
	instances := make([]*rotapb.Instance, len(r.instances))
	for i, instance := range r.instances {
		instances[i] = proto.Clone(instance).(*rotapb.Instance)
	}
	r.mu.Unlock()
	announce := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Announce{Announce: &rotapb.Announce{Instances: instances}}}
	ack, err := s.request(ctx, announce, "announcing")
	if err != nil {
		s.close()
		return nil, err
	}
	if len(ack.GetRefused()) > 0 {
		if len(ack.GetAccepted()) > 0 {
			// Take the accepted ones back first, so that nothing is registered once
			// Register reports the refusal (closing the stream removes them anyway).
			_ = s.withdraw(ctx)
		}
		s.close()
		return nil, refusedError(ack)
	}
	r.mu.Lock()
	r.accepted = r.accepted[:0]
	for _, a := range ack.GetAccepted() {
		r.accepted = append(r.accepted, InstanceRef{Service: a.GetService(), ID: a.GetId()})
	}
	r.mu.Unlock()
	s.lease = ack.GetLeaseId()
	s.heartbeat = defaultHeartbeatTimeout / 3
	if ms := ack.GetHeartbeatTimeoutMs(); ms > 0 {
		s.heartbeat = max(time.Duration(ms)*time.Millisecond/3, time.Millisecond)
	}
	return s, nil
}

// session is one Register stream.
type session struct {
	stream rotapb.Registry_RegisterClient
	cancel context.CancelFunc
	// acks receives the acknowledgements; at most one request is outstanding at a time.
	acks chan *rotapb.Ack
	// lost is closed when the response stream ends; err then says why.
	lost chan struct{}
	err  error

	lease     uint64
	heartbeat time.Duration

	// sendMu serialises sends: heartbeats and requests come from different goroutines.
	sendMu sync.Mutex
	// requestMu keeps at most one acknowledged request outstanding.
	requestMu sync.Mutex
}

func (s *session) send(msg *rotapb.RegisterRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(msg)
}

func (s *session) receive(ctx context.Context) {
	defer close(s.lost)
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			s.err = err
			return
		}
		switch msg := resp.GetMsg().(type) {
		case *rotapb.RegisterResponse_Ack:
			select {
			case s.acks <- msg.Ack:
			case <-ctx.Done():
				s.err = ctx.Err()
				return
			}
		case *rotapb.RegisterResponse_Closing:
			s.err = &Error{Code: codes.Unavailable, Message: "rota closed the registration: " + msg.Closing.GetReason()}
			return
		}
	}
}

// lostErr says why the stream ended; call it after lost is closed.
func (s *session) lostErr() error {
	var rerr *Error
	switch {
	case errors.As(s.err, &rerr):
		return rerr
	case errors.Is(s.err, io.EOF):
		return &Error{Code: codes.Unavailable, Message: "rota ended the registration stream"}
	default:
		return rpcError(s.err)
	}
}

// request sends msg and waits, within ctx, for its acknowledgement.
func (s *session) request(ctx context.Context, msg *rotapb.RegisterRequest, what string) (*rotapb.Ack, error) {
	s.requestMu.Lock()
	defer s.requestMu.Unlock()
	// A failed send means the stream is broken; the receive side reports why.
	_ = s.send(msg)
	select {
	case ack := <-s.acks:
		return ack, nil
	case <-s.lost:
		select {
		case ack := <-s.acks: // answered just before the stream ended
			return ack, nil
		default:
			return nil, s.lostErr()
		}
	case <-ctx.Done():
		return nil, contextError(ctx, what)
	}
}

// withdraw removes every instance of the stream and waits for the acknowledgement.
func (s *session) withdraw(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, withdrawTimeout)
	defer cancel()
	withdraw := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Withdraw{Withdraw: &rotapb.Withdraw{}}}
	_, err := s.request(ctx, withdraw, "withdrawing")
	return err
}

// close half-closes the stream, then cancels it; rota drops the stream's lease either way.
func (s *session) close() {
	_ = s.stream.CloseSend()
	s.cancel()
}
