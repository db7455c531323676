// Command echoconsumer makes calls to the echo service through a rota channel and prints one
// line per call ("ok ID" or "fail CODE MESSAGE"): the second consumer process of the channel
// scenarios (clients/conformance/channel).
//
//	echoconsumer -target rota://127.0.0.1:50051/echo -rule 'repeat(n=3)' -calls 90 [-version zlt]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rota-lb/rota/clients/go/channel"
	"github.com/rota-lb/rota/clients/go/channel/echo"
)

func main() {
	target := flag.String("target", "", "channel target, rota://HOST:PORT/SERVICE or rota:///SERVICE with ROTA_SERVER")
	rule := flag.String("rule", "round_robin", "rule of the channel")
	version := flag.String("version", "", "x-rota-version of every call")
	calls := flag.Int("calls", 10, "calls to make")
	deadline := flag.Duration("deadline", 5*time.Second, "deadline of each call")
	flag.Parse()
	conn, err := grpc.NewClient(*target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(channel.NewResolver(
			channel.WithRule(*rule),
			// The echo servers record each call's ticket, which the scenarios check.
			channel.WithTicketHeader(true),
			channel.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	results := echo.Calls(context.Background(), conn, *calls, *version, *deadline)
	echo.WriteResults(os.Stdout, results)
	fmt.Fprintln(os.Stderr, "echoconsumer: done")
}
