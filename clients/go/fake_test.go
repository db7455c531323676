package rota

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// fakeRota is an in-process stand-in for rota, for tests of the client's own logic: it
// answers picks with a configurable function, records what it receives, and serves a fixed
// snapshot to watchers.
type fakeRota struct {
	rotapb.UnimplementedBalancerServer
	rotapb.UnimplementedRegistryServer

	pickFunc func(*rotapb.PickRequest) (*rotapb.PickResponse, error)
	// pickTrailer, when set, is sent as the trailer of every Pick (rota's rota-error).
	pickTrailer metadata.MD
	snapshot    []*rotapb.Instance

	mu       sync.Mutex
	picks    []*rotapb.PickRequest
	versions []string // VersionFrom of each handler's context
	reports  []*rotapb.CallOutcome
}

func (f *fakeRota) Pick(ctx context.Context, req *rotapb.PickRequest) (*rotapb.PickResponse, error) {
	f.mu.Lock()
	f.picks = append(f.picks, req)
	f.versions = append(f.versions, VersionFrom(ctx))
	f.mu.Unlock()
	if f.pickTrailer != nil {
		_ = grpc.SetTrailer(ctx, f.pickTrailer)
	}
	return f.pickFunc(req)
}

func (f *fakeRota) PickStream(stream rotapb.Balancer_PickStreamServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		f.mu.Lock()
		f.picks = append(f.picks, req)
		f.versions = append(f.versions, VersionFrom(stream.Context()))
		f.mu.Unlock()
		resp, _ := f.pickFunc(req)
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (f *fakeRota) Report(_ context.Context, req *rotapb.ReportRequest) (*rotapb.ReportResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, req.GetOutcomes()...)
	return &rotapb.ReportResponse{Accepted: uint32(len(req.GetOutcomes()))}, nil
}

func (f *fakeRota) Watch(req *rotapb.WatchRequest, stream rotapb.Registry_WatchServer) error {
	snapshot := &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Snapshot{Snapshot: &rotapb.InstanceList{Instances: f.snapshot}}, Epoch: 7}
	if err := stream.Send(snapshot); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (f *fakeRota) recorded() (picks []*rotapb.PickRequest, versions []string, reports []*rotapb.CallOutcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(picks, f.picks...), append(versions, f.versions...), append(reports, f.reports...)
}

// serveFake serves f on a loopback port until the test ends (or the returned server is
// stopped) and returns its address.
func serveFake(t *testing.T, f *fakeRota, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	rotapb.RegisterBalancerServer(srv, f)
	rotapb.RegisterRegistryServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String(), srv
}

// logBuffer collects a client's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(substr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), substr)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
