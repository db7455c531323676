package channel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/channel/echo"
)

// consumerEnv, when set, makes the test binary a consumer process (see consumerMain).
const consumerEnv = "ROTA_CHANNEL_CONSUMER"

type consumerSpec struct {
	Target     string `json:"target"`
	Rule       string `json:"rule"`
	Version    string `json:"version"`
	Calls      int    `json:"calls"`
	DeadlineMS int    `json:"deadline_ms"`
}

// consumerMain runs in a separate process: a channel of its own, the calls, one line each.
func consumerMain() int {
	var spec consumerSpec
	if err := json.Unmarshal([]byte(os.Getenv(consumerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	conn, err := grpc.NewClient(spec.Target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(NewResolver(WithRule(spec.Rule), WithLogger(quietLogger()), WithTicketHeader(true))))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	results := echo.Calls(context.Background(), conn, spec.Calls, spec.Version, time.Duration(spec.DeadlineMS)*time.Millisecond)
	echo.WriteResults(os.Stdout, results)
	return 0
}

// consumerProcess is a consumer running as a separate process.
type consumerProcess struct {
	cmd *exec.Cmd
	out bytes.Buffer
	err bytes.Buffer
}

func startConsumerProcess(ctx context.Context, spec consumerSpec) (*consumerProcess, error) {
	encoded, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p := &consumerProcess{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^$")}
	p.cmd.Env = append(os.Environ(), consumerEnv+"="+string(encoded))
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	return p, p.cmd.Start()
}

// wait returns the process's results, in the order of its calls.
func (p *consumerProcess) wait() ([]echo.Result, error) {
	if err := p.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("consumer process: %w\n%s", err, p.err.String())
	}
	var results []echo.Result
	scanner := bufio.NewScanner(&p.out)
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case strings.HasPrefix(line, "ok "):
			results = append(results, echo.Result{Instance: strings.TrimPrefix(line, "ok ")})
		case strings.HasPrefix(line, "fail "):
			results = append(results, echo.Result{Err: status.Error(codes.Unknown, strings.TrimPrefix(line, "fail "))})
		default:
			return nil, errors.New("consumer process printed " + line)
		}
	}
	return results, nil
}
