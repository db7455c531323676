package channel

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// link is one channel's connection to rota, shared by its resolver (Watch) and its policy
// (Lease, Report). The resolver owns it and closes it.
type link struct {
	conn *grpc.ClientConn
	// reportConn carries the Report calls on a connection of their own, so that large
	// batches never hold a Lease back behind them.
	reportConn *grpc.ClientConn
	balancer   rotapb.BalancerClient
	service    string
	opts       resolverOptions
	log        *slog.Logger
	reports    *reporter

	published atomic.Bool
	lost      atomic.Bool
	// offline is set while leases fail for lack of rota, so that the fact is logged once.
	offline atomic.Bool
}

func newLink(conn, reportConn *grpc.ClientConn, service string, opts resolverOptions) *link {
	log := opts.logger
	if log == nil {
		log = slog.New(discardHandler{})
	}
	l := &link{conn: conn, reportConn: reportConn, balancer: rotapb.NewBalancerClient(conn), service: service, opts: opts, log: log}
	l.reports = newReporter(rotapb.NewBalancerClient(reportConn), service, log, reportInterval)
	return l
}

func (l *link) close() {
	l.reports.close()
	_ = l.reportConn.Close()
	_ = l.conn.Close()
}

func (l *link) setPublished(v bool) { l.published.Store(v) }
func (l *link) hasPublished() bool  { return l.published.Load() }

// markLost reports whether the watch was up until now.
func (l *link) markLost() bool { return !l.lost.Swap(true) }

// markWatching reports whether the watch had been lost before.
func (l *link) markWatching() bool { return l.lost.Swap(false) }

// goOffline reports whether this is the first lease failure since rota last answered.
func (l *link) goOffline() bool { return !l.offline.Swap(true) }

// goOnline reports whether rota answers again after a lease failure.
func (l *link) goOnline() bool { return l.offline.Swap(false) }

// reporter batches call outcomes into Report calls, off the RPC path: an RPC only appends its
// outcome under a short lock. A background goroutine sends what is pending every
// reportInterval, or as soon as a full batch of maxReportBatch is waiting, in calls of at most
// maxReportBatch outcomes. While rota is away at most maxPendingOutcomes wait; past that the
// oldest are dropped and counted (a batch that fails goes back in front of the newer ones).
type reporter struct {
	client   rotapb.BalancerClient
	log      *slog.Logger
	interval time.Duration

	service string
	mu      sync.Mutex
	pending []outcome
	dropped uint64
	// warned is set once outcomes are being dropped, so that an outage is logged once.
	warned bool

	// full wakes the sender when a full batch is waiting.
	full chan struct{}
	stop chan struct{}
	done chan struct{}
}

const (
	reportInterval     = 100 * time.Millisecond
	maxReportBatch     = 1000
	maxPendingOutcomes = 20000
)

// outcome is one call's outcome, kept small until it is sent.
type outcome struct {
	instance  string
	rule      string
	ticket    uint64
	latencyUs uint64
	result    rotapb.CallResult
}

func newReporter(client rotapb.BalancerClient, service string, log *slog.Logger, interval time.Duration) *reporter {
	r := idleReporter(client, service, log, interval)
	go r.run()
	return r
}

// idleReporter is a reporter whose sender is not running yet.
func idleReporter(client rotapb.BalancerClient, service string, log *slog.Logger, interval time.Duration) *reporter {
	return &reporter{
		client: client, service: service, log: log, interval: interval,
		full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

func (r *reporter) add(o outcome) {
	r.mu.Lock()
	if len(r.pending) >= maxPendingOutcomes {
		r.pending = r.pending[1:]
		r.drop(1)
	}
	r.pending = append(r.pending, o)
	full := len(r.pending) == maxReportBatch
	r.mu.Unlock()
	if full {
		select {
		case r.full <- struct{}{}:
		default:
		}
	}
}

// drop counts outcomes dropped for lack of room; r.mu is held.
func (r *reporter) drop(n int) {
	r.dropped += uint64(n)
	if !r.warned {
		r.warned = true
		r.log.Warn("rota: call outcomes not reported in time; dropping the oldest", "service", r.service, "held", maxPendingOutcomes)
	}
}

// droppedOutcomes is how many outcomes were dropped since the channel started.
func (r *reporter) droppedOutcomes() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

func (r *reporter) run() {
	defer close(r.done)
	ticker := time.NewTicker(r.interval)
	defer ticker.Stop()
	for {
		select {
		case <-r.stop:
			r.flush()
			return
		case <-ticker.C:
			r.flush()
		case <-r.full:
			r.flush()
		}
	}
}

// flush sends what is pending; a batch that fails goes back to the front of the queue.
func (r *reporter) flush() {
	for {
		r.mu.Lock()
		n := min(len(r.pending), maxReportBatch)
		batch := append([]outcome(nil), r.pending[:n]...)
		r.pending = r.pending[n:]
		r.mu.Unlock()
		if n == 0 {
			return
		}
		outcomes := make([]*rotapb.CallOutcome, n)
		for i, o := range batch {
			outcomes[i] = &rotapb.CallOutcome{
				Service: r.service, InstanceId: o.instance, Ticket: o.ticket, Rule: o.rule, LatencyUs: o.latencyUs, Result: o.result,
				Leased: true,
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := r.client.Report(ctx, &rotapb.ReportRequest{Outcomes: outcomes})
		cancel()
		r.mu.Lock()
		if err != nil {
			r.pending = append(batch, r.pending...)
			if excess := len(r.pending) - maxPendingOutcomes; excess > 0 {
				r.pending = r.pending[excess:]
				r.drop(excess)
			}
			r.mu.Unlock()
			return
		}
		r.warned = false
		r.mu.Unlock()
	}
}

func (r *reporter) close() {
	close(r.stop)
	<-r.done
}

// discardHandler drops every record.
type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (h discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h discardHandler) WithGroup(string) slog.Handler           { return h }
