package rota

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

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
	c         *Client
	instances []*rotapb.Instance

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
// *RefusedError listing the refusals, and none of the instances stays registered.
func (c *Client) Register(ctx context.Context, instances ...Instance) (*Registration, error) {
	if c.closed() {
		return nil, errClosed
	}
	if len(instances) == 0 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "no instances to register"}
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
		if r.live == nil || r.c.closed() {
			return // nothing is registered: the stream was lost, or ended with the client
		}
		r.closeErr = r.live.withdraw(ctx)
		r.live.close()
		r.live = nil
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
		r.live = nil
		s, ok := r.reconnect()
		if !ok {
			return
		}
		r.live = s
	}
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
			_ = s.stream.Send(heartbeat)
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
	announce := &rotapb.RegisterRequest{Msg: &rotapb.RegisterRequest_Announce{Announce: &rotapb.Announce{Instances: r.instances}}}
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
		refused := &RefusedError{}
		for _, f := range ack.GetRefused() {
			refused.Refusals = append(refused.Refusals, Refusal{
				Instance: InstanceRef{Service: f.GetInstance().GetService(), ID: f.GetInstance().GetId()},
				Code:     codes.Code(f.GetCode()),
				Message:  f.GetMessage(),
			})
		}
		return nil, refused
	}
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
	// A failed send means the stream is broken; the receive side reports why.
	_ = s.stream.Send(msg)
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
