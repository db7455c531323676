package rota

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Weight is a plain value: 0 takes rota's default of 100, ZeroWeight registers weight 0.
func TestWeights(t *testing.T) {
	service := uniqueService("go-weights")
	ctx := testContext(t, 10*time.Second)
	c := dial(t, rotaAddr)
	heavy := instance(service, "heavy", 9001)
	heavy.Weight = 300
	plain := instance(service, "plain", 9002)
	idle := instance(service, "idle", 9003)
	idle.ZeroWeight = true
	reg, err := c.Register(ctx, heavy, plain, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	instances, err := c.Instances(ctx, service)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Instance{}
	for _, i := range instances {
		got[i.ID] = i
	}
	for id, want := range map[string]struct {
		weight uint32
		zero   bool
	}{"heavy": {300, false}, "plain": {100, false}, "idle": {0, true}} {
		if i := got[id]; i.Weight != want.weight || i.ZeroWeight != want.zero {
			t.Errorf("%s: Weight %d, ZeroWeight %v; want %d, %v", id, i.Weight, i.ZeroWeight, want.weight, want.zero)
		}
	}
	// weighted never picks the instance of weight 0.
	for _, id := range pickIDs(t, c, 10, service, Rule("weighted")) {
		if id == "idle" {
			t.Fatal("weighted picked the instance registered with ZeroWeight")
		}
	}
}

func TestZeroWeightWithAWeightIsRefused(t *testing.T) {
	c := dial(t, rotaAddr)
	both := instance(uniqueService("go-weights-both"), "both", 9001)
	both.Weight, both.ZeroWeight = 5, true
	reg, err := c.Register(testContext(t, 5*time.Second), instance(both.Service, "fine", 9002), both)
	var refused *RefusedError
	if reg != nil || !errors.As(err, &refused) || len(refused.Refusals) != 1 ||
		refused.Refusals[0].Instance.ID != "both" || refused.Refusals[0].Code != codes.InvalidArgument {
		t.Fatalf("Register = %v, %v; want one INVALID_ARGUMENT refusal of both", reg, err)
	}
}

func TestInstanceWeightRoundTrip(t *testing.T) {
	for _, i := range []Instance{{Weight: 0}, {Weight: 1}, {Weight: 300}, {ZeroWeight: true}} {
		pb := i.proto()
		switch {
		case i.ZeroWeight && (pb.Weight == nil || *pb.Weight != 0):
			t.Errorf("%+v: sent weight %v, want 0", i, pb.Weight)
		case !i.ZeroWeight && i.Weight == 0 && pb.Weight != nil:
			t.Errorf("%+v: sent weight %d, want unset (rota's default)", i, *pb.Weight)
		case i.Weight != 0 && pb.GetWeight() != i.Weight:
			t.Errorf("%+v: sent weight %v", i, pb.Weight)
		}
		if i.Weight != 0 || i.ZeroWeight {
			if back := instanceFromProto(pb); back.Weight != i.Weight || back.ZeroWeight != i.ZeroWeight {
				t.Errorf("%+v came back as %+v", i, back)
			}
		}
	}
}

// An empty address is $ROTA_SERVER, else 127.0.0.1:50051.
func TestDialDefaultServer(t *testing.T) {
	t.Run("ROTA_SERVER", func(t *testing.T) {
		t.Setenv(ServerEnv, rotaAddr)
		c, err := Dial(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.Conn().Target() != rotaAddr {
			t.Fatalf("target %q, want %q", c.Conn().Target(), rotaAddr)
		}
		// rota's own answer for a service it never saw: the call reached it.
		if _, err := c.Instances(testContext(t, 5*time.Second), "never-registered"); status.Code(err) != codes.NotFound {
			t.Fatalf("a call through ROTA_SERVER: %v, want rota's NOT_FOUND", err)
		}
	})
	t.Run("default", func(t *testing.T) {
		t.Setenv(ServerEnv, "")
		c, err := Dial(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.Conn().Target() != DefaultServer || DefaultServer != "127.0.0.1:50051" {
			t.Fatalf("target %q, want 127.0.0.1:50051", c.Conn().Target())
		}
	})
	t.Run("explicit address wins", func(t *testing.T) {
		t.Setenv(ServerEnv, "127.0.0.1:1")
		if got := ServerAddr(rotaAddr); got != rotaAddr {
			t.Fatalf("ServerAddr(%q) = %q", rotaAddr, got)
		}
	})
}
