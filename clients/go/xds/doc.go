// Package xds is the Go runner of the xDS conformance scenarios (clients/conformance/xds): the
// standard xDS client of grpc-go (google.golang.org/grpc/xds) dials xds:///echo with a
// `rota serve` as its only control plane, and the scenarios' calls go through that channel.
//
// It is a module of its own, so that the rota Go client's users do not inherit the xDS
// client's dependencies. The package holds tests only: `go test ./...` here runs them, with
// the server binary from $ROTA_BIN (else target/debug/rota in the repository's root).
//
// Each scenario starts its own rota, echo servers and registrations in the test process, and
// its consumers as child processes of the test binary (consumer 1 lives as long as the
// scenario): grpc-go keeps one xDS client per process, read from one bootstrap, and each
// scenario's rota listens on a port of its own.
//
// TestXDSThroughput (bench_test.go), run only with ROTA_XDS_BENCH=1, compares the calls per
// second of an xds:///echo consumer with those of a consumer over the same echo servers' static
// addresses under round_robin, in alternating rounds (docs/benchmarks.md).
package xds
