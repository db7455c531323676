package channel

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// recordingBalancer answers Report (or fails it while down) and records every request.
type recordingBalancer struct {
	rotapb.BalancerClient

	mu      sync.Mutex
	down    bool
	reports []*rotapb.ReportRequest
	sent    chan int
}

func newRecordingBalancer() *recordingBalancer {
	return &recordingBalancer{sent: make(chan int, 100)}
}

func (b *recordingBalancer) Report(_ context.Context, req *rotapb.ReportRequest, _ ...grpc.CallOption) (*rotapb.ReportResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	b.reports = append(b.reports, req)
	b.sent <- len(req.GetOutcomes())
	return &rotapb.ReportResponse{Accepted: uint32(len(req.GetOutcomes()))}, nil
}

func (b *recordingBalancer) setDown(down bool) {
	b.mu.Lock()
	b.down = down
	b.mu.Unlock()
}

func (b *recordingBalancer) outcomes() []*rotapb.CallOutcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	var all []*rotapb.CallOutcome
	for _, r := range b.reports {
		all = append(all, r.GetOutcomes()...)
	}
	return all
}

func okOutcome(ticket uint64) outcome {
	return outcome{instance: "a", rule: "round_robin", ticket: ticket, latencyUs: 10, result: rotapb.CallResult_CALL_RESULT_OK}
}

// A full batch goes out at once, without waiting for the interval (an hour here), as one
// Report of leased outcomes.
func TestReporterSendsAFullBatchWithoutWaitingForTheInterval(t *testing.T) {
	fake := newRecordingBalancer()
	r := newReporter(fake, "echo", slog.New(discardHandler{}), time.Hour)
	defer r.close()
	for i := range uint64(maxReportBatch) {
		r.add(okOutcome(i))
	}
	select {
	case n := <-fake.sent:
		if n != maxReportBatch {
			t.Fatalf("first Report carried %d outcomes, want %d", n, maxReportBatch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a full batch was not sent before the interval")
	}
	for i, o := range fake.outcomes() {
		if o.GetTicket() != uint64(i) || !o.GetLeased() || o.GetService() != "echo" || o.GetInstanceId() != "a" {
			t.Fatalf("outcome %d = %v", i, o)
		}
	}
}

// While rota is away the newest maxPendingOutcomes are kept and the older ones dropped and
// counted, also when a batch fails; once rota answers they all go out, oldest first, in
// Reports of at most maxReportBatch.
func TestReporterKeepsTheNewestOutcomesWhileRotaIsAway(t *testing.T) {
	fake := newRecordingBalancer()
	fake.setDown(true)
	// Flushed by hand, so that every step is exact.
	r := idleReporter(fake, "echo", slog.New(discardHandler{}), time.Hour)
	const extra = 1500
	for i := range uint64(maxPendingOutcomes + extra) {
		r.add(okOutcome(i))
	}
	if got := r.droppedOutcomes(); got != extra {
		t.Fatalf("dropped %d outcomes, want %d", got, extra)
	}
	r.flush()
	if got := r.droppedOutcomes(); got != extra {
		t.Fatalf("a failed Report dropped outcomes: %d dropped, want %d", got, extra)
	}
	r.add(okOutcome(maxPendingOutcomes + extra))
	if got := r.droppedOutcomes(); got != extra+1 {
		t.Fatalf("dropped %d outcomes, want %d", got, extra+1)
	}
	fake.setDown(false)
	r.flush()
	got := fake.outcomes()
	if len(got) != maxPendingOutcomes {
		t.Fatalf("%d outcomes reported, want %d", len(got), maxPendingOutcomes)
	}
	for i, o := range got {
		if want := uint64(extra + 1 + i); o.GetTicket() != want {
			t.Fatalf("outcome %d has ticket %d, want %d (oldest dropped, order kept)", i, o.GetTicket(), want)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reports) != maxPendingOutcomes/maxReportBatch {
		t.Fatalf("%d Reports, want %d of %d outcomes", len(fake.reports), maxPendingOutcomes/maxReportBatch, maxReportBatch)
	}
}
