package rota

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// TestRegistrationSurvivesARotaRestart stops rota (gracefully, then abruptly) under a
// registration and starts a new server on the same port: the client reconnects on its own
// and announces its instances again, and closing the registration still withdraws them.
func TestRegistrationSurvivesARotaRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signal os.Signal
	}{
		// SIGTERM: rota sends Closing on the stream, drains for its grace period, exits.
		{"SIGTERM", syscall.SIGTERM},
		// SIGKILL: the connection just drops.
		{"SIGKILL", os.Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restartSvc := uniqueService("go-restart")
			ctx := testContext(t, 60*time.Second)
			args := []string{"--shutdown-grace", "500ms"}
			first := startTestServer(t, args...)
			addr := first.addr

			// The provider keeps the default reconnection schedule, as an application would.
			var logs logBuffer
			provider, err := Dial(ctx, addr, WithLogger(logs.logger()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = provider.Close() })
			consumer := dial(t, addr)
			reg, err := provider.Register(ctx, instance(restartSvc, "a", 9001), instance(restartSvc, "b", 9002))
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close(ctx)
			if got := pickIDs(t, consumer, 2, restartSvc); len(got) != 2 || got[0] != "a" || got[1] != "b" {
				t.Fatalf("before the restart picked %q, want a and b", got)
			}

			if err := first.stop(tc.signal, 10*time.Second); err != nil {
				t.Fatalf("stopping rota with %v: %v", tc.signal, err)
			}
			second := startTestServerOn(t, addr, args...)
			if second.addr != addr {
				t.Fatalf("the new server listens on %s, want %s", second.addr, addr)
			}

			// The new server knows nothing but what the provider announces again.
			eventually(t, 15*time.Second, "the instances to be pickable on the new server", func() bool {
				instances, err := consumer.Instances(testContext(t, time.Second), restartSvc)
				return err == nil && len(instances) == 2
			})
			p, err := consumer.Pick(testContext(t, 5*time.Second), restartSvc)
			if err != nil || p.LocalFallback || p.Ticket != 0 || p.Instance.ID != "a" {
				t.Fatalf("first pick on the new server: %+v, %v; want a with ticket 0 from rota", p, err)
			}
			// rota registered the instances before acknowledging them; the client logs once
			// it has the acknowledgement.
			eventually(t, 5*time.Second, "the restoration to be logged", func() bool {
				return logs.count("rota registration restored") == 1
			})

			if err := reg.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			instances, err := consumer.Instances(ctx, restartSvc)
			if err != nil || len(instances) != 0 {
				t.Errorf("after Close: %+v, %v; want no instance", instances, err)
			}
			_, err = consumer.Pick(ctx, restartSvc)
			var rerr *Error
			if !errors.As(err, &rerr) || rerr.Code != codes.Unavailable {
				t.Errorf("pick after Close: %v, want UNAVAILABLE from rota", err)
			}
		})
	}
}
