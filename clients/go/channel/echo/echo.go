// Package echo runs instances of the echo service (clients/conformance/channel/echo.proto)
// for the channel tests and benchmarks: each answers with its own id and records the ticket
// each call carried in its x-rota-ticket metadata.
package echo

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/channel/echopb"
)

// Call is one call an instance answered.
type Call struct {
	Instance string
	// Ticket is the call's x-rota-ticket, or -1 when it carried none.
	Ticket int64
}

// Server is one echo instance on a loopback port.
type Server struct {
	ID   string
	Addr *net.TCPAddr

	echopb.UnimplementedEchoServer
	grpc  *grpc.Server
	log   *Log
	mu    sync.Mutex
	count int
	// hung is closed by Hang: calls received from then on wait, unanswered, until the call
	// ends on the caller's side or the server is killed (released closed).
	hung     chan struct{}
	hangOnce sync.Once
	released chan struct{}
	killOnce sync.Once
}

// Log records the calls answered by a set of instances, in the order they were answered.
type Log struct {
	mu    sync.Mutex
	calls []Call
}

// Calls returns a copy of the calls recorded so far.
func (l *Log) Calls() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Call(nil), l.calls...)
}

// Len is the number of calls recorded so far.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls)
}

func (l *Log) add(c Call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// Start serves an instance named id on 127.0.0.1 (a free port); log, when not nil, records
// every call it answers.
func Start(id string, log *Log) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ID: id, Addr: lis.Addr().(*net.TCPAddr), grpc: grpc.NewServer(), log: log,
		hung: make(chan struct{}), released: make(chan struct{})}
	echopb.RegisterEchoServer(s.grpc, s)
	go func() { _ = s.grpc.Serve(lis) }()
	return s, nil
}

// Count is the number of calls answered so far.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Kill closes the listener and every connection at once: new connections are refused. Calls
// waiting on a hung server are released.
func (s *Server) Kill() {
	s.killOnce.Do(func() { close(s.released) })
	s.grpc.Stop()
}

// Hang makes the server stop answering, as a stopped (SIGSTOP) process would, while its
// listener and connections stay open: every call it receives from then on waits until the
// server is killed, and is neither answered nor recorded. (Not even the call's own deadline
// ends the wait: the handler would then answer DEADLINE_EXCEEDED, possibly before the caller's
// own timer fires, and a stopped process answers nothing.)
func (s *Server) Hang() { s.hangOnce.Do(func() { close(s.hung) }) }

// hang waits, when the server is hung, until the server is killed, and reports whether it
// did.
func (s *Server) hang() bool {
	select {
	case <-s.hung:
	default:
		return false
	}
	<-s.released
	return true
}

func (s *Server) record(ctx context.Context) {
	s.mu.Lock()
	s.count++
	s.mu.Unlock()
	if s.log == nil {
		return
	}
	ticket := int64(-1)
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("x-rota-ticket"); len(v) > 0 {
			if t, err := strconv.ParseInt(v[0], 10, 64); err == nil {
				ticket = t
			}
		}
	}
	s.log.add(Call{Instance: s.ID, Ticket: ticket})
}

func (s *Server) Echo(ctx context.Context, req *echopb.EchoRequest) (*echopb.EchoReply, error) {
	if s.hang() {
		return nil, status.Error(codes.Unavailable, "echo: hung")
	}
	s.record(ctx)
	return &echopb.EchoReply{InstanceId: s.ID, Message: req.GetMessage()}, nil
}

func (s *Server) EchoStream(stream echopb.Echo_EchoStreamServer) error {
	if s.hang() {
		return status.Error(codes.Unavailable, "echo: hung")
	}
	s.record(stream.Context())
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&echopb.EchoReply{InstanceId: s.ID, Message: req.GetMessage()}); err != nil {
			return err
		}
	}
}
