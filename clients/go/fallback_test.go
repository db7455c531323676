package rota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

func pbInstance(id, version string, st rotapb.InstanceStatus) *rotapb.Instance {
	return &rotapb.Instance{Id: id, Service: "svc", Host: "127.0.0.1", Port: 9000, Version: version, Status: st}
}

func snapshotEvent(epoch uint64, instances ...*rotapb.Instance) *rotapb.WatchEvent {
	return &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Snapshot{Snapshot: &rotapb.InstanceList{Instances: instances}}, Epoch: epoch}
}

// localPicks makes n local picks and returns the ids, failing on a miss.
func localPicks(t *testing.T, fc *fallbackCache, n int, version string, exclude ...string) []string {
	t.Helper()
	var ids []string
	for range n {
		p, ok := fc.pick("svc", version, exclude)
		if !ok {
			t.Fatalf("no local pick for version %q", version)
		}
		if !p.LocalFallback || p.Rule != "round_robin" {
			t.Fatalf("local pick %+v: want LocalFallback, rule round_robin", p)
		}
		ids = append(ids, p.Instance.ID)
	}
	return ids
}

func TestCacheRoundRobinOverUpInstances(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	fc.apply("svc", snapshotEvent(3,
		pbInstance("d", "", rotapb.InstanceStatus_DOWN),
		pbInstance("b", "", rotapb.InstanceStatus_UP),
		pbInstance("c", "", rotapb.InstanceStatus_DRAINING),
		pbInstance("e", "", rotapb.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED),
		pbInstance("a", "", rotapb.InstanceStatus_UP),
	))
	if got, want := localPicks(t, fc, 7, ""), []string{"a", "b", "e", "a", "b", "e", "a"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	p, _ := fc.pick("svc", "", nil)
	if p.Epoch != 3 || p.Fallback != "" {
		t.Errorf("epoch %d, fallback %q; want 3 and none", p.Epoch, p.Fallback)
	}
}

func TestCacheVersionIsolation(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	fc.apply("svc", snapshotEvent(1,
		pbInstance("plain-1", "", rotapb.InstanceStatus_UP),
		pbInstance("plain-2", "", rotapb.InstanceStatus_UP),
		pbInstance("zlt-1", "zlt", rotapb.InstanceStatus_UP),
		pbInstance("bob-1", "bob", rotapb.InstanceStatus_UP),
		pbInstance("gone-1", "gone", rotapb.InstanceStatus_DRAINING),
	))
	if got, want := localPicks(t, fc, 3, "zlt"), []string{"zlt-1", "zlt-1", "zlt-1"}; !slices.Equal(got, want) {
		t.Errorf("version zlt: picked %q, want %q", got, want)
	}
	if got, want := localPicks(t, fc, 3, ""), []string{"plain-1", "plain-2", "plain-1"}; !slices.Equal(got, want) {
		t.Errorf("no version: picked %q, want %q", got, want)
	}
	// An unknown version, or one whose only instance drains, falls back to the instances
	// with no version (sharing their rotation) and says so.
	for _, version := range []string{"nobody", "gone"} {
		p, ok := fc.pick("svc", version, nil)
		if !ok {
			t.Fatalf("version %q: no pick", version)
		}
		wantFallback := `no instance with version "` + version + `"; picked from instances with no version`
		if p.Instance.Version != "" || p.Fallback != wantFallback {
			t.Errorf("version %q: picked %q (version %q), fallback %q; want an unversioned instance and %q",
				version, p.Instance.ID, p.Instance.Version, p.Fallback, wantFallback)
		}
	}
	if got, want := localPicks(t, fc, 1, "bob"), []string{"bob-1"}; !slices.Equal(got, want) {
		t.Errorf("version bob: picked %q, want %q", got, want)
	}
}

func TestCacheFollowsWatchEvents(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	if _, ok := fc.pick("svc", "", nil); ok {
		t.Fatal("picked before the first snapshot")
	}
	fc.apply("svc", snapshotEvent(1, pbInstance("b", "", rotapb.InstanceStatus_UP), pbInstance("a", "", rotapb.InstanceStatus_UP)))
	fc.apply("svc", &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Added{Added: pbInstance("c", "", rotapb.InstanceStatus_UP)}, Epoch: 2})
	fc.apply("svc", &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Updated{Updated: pbInstance("b", "", rotapb.InstanceStatus_DRAINING)}, Epoch: 3})
	fc.apply("svc", &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Removed{Removed: &rotapb.InstanceRef{Service: "svc", Id: "a"}}, Epoch: 4})
	fc.apply("svc", &rotapb.WatchEvent{Event: &rotapb.WatchEvent_Added{Added: pbInstance("0", "", rotapb.InstanceStatus_UP)}, Epoch: 5})
	if got, want := localPicks(t, fc, 4, ""), []string{"0", "c", "0", "c"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	if p, _ := fc.pick("svc", "", nil); p.Epoch != 5 {
		t.Errorf("epoch %d, want 5", p.Epoch)
	}
	// A new snapshot replaces everything.
	fc.apply("svc", snapshotEvent(9, pbInstance("z", "", rotapb.InstanceStatus_UP)))
	if p, _ := fc.pick("svc", "", nil); p.Instance.ID != "z" || p.Epoch != 9 {
		t.Errorf("after the snapshot: picked %q at epoch %d, want z at 9", p.Instance.ID, p.Epoch)
	}
}

func TestCacheHonoursExcludeAndReportsMisses(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	fc.apply("svc", snapshotEvent(1, pbInstance("a", "", rotapb.InstanceStatus_UP), pbInstance("b", "", rotapb.InstanceStatus_UP)))
	if got, want := localPicks(t, fc, 3, "", "a"), []string{"b", "b", "b"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	if p, ok := fc.pick("svc", "", []string{"a", "b"}); ok {
		t.Errorf("picked %q with every instance excluded", p.Instance.ID)
	}
	if p, ok := fc.pick("other", "", nil); ok {
		t.Errorf("picked %q from a service never followed", p.Instance.ID)
	}
}

// TestUnreachableMeansNoAnswerFromRota checks the definition every client shares
// (clients/conformance/README.md, "Unreachable"): UNAVAILABLE or DEADLINE_EXCEEDED without
// rota's reason, whoever sent it; nothing that carries a reason; no other code.
func TestUnreachableMeansNoAnswerFromRota(t *testing.T) {
	for _, tc := range []struct {
		code   codes.Code
		reason string
		want   bool
	}{
		{codes.Unavailable, "", true},
		{codes.DeadlineExceeded, "", true},
		{codes.Unavailable, "no_eligible_instance", false},
		{codes.Unavailable, reasonWarmingUp, false}, // falls back, but rota answered
		{codes.NotFound, "unknown_service", false},
		{codes.InvalidArgument, "invalid_rule", false},
		{codes.NotFound, "", false},
		{codes.Canceled, "", false},
		{codes.Internal, "", false},
		{codes.Unknown, "", false},
	} {
		var trailer metadata.MD
		if tc.reason != "" {
			trailer = metadata.Pairs(ErrorReasonKey, tc.reason)
		}
		err := status.Error(tc.code, "x")
		if got := pickError(err, trailer); got.Unreachable != tc.want || got.Reason != tc.reason {
			t.Errorf("pickError(%s, reason %q) = unreachable %v, reason %q; want %v", tc.code, tc.reason,
				got.Unreachable, got.Reason, tc.want)
		}
	}
}

// TestPickFallsBackOnlyWhenRotaIsUnreachable runs a client against a fake rota that
// answers every pick with UNAVAILABLE no_eligible_instance: that answer is passed on; once
// the fake is stopped, picks come from the watched list.
func TestPickFallsBackOnlyWhenRotaIsUnreachable(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	fake := &fakeRota{
		pickFunc: func(*rotapb.PickRequest) (*rotapb.PickResponse, error) {
			return nil, status.Error(codes.Unavailable, `no instance of "svc" is up`)
		},
		pickTrailer: metadata.Pairs(ErrorReasonKey, "no_eligible_instance"),
		snapshot: []*rotapb.Instance{
			pbInstance("a", "", rotapb.InstanceStatus_UP),
			pbInstance("b", "", rotapb.InstanceStatus_UP),
			pbInstance("zlt-1", "zlt", rotapb.InstanceStatus_UP),
		},
	}
	addr, srv := serveFake(t, fake)
	var logs logBuffer
	c := dial(t, addr, WithFallback("svc"), WithLogger(logs.logger()))
	if err := c.Follow(ctx, "svc"); err != nil {
		t.Fatal(err)
	}

	_, err := c.Pick(ctx, "svc")
	var rerr *Error
	if !errors.As(err, &rerr) || rerr.Code != codes.Unavailable || rerr.Message != `no instance of "svc" is up` ||
		rerr.Unreachable {
		t.Fatalf("with rota answering: got %v, want rota's own UNAVAILABLE", err)
	}

	srv.Stop()
	var ids []string
	for range 3 {
		p, err := c.Pick(ctx, "svc", Rule("repeat(n=3)"))
		if err != nil {
			t.Fatalf("with rota gone: %v", err)
		}
		if !p.LocalFallback || p.Epoch != 7 {
			t.Fatalf("with rota gone: %+v, want a local fallback pick at epoch 7", p)
		}
		ids = append(ids, p.Instance.ID)
	}
	if want := []string{"a", "b", "a"}; !slices.Equal(ids, want) {
		t.Errorf("local picks %q, want %q", ids, want)
	}
	p, err := c.Pick(WithVersion(ctx, "zlt"), "svc")
	if err != nil || p.Instance.ID != "zlt-1" || !p.LocalFallback {
		t.Errorf("local pick with version zlt: %+v, %v; want zlt-1", p, err)
	}
	if n := logs.count("rota unreachable; picking followed services locally"); n != 1 {
		t.Errorf("%d fallback log lines, want 1 for the outage", n)
	}

	// A service nobody follows has no fallback: the transport error comes through.
	_, err = c.Pick(ctx, "unfollowed")
	if !errors.As(err, &rerr) || rerr.Code != codes.Unavailable {
		t.Errorf("unfollowed service: got %v, want UNAVAILABLE", err)
	}
	// Neither does a call the caller cancelled.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Pick(cancelled, "svc"); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled pick: got %v, want CANCELED", err)
	}
	if n := logs.count("rota unreachable; picking followed services locally"); n != 1 {
		t.Errorf("%d fallback log lines, want still 1", n)
	}
}

func TestFollowWaitsForTheFirstSnapshot(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	fake := &fakeRota{snapshot: []*rotapb.Instance{pbInstance("a", "", rotapb.InstanceStatus_UP)}}
	addr, _ := serveFake(t, fake)
	c := dial(t, addr)
	if _, ok := c.cache.pick("svc", "", nil); ok {
		t.Fatal("a local pick before following")
	}
	if err := c.Follow(ctx, "svc"); err != nil {
		t.Fatal(err)
	}
	if p, ok := c.cache.pick("svc", "", nil); !ok || p.Instance.ID != "a" {
		t.Fatalf("after Follow: %+v, %v; want a", p, ok)
	}

	// Against an address where nothing listens, Follow gives up with the context.
	dead := dial(t, "127.0.0.1:1")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := dead.Follow(short, "svc")
	if !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Follow with nothing listening: %v, want a deadline error", err)
	}
}

// TestLocalTicketsCountAndExcludeSkipsInsideTheSubset pins the local fallback contract
// (clients/conformance/README.md): tickets 0, 1, 2, ... per subset; ticket t takes position
// t mod n and an excluded instance passes the pick on; an all-excluded subset gives nothing.
func TestLocalTicketsCountAndExcludeSkipsInsideTheSubset(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	fc.apply("svc", snapshotEvent(2,
		pbInstance("a", "", rotapb.InstanceStatus_UP),
		pbInstance("b", "", rotapb.InstanceStatus_UP),
		pbInstance("c", "", rotapb.InstanceStatus_UP),
		pbInstance("v", "zlt", rotapb.InstanceStatus_UP),
	))
	var got []string
	for range 3 {
		p, ok := fc.pick("svc", "", []string{"b"})
		if !ok {
			t.Fatal("no local pick")
		}
		got = append(got, fmt.Sprintf("%s/%d", p.Instance.ID, p.Ticket))
	}
	// As rota's round robin, over the instances left (skipping forward would give a, c, c).
	if want := []string{"a/0", "c/1", "a/2"}; !slices.Equal(got, want) {
		t.Errorf("picked %q, want %q", got, want)
	}
	if p, ok := fc.pick("svc", "zlt", []string{"v"}); ok {
		t.Errorf("version zlt with its only instance excluded: %+v, want nothing (never the unversioned ones)", p)
	}
	if p, ok := fc.pick("svc", "zlt", nil); !ok || p.Ticket != 0 || p.Instance.ID != "v" {
		t.Errorf("version zlt: %+v, want v with ticket 0 of its own counter", p)
	}
}

func TestAnEmptySnapshotAtEpochZeroKeepsTheList(t *testing.T) {
	fc := newFallbackCache()
	fc.view("svc")
	fc.apply("svc", snapshotEvent(4, pbInstance("a", "", rotapb.InstanceStatus_UP)))
	fc.apply("svc", snapshotEvent(0))
	if p, ok := fc.pick("svc", "", nil); !ok || p.Instance.ID != "a" {
		t.Fatalf("after an empty snapshot at epoch 0: %+v, %v; want a", p, ok)
	}
	fc.apply("svc", snapshotEvent(5))
	if p, ok := fc.pick("svc", "", nil); ok {
		t.Fatalf("after an empty snapshot at epoch 5: %+v; want nothing", p)
	}
}

func TestOutageShortcutAfterThreeFailuresForOneSecond(t *testing.T) {
	now := time.Unix(1000, 0)
	o := newOutageState()
	o.now = func() time.Time { return now }
	for i := range 3 {
		if o.shortcut() {
			t.Fatalf("short-cut after %d failures", i)
		}
		o.unreachable()
	}
	if !o.shortcut() {
		t.Fatal("no short-cut after 3 failures")
	}
	now = now.Add(999 * time.Millisecond)
	if !o.shortcut() {
		t.Fatal("the short-cut ended before a second")
	}
	now = now.Add(time.Millisecond)
	if o.shortcut() {
		t.Fatal("the short-cut outlived a second")
	}
	o.unreachable()
	if !o.shortcut() {
		t.Fatal("a fourth failure does not start another short-cut")
	}
	o.answered(slog.New(discardHandler{}))
	if o.shortcut() {
		t.Fatal("an answer does not end the short-cut")
	}
}

// TestPickOnAHungRotaFallsBackWithoutACallerDeadline points a fresh client at a loopback
// listener that accepts connections and never answers (a hung rota). With a context that
// has no deadline, Pick still ends, bounded by DefaultPickTimeout, and answers from the
// followed list.
func TestPickOnAHungRotaFallsBackWithoutACallerDeadline(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Close() })
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	c := dial(t, listener.Addr().String())
	c.cache.view("svc")
	c.cache.apply("svc", snapshotEvent(2, pbInstance("a", "", rotapb.InstanceStatus_UP), pbInstance("b", "", rotapb.InstanceStatus_UP)))

	type result struct {
		p   *Pick
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := c.Pick(context.Background(), "svc")
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || !r.p.LocalFallback || r.p.Instance.ID != "a" || r.p.Ticket != 0 {
			t.Fatalf("got %+v, %v; want a local pick of a with ticket 0", r.p, r.err)
		}
	case <-time.After(15 * time.Second):
		// Generous against the 2 s pick deadline, and shorter than the 20 s a fresh
		// connection used to wait before failing.
		t.Fatal("Pick without a deadline did not end against a hung rota")
	}
}

// TestPickErrorsCarryRotasReason checks Error.Reason and Error.Unreachable, and that only
// warming_up among rota's own answers falls back.
func TestPickErrorsCarryRotasReason(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	fake := &fakeRota{
		pickFunc: func(*rotapb.PickRequest) (*rotapb.PickResponse, error) {
			return nil, status.Error(codes.NotFound, `service "svc" has never been registered`)
		},
		pickTrailer: metadata.Pairs(ErrorReasonKey, "unknown_service"),
		snapshot:    []*rotapb.Instance{pbInstance("a", "", rotapb.InstanceStatus_UP)},
	}
	addr, srv := serveFake(t, fake)
	c := dial(t, addr, WithFallback("svc"))
	if err := c.Follow(ctx, "svc"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Pick(ctx, "svc")
	var rerr *Error
	if !errors.As(err, &rerr) || rerr.Code != codes.NotFound || rerr.Reason != "unknown_service" || rerr.Unreachable {
		t.Fatalf("got %#v, want NOT_FOUND with reason unknown_service, not unreachable", err)
	}

	fake.pickFunc = func(*rotapb.PickRequest) (*rotapb.PickResponse, error) {
		return nil, status.Error(codes.Unavailable, `rota started less than 15000 ms ago and has not seen service "svc" yet`)
	}
	fake.pickTrailer = metadata.Pairs(ErrorReasonKey, "warming_up")
	p, err := c.Pick(ctx, "svc")
	if err != nil || !p.LocalFallback || p.Instance.ID != "a" || p.Ticket != 0 {
		t.Fatalf("warming up: %+v, %v; want a local pick of a with ticket 0", p, err)
	}
	_, err = c.Pick(ctx, "unfollowed")
	if !errors.As(err, &rerr) || rerr.Reason != "warming_up" || rerr.Unreachable {
		t.Fatalf("warming up, unfollowed: %#v; want reason warming_up, not unreachable", err)
	}

	srv.Stop()
	_, err = c.Pick(ctx, "unfollowed")
	if !errors.As(err, &rerr) || rerr.Reason != "" || !rerr.Unreachable {
		t.Fatalf("rota stopped: %#v; want unreachable without a reason", err)
	}
}
