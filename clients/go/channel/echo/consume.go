package echo

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/channel/echopb"
)

// Result is the outcome of one call: the instance that answered, or the failure.
type Result struct {
	Instance string
	Err      error
}

// Calls makes n unary Echo calls on conn, one after another, each with deadline; version,
// when not empty, goes in the x-rota-version metadata.
func Calls(ctx context.Context, conn grpc.ClientConnInterface, n int, version string, deadline time.Duration) []Result {
	client := echopb.NewEchoClient(conn)
	if version != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-rota-version", version)
	}
	results := make([]Result, 0, n)
	for i := 0; i < n; i++ {
		callCtx, cancel := context.WithTimeout(ctx, deadline)
		reply, err := client.Echo(callCtx, &echopb.EchoRequest{Message: fmt.Sprint(i)})
		cancel()
		if err != nil {
			results = append(results, Result{Err: err})
			continue
		}
		results = append(results, Result{Instance: reply.GetInstanceId()})
	}
	return results
}

// WriteResults prints one line per result: "ok ID" or "fail CODE MESSAGE".
func WriteResults(w io.Writer, results []Result) {
	for _, r := range results {
		if r.Err != nil {
			st := status.Convert(r.Err)
			fmt.Fprintf(w, "fail %s %s\n", st.Code(), st.Message())
			continue
		}
		fmt.Fprintf(w, "ok %s\n", r.Instance)
	}
}
