package channel

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// x-rota-ticket is sent only when the channel asks for it, and then names consecutive
// tickets of the shared rotation.
func TestTicketHeaderIsOptIn(t *testing.T) {
	server := startRota(t, "127.0.0.1:0")
	client := dialRota(t, server.addr)
	ctx := testContext(t, time.Minute)
	calls := &echo.Log{}
	for _, id := range []string{"a", "b"} {
		srv, err := echo.Start(id, calls)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Kill)
		if _, err := client.Register(ctx, rota.Instance{ID: id, Service: "tickets", Host: "127.0.0.1", Port: uint32(srv.Addr.Port)}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(opts ...Option) []echo.Call {
		before := calls.Len()
		opts = append([]Option{WithServer(server.addr), WithLogger(quietLogger())}, opts...)
		conn, err := grpc.NewClient("rota:///tickets", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(NewResolver(opts...)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, r := range echo.Calls(ctx, conn, 20, "", 10*time.Second) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		return calls.Calls()[before:]
	}
	for _, c := range run() {
		if c.Ticket != -1 {
			t.Fatalf("a call carried ticket %d without WithTicketHeader", c.Ticket)
		}
	}
	opted := run(WithTicketHeader(true))
	for i, c := range opted {
		if c.Ticket < 0 || c.Ticket != opted[0].Ticket+int64(i) {
			t.Fatalf("call %d carried ticket %d after %d: want consecutive tickets", i, c.Ticket, opted[0].Ticket)
		}
	}
}

func TestLocalDrawsCarryAnLTicket(t *testing.T) {
	if got := ticketValue(draw{ticket: 7}); got != "7" {
		t.Fatalf("leased ticket 7 is %q", got)
	}
	if got := ticketValue(draw{ticket: 7, local: true}); got != "L7" {
		t.Fatalf("local ticket 7 is %q", got)
	}
}
