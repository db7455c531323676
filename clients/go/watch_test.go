package rota

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recvWithin reads the next event of w, failing the test after d.
func recvWithin(t *testing.T, w *Watcher, d time.Duration) (WatchEvent, error) {
	t.Helper()
	type received struct {
		event WatchEvent
		err   error
	}
	got := make(chan received, 1)
	go func() {
		e, err := w.Recv()
		got <- received{e, err}
	}()
	select {
	case g := <-got:
		return g.event, g.err
	case <-time.After(d):
		t.Fatalf("no watch event within %s", d)
		return WatchEvent{}, nil
	}
}

func describe(e WatchEvent) string {
	switch e.Kind {
	case WatchSnapshot:
		ids := []string{}
		for _, i := range e.Instances {
			ids = append(ids, i.ID)
		}
		return fmt.Sprintf("snapshot %v", ids)
	case WatchAdded, WatchUpdated:
		return fmt.Sprintf("%s %s %s weight=%d", e.Kind, e.Ref.ID, e.Instance.Status, e.Instance.Weight)
	}
	return fmt.Sprintf("%s %s", e.Kind, e.Ref.ID)
}

func TestWatchDeliversASnapshotThenEveryChange(t *testing.T) {
	service := uniqueService("go-watch")
	ctx := testContext(t, 20*time.Second)
	provider, consumer := dial(t, rotaAddr), dial(t, rotaAddr)
	regA, err := provider.Register(ctx, instance(service, "a", 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer regA.Close(ctx)
	w, err := consumer.Watch(ctx, service)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	expect := func(want string) WatchEvent {
		t.Helper()
		e, err := recvWithin(t, w, 10*time.Second)
		if err != nil {
			t.Fatalf("want %q: %v", want, err)
		}
		if got := describe(e); got != want {
			t.Fatalf("event %q, want %q", got, want)
		}
		if e.Epoch == 0 {
			t.Fatalf("event %q at epoch 0", describe(e))
		}
		return e
	}
	snapshot := expect("snapshot [a]")
	if i := snapshot.Instances[0]; i.Service != service || i.Addr() != "127.0.0.1:9001" || i.Status != StatusUp || i.Weight != 100 {
		t.Fatalf("snapshot instance %+v", i)
	}
	regB, err := provider.Register(ctx, instance(service, "b", 9002))
	if err != nil {
		t.Fatal(err)
	}
	added := expect("added b UP weight=100")
	if err := regB.Update(ctx, InstanceRef{Service: service, ID: "b"}, SetStatus(StatusDraining), SetWeight(7)); err != nil {
		t.Fatal(err)
	}
	updated := expect("updated b DRAINING weight=7")
	if updated.Epoch <= added.Epoch || added.Epoch <= snapshot.Epoch {
		t.Fatalf("epochs %d, %d, %d do not increase", snapshot.Epoch, added.Epoch, updated.Epoch)
	}
	if err := regB.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if removed := expect("removed b"); removed.Ref.Service != service {
		t.Fatalf("removed names service %q", removed.Ref.Service)
	}
}

func TestWatchOfAnUnknownServiceIsAnEmptySnapshot(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	w, err := dial(t, rotaAddr).Watch(ctx, uniqueService("go-watch-nobody"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e, err := recvWithin(t, w, 10*time.Second)
	if err != nil || e.Kind != WatchSnapshot || len(e.Instances) != 0 {
		t.Fatalf("first event %q, %v; want an empty snapshot", describe(e), err)
	}
}

// The watch ends with its context, with Close and with the client, each as a typed error.
func TestWatchEnds(t *testing.T) {
	open := func(t *testing.T, c *Client, ctx context.Context) *Watcher {
		t.Helper()
		w, err := c.Watch(ctx, uniqueService("go-watch-end"))
		if err != nil {
			t.Fatal(err)
		}
		if e, err := recvWithin(t, w, 10*time.Second); err != nil || e.Kind != WatchSnapshot {
			t.Fatalf("first event %q, %v", describe(e), err)
		}
		return w
	}
	wantEnd := func(t *testing.T, w *Watcher, code codes.Code, cause error) {
		t.Helper()
		_, err := recvWithin(t, w, 10*time.Second)
		var rerr *Error
		if !errors.As(err, &rerr) || rerr.Code != code || status.Code(err) != code {
			t.Fatalf("Recv after the end: %v (%T), want an *Error with %s", err, err, code)
		}
		if cause != nil && !errors.Is(err, cause) {
			t.Fatalf("Recv after the end: %v, which is not %v", err, cause)
		}
	}

	t.Run("context cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w := open(t, dial(t, rotaAddr), ctx)
		cancel()
		wantEnd(t, w, codes.Canceled, context.Canceled)
	})
	t.Run("context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		w := open(t, dial(t, rotaAddr), ctx)
		wantEnd(t, w, codes.DeadlineExceeded, context.DeadlineExceeded)
	})
	t.Run("Close", func(t *testing.T) {
		w := open(t, dial(t, rotaAddr), context.Background())
		w.Close()
		w.Close()
		wantEnd(t, w, codes.Canceled, nil)
	})
	t.Run("client closed", func(t *testing.T) {
		c := dial(t, rotaAddr)
		w := open(t, c, context.Background())
		_ = c.Close()
		wantEnd(t, w, codes.Canceled, nil)
		if _, err := c.Watch(context.Background(), "any"); !errors.Is(err, errClosed) {
			t.Fatalf("Watch on a closed client: %v", err)
		}
	})
	t.Run("context already done", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := dial(t, rotaAddr).Watch(ctx, "any")
		if !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled {
			t.Fatalf("Watch with a cancelled context: %v", err)
		}
	})
}
