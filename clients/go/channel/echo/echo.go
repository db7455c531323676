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
	"google.golang.org/grpc/metadata"

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
	s := &Server{ID: id, Addr: lis.Addr().(*net.TCPAddr), grpc: grpc.NewServer(), log: log}
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

// Kill closes the listener and every connection at once: new connections are refused.
func (s *Server) Kill() { s.grpc.Stop() }

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
	s.record(ctx)
	return &echopb.EchoReply{InstanceId: s.ID, Message: req.GetMessage()}, nil
}

func (s *Server) EchoStream(stream echopb.Echo_EchoStreamServer) error {
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
